"""Activation memory per GPU: what a block, the head, the loss and the embedding keep or
allocate for backward, per micro-batch (torch-free).

Units: bytes; `GB` in docstrings means 1e9 bytes. Every function answers for ONE rank.
"""

from __future__ import annotations

from scaletrain.config import ModelConfig, expert_tp

__all__ = [
    "korthikanti_layer_bytes",
    "layer_activation_bytes",
    "activation_bytes",
    "head_activation_bytes",
    "loss_backward_bytes",
    "selective_layer_bytes",
    "selective_recompute_bytes",
    "mlp_backward_work_bytes",
    "fused_loss_chunk",
    "embedding_backward_bytes",
    "held_logits_bytes",
    "rope_table_bytes",
]


def korthikanti_layer_bytes(
    s: int, b: int, h: int, a: int, *, t: int = 1, sp: bool = False, ac: str = "none"
) -> float:
    """Activation bytes per layer, Korthikanti et al. 2022 Table 2 (16-bit, GELU f=4h, MHA, with
    dropout; per tensor-parallel rank).

    no parallelism: s*b*h*(34 + 5*a*s/h); TP: s*b*h*(10 + 24/t + 5*a*s/(h*t)); TP+SP:
    s*b*h*(34 + 5*a*s/h)/t; selective recompute drops the 5*a*s/h term; full recompute keeps
    2*s*b*h (the block input; /t with SP). The 34 = attention 11 (QKV input 2, Q and K 4, V 2,
    out-proj input 2, dropout mask 1) + MLP 19 (fc1 input 2, GELU input 8, GELU output 8,
    dropout mask 1) + 2 LayerNorm inputs 4; 5as/h = softmax output 2 + its dropout mask 1 +
    dropout output 2 (a*s*s*b elements each).
    """
    sbh = float(s) * b * h
    scores = 0.0 if ac == "selective" else 5.0 * a * s / h
    if ac == "full":
        return 2 * sbh / (t if sp else 1)
    if sp:
        return sbh * (34 + scores) / t
    return sbh * (10 + 24 / t + scores / t)


def layer_activation_bytes(
    model: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    sp: bool = False,
    cp: int = 1,
    ac: str = "none",
    precision: str = "bf16",
    modern: bool = True,
    compile: bool = False,
    residual_fp32: bool = False,
    ep: int = 1,
) -> float:
    """Bytes one block keeps for backward, per micro-batch, on one rank.

    modern=False: Korthikanti's closed form (korthikanti_layer_bytes; fp32 doubles it).
    modern=True (scaletrain's models, SDPA, no dropout), derived per saved tensor, e = element
    bytes of activations (4 for fp32, else 2), r = residual-stream bytes (4 under autocast with
    fp32 params, else e), s_l = s/cp:
      norm inputs 2 x r*s_l*b*h (+ fp32 mean/rstd) — /t with SP; RMSNorm 2 x (4 + r)*s_l*b*h
        (its fp32 upcast input and the cast-back output are both saved);
      QKV and MLP inputs 2 x e*s_l*b*h — NOT /t: DTensor SP all-gathers the normed input and the
        column-parallel linear saves the gathered copy (Korthikanti re-gather it instead);
      q, k, v saved by SDPA e*s_l*b*(h + 2kv)/t: K and V at the g KV heads (SDPA's
        enable_gqa; the naive core groups queries instead of expanding K/V);
      under autocast (fp32 parameters, r = 4) each linear saves its own 16-bit cast of its
        input: + 2*e*s_l*b*h for q/k/v, + e*s_l*b*h for SwiGLU's gate/up;
      SDPA output (= out-proj input) e*s_l*b*h/t; flash/efficient log-sum-exp 4*a*s_l*b/t;
      'naive' attention instead keeps softmax probabilities e*a*s_l*s*b/t (quadratic);
      GELU MLP: fc1 output and GELU output 2 x e*s_l*b*f/t; SwiGLU: gate, silu(gate), up and
        their product 4 x e*s_l*b*f/t (3 with torch.compile, which fuses silu*up);
      MoE: `_moe_bytes` in place of the MLP.
    fp8 (precision/fp8.py, per-tensor scaling; tile-wise adds 4/128 for its fp32 scales): each
      converted linear saves its own 1-byte input instead of the shared 16-bit one: q/k/v and
      the n_in MLP input linears (2 SwiGLU, 1 GELU) (3 + n_in)*s_l*b*h (not /t); the output
      projection's fp8 input + s_l*b*h/t beside SDPA's 16-bit output; the MLP's last
      intermediate (w2's input) 1 byte instead of e (MemTracker + saved-tensor hooks on a
      dim-256 llama: bf16 -> fp8 -4864 KiB, matching these terms to the byte). MoE experts
      likewise (`_moe_bytes`).
    selective: `selective_layer_bytes` (the per-op policy of parallel/ac.py); full keeps the
    block input.
    Ignores: RoPE (cos/sin are buffers), residual adds (save nothing), < 1% small tensors.
    """
    e = 4 if precision == "fp32" else 2
    if not modern:
        return (
            korthikanti_layer_bytes(
                seq_len, micro_batch, model.dim, model.num_heads, t=tp, sp=sp, ac=ac
            )
            * e
            / 2
        )
    r = 4 if residual_fp32 else e
    h = model.dim
    tok = float(seq_len) / cp * micro_batch  # tokens this rank holds: s_l * b
    tsp = tp if sp else 1
    if ac == "full":
        return r * tok * h / tsp
    if ac == "selective":
        return selective_layer_bytes(model, tokens=tok, tp=tp, sp=sp, e=e, r=r, ep=ep)
    fp8 = precision == "fp8"
    norms, inputs = _norm_and_input_bytes(
        model, tok=tok, e=e, r=r, tsp=tsp, fp8=fp8, residual_fp32=residual_fp32
    )
    attn = _attention_bytes(model, tok=tok, seq_len=seq_len, tp=tp, e=e, fp8=fp8)
    if model.is_moe:
        mlp = _moe_bytes(model, tok=tok, tp=tp, ep=ep, e=e, fp8=fp8, compile=compile)
    else:
        mlp = _mlp_bytes(model, tok=tok, tp=tp, e=e, fp8=fp8, compile=compile)
    return norms + inputs + attn + mlp


def _norm_and_input_bytes(
    model: ModelConfig, *, tok: float, e: int, r: int, tsp: int, fp8: bool, residual_fp32: bool
) -> tuple[float, float]:
    """(norm inputs, the linears' saved inputs) of one block: `layer_activation_bytes`'s terms,
    tok = s_l*b tokens, tsp = t under SP (else 1)."""
    h = model.dim
    stats = 8.0 if model.norm == "layernorm" else 4.0
    # scaletrain's RMSNorm runs rms_norm on x.float() (saves the fp32 input) and multiplies the
    # weight by the result cast back (saves it, e or r bytes): 4 + r per element, not r
    # (dry-run: llama-style layouts were 5-7% under before this term)
    nb = 4 + r if model.norm == "rmsnorm" else r
    norms = 2 * (nb * h + stats) * tok / tsp
    n_in = 2 if model.activation == "swiglu" else 1
    inputs = (3 + n_in) * tok * h if fp8 else 2 * e * tok * h
    if residual_fp32 and not fp8:
        # autocast casts the fp32 normed input once per linear, and each linear saves its
        # own copy: q, k, v read three copies (2 extra), SwiGLU's gate and up two (1 extra)
        # (dry-run, llama-style z0/z1 layouts; autocast caches casts of leaf weights only)
        inputs += e * tok * h * (2 + (1 if model.activation == "swiglu" else 0))
    return norms, inputs


def _attention_bytes(
    model: ModelConfig, *, tok: float, seq_len: int, tp: int, e: int, fp8: bool
) -> float:
    """What one block's attention saves beyond its input (`layer_activation_bytes`'s terms)."""
    h, a = model.dim, model.num_heads
    # q and the core's output at the query heads, K and V at the g KV heads (enable_gqa)
    attn = e * tok * (2 * h + 2 * model.kv_dim) / tp + (tok * h / tp if fp8 else 0.0)
    if model.attention == "naive":
        attn += e * a * tok * seq_len / tp
    else:
        attn += 4.0 * a * tok / tp
    return attn


def _mlp_intermediates(model: ModelConfig, compile: bool) -> int:
    """(B, T, f) tensors a dense MLP saves: GELU 2; SwiGLU 4, 3 when compiled (silu*up fused)."""
    return 2 if model.activation != "swiglu" else (3 if compile else 4)


def _mlp_bytes(
    model: ModelConfig, *, tok: float, tp: int, e: int, fp8: bool, compile: bool
) -> float:
    """What one block's dense MLP saves beyond its input (`layer_activation_bytes`'s terms)."""
    f = model.ffn_dim
    n_f = _mlp_intermediates(model, compile)
    if fp8:
        return (n_f - 1) * e * tok * f / tp + tok * f / tp  # w2's input saved as fp8
    return n_f * e * tok * f / tp


def _moe_bytes(
    model: ModelConfig, *, tok: float, tp: int, ep: int, e: int, fp8: bool, compile: bool
) -> float:
    """What one MoE block's router and experts save (models/moe.py; per saved tensor, measured
    with saved-tensor hooks on tiny-moe): the router's fp32 softmax over all E (the
    load-balancing loss) and over the top k, 4*s_l*b*(E + k); int64 routing indices,
    3 x 8*k*s_l*b (top-k indices, the sort order, each slot's source token); the dispatched
    inputs (expert linears), the expert outputs after the combine and two more copies the
    combine saves (mul, index_add), 3 x e*k*s_l*b*h; expert intermediates as the MLP for
    k*s_l*b tokens, f split over t only when the experts are (ep = 1,
    `config.layout.expert_tp`; with ep > 1 each tp rank runs whole experts); s_l, not s_l/t,
    under SP too (tensor_parallel.py gathers the MoE input: every tp rank routes the whole
    sequence). ep > 1 (parallel/expert_parallel.py) adds the int64 regrouping permutation
    8*k*s_l*b and the regrouped expert output index_copy saves, e*k*s_l*b*h. fp8 experts: n_in
    1-byte copies of the dispatched (N*k, h) input replace its e-byte one, and w2's input is 1
    byte (the router stays 16-bit)."""
    h, f = model.dim, model.ffn_dim
    n_f = _mlp_intermediates(model, compile)
    n_in = 2 if model.activation == "swiglu" else 1
    k, E = model.experts_per_token, model.num_experts
    te = expert_tp(tp, ep)  # f split over tp only with ep = 1
    copies = 3 + (1 if ep > 1 else 0)  # (N*k, h) copies; as many int64 (N*k,) indices
    mlp = 4.0 * tok * (E + k) + copies * (8.0 * k * tok + e * k * tok * h)
    if fp8:
        # float8 experts (precision/fp8.py Float8ExpertLinear): the dispatched input is
        # saved as n_in 1-byte copies (one per input linear) instead of one e-byte copy,
        # w2's input as 1 byte (as the dense MLP)
        mlp += (n_in - e) * k * tok * h + ((n_f - 1) * e + 1) * k * tok * f / te
    else:
        mlp += n_f * e * k * tok * f / te
    return mlp


def selective_layer_bytes(
    model: ModelConfig, *, tokens: float, tp: int, sp: bool, e: int, r: int, ep: int = 1
) -> float:
    """Bytes one block keeps under `memory.ac="selective"` (parallel/ac.py's per-op policy:
    the whole block is checkpointed, the outputs of matmuls, fused attention kernels and TP
    reductions are saved, everything else is recomputed in backward). tokens = s_l*b.

    Counts: the block input r*s_l*b*h (/t with SP; the checkpoint's input); the q, k, v
    projections e*s_l*b*(h + 2kv)/t; SDPA's output e*s_l*b*h/t and fp32 log-sum-exp
    4*a*s_l*b/t (the naive core's S x S matmuls are recomputed: no attention term); the
    output projections wo and w2, e*s_l*b*h each and NOT /t (a row-parallel matmul's output is
    this rank's partial sum over the full hidden width); with tp > 1 the reduction of each of
    those, saved too: reduce-scatter e*s_l*b*h/t (SP) or all-reduce e*s_l*b*h; the MLP's
    input matmuls, n_in x e*s_l*b*f/t (n_in = 2 for SwiGLU's gate and up, 1 for GELU). MoE:
    the router's matmul e*s_l*b*E and the experts' matmuls for k*s_l*b routed tokens (n_in x
    e*k*s_l*b*f/(t_e*ep) + e*k*s_l*b*h, t_e = `config.layout.expert_tp`); the dense MLP terms
    are replaced.
    Ignores: RoPE tables (shared buffers), the fp8 scales (a few floats per tensor).
    Source: torch.utils.checkpoint's selective policy keeps exactly the outputs of the ops
    `ac.SELECTIVE_SAVED_OPS` names; checked against the dry-run (planner_accuracy.md).
    """
    h, a, f, kv = model.dim, model.num_heads, model.ffn_dim, model.kv_dim
    tsp = tp if sp else 1
    n_in = 2 if model.activation == "swiglu" else 1
    out = r * tokens * h / tsp
    out += e * tokens * (h + 2 * kv) / tp
    if model.attention != "naive":
        out += e * tokens * h / tp + 4.0 * a * tokens / tp
    reduced = 0.0 if tp == 1 else (e * tokens * h / tp if sp else e * tokens * h)
    out += 2 * (e * tokens * h + reduced)  # wo and w2 outputs, and their TP reductions
    if model.is_moe:
        k = model.experts_per_token
        out += e * tokens * model.num_experts
        out += n_in * e * k * tokens * f / (expert_tp(tp, ep) * ep) + e * (k - 1) * tokens * h
    else:
        out += n_in * e * tokens * f / tp
    return out


def selective_recompute_bytes(
    model: ModelConfig, *, full: float, stored: float, tokens: float, tp: int, sp: bool, e: int
) -> float:
    """Bytes the recomputation re-creates while one block runs its backward under
    `memory.ac="selective"`, on top of what the block keeps (`selective_layer_bytes`).

    The checkpoint re-runs the block's forward from its saved tensors: every tensor the no-AC
    set saves (`full`, `layer_activation_bytes(ac="none")`) is alive again, except those the
    policy kept, which the recompute takes from its cache. The kept set (`stored`) holds two
    tensors the no-AC set does not: the outputs of the output projections wo and w2 (and, with
    tp > 1, their saved reductions), e*s_l*b*h + the reduction each, which no backward op
    reads. So the re-created bytes are full - (stored - those outputs).
    Ignores: the order in which backward frees them (all are alive when the MLP's backward
    starts, where the dry-run peaks). Source: dry-run of tiny-llama dp4 z2 b2 s128: the
    largest rise inside the last block's backward is 202,752 B with ac=none, 929,792 B with
    full (+ the 727,040 B no-AC set) and 614,400 B with selective (+ 411,648 B = this term).
    """
    h = model.dim
    reduced = 0.0 if tp == 1 else (e * tokens * h / tp if sp else e * tokens * h)
    return max(0.0, full - (stored - 2 * (e * tokens * h + reduced)))


def mlp_backward_work_bytes(
    model: ModelConfig, *, tokens: float, tp: int, sp: bool, e: int, weight_bytes: int
) -> float:
    """What a block's backward holds first, on top of what is stored: the gradient of the
    block's output, e*s_l*b*h (/t with SP), the MLP's first (tokens x f) activation
    gradients, n x e*s_l*b*f/t, and its first weight gradient, weight_bytes*h*f/t
    (unsharded). n: the gradient of w2's input, plus what the activation's backward
    allocates (SwiGLU's mul: the gradients of silu(gate) and of up, 2; GELU: that of its
    input, 1), minus w2's saved input, freed once w2's backward has run: 2 for SwiGLU, 1
    for GELU (whose peak is w2's backward itself: its input gradient and weight gradient).
    Source: dry-run of tiny-llama dp4 z2 b2 s128, ac=none: the largest rise inside the last
    block's backward is 202,752 B = 2 x 2 x 256 x 176 + 2 x 64 x 176, over a start that holds
    the block output's gradient (2 x 256 x 64); tiny dp2 z3 fp32 b1 s128 (GELU): the peak
    is inside w2's backward with 4 x 128 x 256 + 4 x 64 x 256 on top of the output's
    gradient (4 x 128 x 64). Ignores: MoE experts' (N*k, f) gradients (the dense f is used),
    norms' fp32 gradient temporaries (transient).
    """
    f, h = model.ffn_dim, model.dim
    n = 2.0 if model.activation == "swiglu" else 1.0
    return e * tokens * h / (tp if sp else 1) + n * e * tokens * f / tp + weight_bytes * h * f / tp


def head_activation_bytes(
    model: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    sp: bool = False,
    cp: int = 1,
    precision: str = "bf16",
    residual_fp32: bool = False,
    fused: bool = True,
) -> float:
    """Last stage's extra activations per micro-batch: final-norm input r*s_l*b*h (/t with SP)
    and the head input e*s_l*b*h (the 16-bit cast the head reads; full tokens under SP, whose
    norm output is all-gathered for the vocabulary-parallel head), plus:
    - fused (the trainer's `model(x, targets=y)`, models/loss.py; a pipeline's last stage
      too): the per-token fp32 log-sum-exp 4*s_l*b; no logits are kept.
    - not fused (a logits path: `model(x)` then cross-entropy; no training step uses it):
      the logits path s_l*b*V/t*(2 + 4) in 16-bit (bf16 logits and the fp32 log-softmax
      output; the fp32 upcast is consumed by log-softmax and freed: the dry-run measures 6 B,
      not the 10 B of DESIGN.md §5) or (4 + 4) in fp32.
    The loss backward's own temporaries are `loss_backward_bytes`.
    """
    e = 4 if precision == "fp32" else 2
    r = 4 if residual_fp32 else e
    tok = float(seq_len) / cp * micro_batch
    if fused:
        tail = 4.0 * tok
    else:
        tail = (8.0 if e == 4 else 6.0) * tok * model.vocab_size / tp
    return r * tok * model.dim / (tp if sp else 1) + e * tok * model.dim + tail


def fused_loss_chunk(model: ModelConfig, *, tp: int = 1, chunk_tokens: int = 0) -> int:
    """Tokens per chunk of the fused loss: `chunk_tokens`, or for 0 the auto rule of
    models/loss.py (`auto_chunk_tokens`: one chunk's fp32 logits <= 256 MiB of V/tp rows)."""
    if chunk_tokens > 0:
        return chunk_tokens
    return max(1, 256 * 2**20 // (4 * max(1, -(-model.vocab_size // tp))))


def loss_backward_bytes(
    model: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    cp: int = 1,
    fused: bool = True,
    precision: str = "bf16",
    weight_bytes: int = 4,
    chunk_tokens: int = 0,
) -> float:
    """Temporaries of the loss backward on the last stage, alive while every activation is
    still stored (the peak of most steps).

    fused (models/loss.py's backward, per chunk of c tokens and V_l = V/t head rows): the
    hidden-state gradient e*s_l*b*h; the head gradient accumulator V_l*h in the weight's dtype
    (`weight_bytes`: 4 for fp32 parameters, 2 for FSDP2's 16-bit unsharded weight); the
    chunk's recomputed logits, fp32 c*V_l*4 beside their 16-bit matmul output or gradient
    cast c*V_l*e (none in fp32; the fp32 chunk is freed before one chunk's weight-gradient
    product, e*V_l*h, exists, so that product is not on top); an fp32 weight under 16-bit
    compute (DDP / ZeRO-1 autocast) adds the loss's own 16-bit cast of it, e*V_l*h.
    Everything is /t: nothing of the full vocabulary exists on a tp rank. Measured with
    MemTracker under fake tensors (1024 tokens, GPT-2's vocabulary): bf16 weight 387.6 MB
    (these terms to 0.1 MB); fp32 weight under autocast 541.9 MB, these terms with the
    weight's cast; dry-run, llama3-8b-L1 tp8+sp z0 bf16: the loss-backward peak's
    temporaries are these terms to the byte (607.8 MB, of which the cast 131.3 MB).
    not fused (a logits path, as `head_activation_bytes`): the fp32 gradient of the
    log-softmax output and of the logits, 2 x 4*s_l*b*V, NOT divided by tp (the dry-run
    measures the full vocabulary under loss_parallel: the stored logits are sharded, the
    backward's temporaries are not).
    Source: the dry-run's 'temp' at the loss-backward moment (planner_accuracy.md).
    """
    tok = float(seq_len) / cp * micro_batch
    if not fused:
        return 8.0 * tok * model.vocab_size
    e = 4 if precision == "fp32" else 2
    v_local = -(-model.vocab_size // tp)
    c = min(fused_loss_chunk(model, tp=tp, chunk_tokens=chunk_tokens), tok)
    table = float(v_local) * model.dim
    # fp32 compute: the matmul output is the fp32 chunk itself (no 16-bit companion)
    out = e * tok * model.dim + weight_bytes * table + c * v_local * (4 + (e if e < 4 else 0))
    if weight_bytes > e:
        # an fp32 weight under 16-bit compute: the loss's own cast of it, alive through the
        # backward (`weight.to(hidden.dtype)`; the rank's autocast in-flight copies leave
        # the head out, `state_memory.model_state_bytes(uncast_params=...)`)
        out += e * table
    return out


def embedding_backward_bytes(
    model: ModelConfig, *, tp: int = 1, grad_bytes: int = 4, tied: bool | None = None
) -> float:
    """Temporaries of the token embedding's gradient at the very end of backward (first stage).

    Counts: the embedding backward's output, this rank's V/tp x h rows of the gradient in
    `grad_bytes` (the dtype the weight is used in: fp32 without FSDP mixed precision, also
    under autocast, which does not cast embeddings; the compute dtype of FSDP2's unsharded
    weight otherwise). Under tp > 1 the token embedding is vocabulary-parallel
    (`parallel.tensor_parallel.VocabParallelEmbedding`): its lookup and backward run on the
    local rows only, so nothing of size V x h exists on a tp rank. Tied embeddings (GPT-2)
    add the head's contribution, held by autograd until the embedding's arrives (V/tp x h;
    fp32 after autocast's cast backward), and their sum (V/tp x h): all alive at once, after
    every other gradient is complete.
    Source: measured with the dry-run, gpt2-124m-L2 dp2 z0 fp32 (temp at the peak = 3 x V x h
    x 4 B exactly); under tp the embedding backward's output has V/tp rows
    (tests/distributed/test_vocab_parallel_embedding.py).
    Ignores: the position embedding's gradient (already accumulated by then).
    """
    tied = model.tie_embeddings if tied is None else tied
    table = float(model.vocab_size) * model.dim * grad_bytes
    return (3 if tied else 1) * table / tp


def held_logits_bytes(
    model: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    cp: int = 1,
    precision: str = "bf16",
    fused: bool = True,
) -> float:
    """Logits still referenced after the loss backward. fused (the trainer's fused loss): none,
    0. Not fused (a logits path, as `head_activation_bytes`): the logits (B, T/cp, V/tp) of
    the output, e*s_l*b*V/tp, e = 4 in fp32 else 2 (the model's output dtype; the loss's fp32
    upcast is freed with the loss graph). Source: measured with the dry-run, gpt2-124m-L2 dp2
    z0 fp32: 'activations' at the end-of-backward peak were exactly 4*s*b*V before the fused
    loss."""
    if fused:
        return 0.0
    e = 4 if precision == "fp32" else 2
    return e * float(seq_len) / cp * micro_batch * model.vocab_size / tp


def rope_table_bytes(model: ModelConfig) -> float:
    """RoPE's cos and sin tables, one pair per model (models/attention.py: two fp32
    (max_seq_len, head_dim) non-persistent buffers), 8*max_seq_len*head_dim bytes; 0 for
    learned positions (their table is a parameter). Source: the dry-run's 'module_buffers'
    (llama2-7b widths: 4.19 MB)."""
    if model.position != "rope":
        return 0.0
    return 8.0 * model.max_seq_len * model.head_dim


def activation_bytes(
    model: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    num_layers: int | None = None,
    in_flight: float = 1.0,
    **kw: object,
) -> float:
    """Stored activations of `num_layers` blocks (default all) for `in_flight` micro-batches,
    plus, under full recompute, one block's full set while it is recomputed in backward
    (Korthikanti et al. 2022 §4.2). Keyword args as in layer_activation_bytes. Excludes the head
    (see head_activation_bytes)."""
    L = model.num_layers if num_layers is None else num_layers
    per_layer = layer_activation_bytes(model, seq_len=seq_len, micro_batch=micro_batch, **kw)  # type: ignore[arg-type]
    total = in_flight * L * per_layer
    if kw.get("ac") == "full" and L:
        kw2 = dict(kw, ac="none")
        total += layer_activation_bytes(model, seq_len=seq_len, micro_batch=micro_batch, **kw2)  # type: ignore[arg-type]
    return total
