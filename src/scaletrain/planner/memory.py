"""Memory arithmetic per GPU: model states, activations, buffers (torch-free).

Units: bytes; `GB` in docstrings means 1e9 bytes. Every function answers for ONE rank.
"""

from __future__ import annotations

import functools

from scaletrain.config import PRECISION_TABLE, ModelConfig, expert_tp, stage_layer_ranges

__all__ = ["OPTIMIZER_BYTES", "CONVENTIONS", "state_bytes_per_param", "model_state_bytes",
           "stage_layer_counts", "korthikanti_layer_bytes", "layer_activation_bytes",
           "activation_bytes", "head_activation_bytes", "fp8_linear_params", "loss_backward_bytes",
           "selective_layer_bytes", "selective_recompute_bytes", "mlp_backward_work_bytes",
           "fused_loss_chunk",
           "embedding_backward_bytes", "held_logits_bytes", "rope_table_bytes", "buffer_terms",
           "pp_recv_buffer_bytes",
           "RUNTIME_CONTEXT_BYTES", "FRAGMENTATION"]

OPTIMIZER_BYTES = {"adamw": 8.0, "sgd": 4.0, "adamw8bit": 2.0}
"""Optimizer state bytes per parameter: AdamW m+v fp32 (Kingma & Ba 2015), SGD momentum fp32,
8-bit Adam m+v int8 (Dettmers et al. 2022; its per-block scales are < 1% and ignored)."""

CONVENTIONS = ("scaletrain", "moments_only", "master_and_moments", "megatron", "full_copies")
"""How model-state bytes are counted (the seeds disagree, DESIGN.md §5):
- 'scaletrain' (default): what scaletrain's trainer allocates. States stay fp32 (param 4 + grad 4
  + optimizer); mixed precision adds 16-bit working copies: FSDP2 (ZeRO-3) all-gathers bf16
  copies of the units in flight (current + prefetched block) and holds the unit's unsharded bf16
  grads before the fp32 reduce-scatter; DDP/ZeRO-1/2 + autocast keeps bf16 casts of every matmul
  weight alive from its forward to its backward (autograd saves them). fp8 (precision/fp8.py)
  keeps no weight copy between forward and backward (the weight is re-quantized in backward),
  so its converted linears hold no 16-bit cast either; FSDP2 still gathers bf16 units. fp16's
  loss scaler is one scalar (ignored).
- 'moments_only': 16-bit params + 16-bit grads + optimizer moments (2+2+8 = 12 B/param for
  AdamW; fp8: 1+1+8 = 10). Seeds 000 (20B: 240 GB) and 004 (7B: 84 GB).
- 'master_and_moments': 16-bit params + grads + (fp32 master + moments) counted as optimizer
  (2+2+12 = 16; ZeRO paper k=12). Seed 003 (7B on 8 GPUs table), seed 002's ZeRO table.
- 'megatron': bf16 params + fp32 grads + fp32 master + moments (2+4+4+8 = 18; Megatron-LM and
  Nanotron's default with fp32 gradient accumulation).
- 'full_copies': seed 002's 20 B/param (bf16 params 2 + bf16 grads 2 + fp32 master 4 + fp32
  grads 4 + moments 8); master counted as optimizer, fp32 grads as grads.
In fp32 there is no master copy: every convention is 4 + 4 + optimizer.
"""

ELEM_BYTES = {name: spec.bytes for name, spec in PRECISION_TABLE.items()}

RUNTIME_CONTEXT_BYTES = 0.75e9
"""CUDA context + cuBLAS workspaces + NCCL communicator buffers, outside the caching allocator
(measured 0.5-1 GB on A100/H100 with torch 2.x; 0 on 'cpu'). Counted in `total` so `fits` is
honest; subtract `buffer_terms['runtime_context']` to compare with max_memory_allocated()."""

FRAGMENTATION = 0.05
"""Caching-allocator reserve: reserved = allocated x (1 + FRAGMENTATION) (+ runtime context).
5% is the typical reserved/allocated excess of expandable-segment-free runs; tune with measure."""


def state_bytes_per_param(precision: str, optimizer: str = "adamw",
                          convention: str = "scaletrain") -> tuple[float, float, float]:
    """(param, grad, optimizer) bytes per parameter before any sharding (see CONVENTIONS)."""
    opt = OPTIMIZER_BYTES[optimizer]
    if precision == "fp32" or convention == "scaletrain":
        return 4.0, 4.0, opt
    w = float(ELEM_BYTES[precision])
    if convention == "moments_only":
        return w, w, opt
    if convention == "master_and_moments":
        return w, w, opt + 4
    if convention == "megatron":
        return w, 4.0, opt + 4
    if convention == "full_copies":
        return w, w + 4, opt + 4
    raise ValueError(f"convention={convention!r}: use one of {', '.join(CONVENTIONS)}")


def model_state_bytes(num_params: float, *, precision: str = "bf16", optimizer: str = "adamw",
                      zero: int = 0, zero_shards: int = 1, offload: str = "none",
                      convention: str = "scaletrain", expert_params: float = 0.0,
                      expert_shards: int = 1, unit_params: float = 0.0,
                      units_in_flight: int = 2, largest_param: float = 0.0,
                      fp8_params: float = 0.0, experts_in_fsdp: bool = True
                      ) -> dict[str, float]:
    """Bytes of params/grads/optimizer states on one GPU, plus what offload moved to the host.

    num_params: dense parameters this rank holds after TP/PP division; expert_params: its expert
    parameters after EP division, ZeRO-sharded over `expert_shards` (= zero_shards / ep) ranks.
    ZeRO (Rajbhandari et al. 2020): stage >= 1 divides optimizer states, >= 2 gradients, 3
    parameters by the shard count. unit_params: the largest FSDP unit (a block, or the
    embedding/head) whose 16-bit copies are in flight under 'scaletrain'. offload='optimizer'
    moves optimizer states (incl. any master copy counted there) to the CPU (ZeRO-Offload);
    'params' (FSDP2 CPUOffloadPolicy, needs ZeRO-3) moves sharded params, grads and optimizer
    states; the GPU keeps the units in flight. Ignores: the int8 scales of 8-bit Adam, the fp16
    loss scaler, DDP bucket copies (see buffer_terms). fp8_params: this rank's weights in
    float8-converted linears (attention q/k/v/o, dense MLP and MoE experts; not the head,
    router or embeddings), which under precision='fp8' keep no 16-bit cast (measured with
    MemTracker on a dim-256 llama: only the head's bf16 copy remains).
    Under 'scaletrain' ZeRO-2 is FSDP2 with reshard_after_forward=False (parallel/fsdp.py): the
    parameters are sharded at rest like ZeRO-3, and every unit's compute-dtype copy stays
    unsharded from its forward to its backward (params.in_flight = all of them). ZeRO-1 is
    torch's ZeroRedundancyOptimizer, which gives whole parameters to ranks: the busiest rank
    holds at least the states of the largest parameter (`largest_param`, the embedding).
    Source of both: the dry-run (benchmarks/results/planner_accuracy.md).
    experts_in_fsdp=False: FSDP2 leaves the expert-parallel experts alone (ignored_params,
    parallel/parallelize.py), so ZeRO-2 keeps no gathered 16-bit copy of them (dry-run,
    tiny-moe dp4 z2 ep4) and `unit_params` should exclude them.
    """
    pb, gb, ob = state_bytes_per_param(precision, optimizer, convention)
    d_dense, d_exp = max(1, zero_shards), max(1, expert_shards)

    def shard(nbytes_per: float, stage: int) -> float:
        if zero >= stage:
            return nbytes_per * (num_params / d_dense + expert_params / d_exp)
        return nbytes_per * (num_params + expert_params)

    params, grads, optim = shard(pb, 2 if convention == "scaletrain" else 3), shard(gb, 2), \
        shard(ob, 1)
    if zero == 1 and largest_param:
        # ZeroRedundancyOptimizer partitions whole parameters greedily by size
        optim = max(optim, ob * largest_param)
    in_params = in_grads = 0.0
    if convention == "scaletrain":
        # FSDP2 gathers and reduces units in the 16-bit compute dtype (bf16 under fp8 too:
        # parallel/fsdp.py's policy); fp32 runs gather fp32
        wc = 4 if precision == "fp32" else 2
        if zero == 2:
            # FSDP2 without reshard after forward: every unit stays all-gathered (compute
            # dtype) from its forward to its backward
            in_params = wc * (num_params + (expert_params if experts_in_fsdp else 0.0))
        elif zero >= 3:
            # FSDP2 all-gathers compute-dtype copies of the current and prefetched unit and
            # holds one unit's unsharded grads before the reduce-scatter.
            in_params = wc * unit_params * units_in_flight
            in_grads = wc * unit_params
        elif precision != "fp32":
            # autocast keeps a 16-bit cast of every matmul weight from forward to backward;
            # fp8-converted linears keep none (their weight is re-quantized in backward)
            converted = fp8_params if precision == "fp8" else 0.0
            in_params = 2 * (num_params + expert_params - converted)
    offloaded = 0.0
    if offload == "optimizer":
        offloaded, optim = optim, 0.0
    elif offload == "params" and zero >= 3:
        offloaded, params, grads, optim = params + grads + optim, 0.0, 0.0, 0.0
    elif offload == "params":  # without sharding the replicated params must stay on the GPU
        offloaded, optim = optim, 0.0
    return {"params": params + in_params, "grads": grads + in_grads, "optimizer": optim,
            "params.in_flight": in_params, "grads.in_flight": in_grads, "offloaded": offloaded}


def fp8_linear_params(model: ModelConfig, layers: int, tp: int = 1) -> float:
    """Parameters in the Float8Linears of `layers` blocks, per tp rank: q/k/v/o and a dense
    MLP (precision/fp8.py `apply_fp8` skips the head and the router; MoE experts become
    Float8ExpertLinear, counted apart by the callers that need them)."""
    pc = model.param_counts()
    return layers * (pc.attention + (0 if model.is_moe else pc.mlp)) / tp


@functools.lru_cache(maxsize=4096)
def stage_layer_counts(num_layers: int, pp: int, virtual: int = 1) -> tuple[int, ...]:
    """Layers held by each pipeline rank, by the trainer's own rule.

    `scaletrain.config.stage_layer_ranges` (the one balancing rule, shared with
    `parallel/pipeline.py`) splits the L layers over pp*v stages counting the embedding and the
    head as one unit each; rank r holds stages r, r+pp, ... (the interleaved assignment of
    Narayanan et al. 2021). The embedding lives on rank 0, the final norm and head on rank pp-1.
    """
    counts = [0] * pp
    for stage, layers in enumerate(stage_layer_ranges(num_layers, pp * virtual)):
        counts[stage % pp] += len(layers)
    return tuple(counts)


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, *, t: int = 1, sp: bool = False,
                            ac: str = "none") -> float:
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


def layer_activation_bytes(model: ModelConfig, *, seq_len: int, micro_batch: int, tp: int = 1,
                           sp: bool = False, cp: int = 1, ac: str = "none",
                           precision: str = "bf16", modern: bool = True, compile: bool = False,
                           residual_fp32: bool = False, ep: int = 1) -> float:
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
      MoE (models/moe.py; per saved tensor, measured with saved-tensor hooks on tiny-moe):
        the router's fp32 softmax over all E (the load-balancing loss) and over the top k,
        4*s_l*b*(E + k); int64 routing indices, 3 x 8*k*s_l*b (top-k indices, the sort
        order, each slot's source token); the dispatched inputs (expert linears), the expert
        outputs after the combine and two more copies the combine saves (mul, index_add),
        3 x e*k*s_l*b*h; expert intermediates as the MLP for k*s_l*b tokens, f split over
        t only when the experts are (ep = 1, `config.layout.expert_tp`; with ep > 1 each tp
        rank runs whole experts); s_l, not s_l/t, under SP too (tensor_parallel.py gathers
        the MoE input: every tp rank routes the whole sequence). ep > 1
        (parallel/expert_parallel.py) adds the int64 regrouping permutation 8*k*s_l*b and
        the regrouped expert output index_copy saves, e*k*s_l*b*h.
    fp8 (precision/fp8.py, per-tensor scaling; tile-wise adds 4/128 for its fp32 scales): each
      converted linear saves its own 1-byte input instead of the shared 16-bit one: q/k/v and
      the n_in MLP input linears (2 SwiGLU, 1 GELU) (3 + n_in)*s_l*b*h (not /t); the output
      projection's fp8 input + s_l*b*h/t beside SDPA's 16-bit output; the MLP's last
      intermediate (w2's input) 1 byte instead of e (MemTracker + saved-tensor hooks on a
      dim-256 llama: bf16 -> fp8 -4864 KiB, matching these terms to the byte). MoE experts
      likewise: n_in 1-byte copies of the dispatched (N*k, h) input replace its e-byte one,
      and w2's input is 1 byte (the router stays 16-bit).
    selective: `selective_layer_bytes` (the per-op policy of parallel/ac.py); full keeps the
    block input.
    Ignores: RoPE (cos/sin are buffers), residual adds (save nothing), < 1% small tensors.
    """
    e = 4 if precision == "fp32" else 2
    if not modern:
        return korthikanti_layer_bytes(seq_len, micro_batch, model.dim, model.num_heads, t=tp,
                                       sp=sp, ac=ac) * e / 2
    r = 4 if residual_fp32 else e
    h, a, f = model.dim, model.num_heads, model.ffn_dim
    tok = float(seq_len) / cp * micro_batch  # tokens this rank holds: s_l * b
    tsp = tp if sp else 1
    if ac == "full":
        return r * tok * h / tsp
    if ac == "selective":
        return selective_layer_bytes(model, tokens=tok, tp=tp, sp=sp, e=e, r=r, ep=ep)
    stats = 8.0 if model.norm == "layernorm" else 4.0
    # scaletrain's RMSNorm runs rms_norm on x.float() (saves the fp32 input) and multiplies the
    # weight by the result cast back (saves it, e or r bytes): 4 + r per element, not r
    # (dry-run: llama-style layouts were 5-7% under before this term)
    nb = 4 + r if model.norm == "rmsnorm" else r
    norms = 2 * (nb * h + stats) * tok / tsp
    fp8 = precision == "fp8"
    n_in = 2 if model.activation == "swiglu" else 1
    inputs = (3 + n_in) * tok * h if fp8 else 2 * e * tok * h
    if residual_fp32 and not fp8:
        # autocast casts the fp32 normed input once per linear, and each linear saves its
        # own copy: q, k, v read three copies (2 extra), SwiGLU's gate and up two (1 extra)
        # (dry-run, llama-style z0/z1 layouts; autocast caches casts of leaf weights only)
        inputs += e * tok * h * (2 + (1 if model.activation == "swiglu" else 0))
    # q and the core's output at the query heads, K and V at the g KV heads (enable_gqa)
    attn = e * tok * (2 * h + 2 * model.kv_dim) / tp + (tok * h / tp if fp8 else 0.0)
    if model.attention == "naive":
        attn += e * a * tok * seq_len / tp
    else:
        attn += 4.0 * a * tok / tp
    n_f = 2 if model.activation != "swiglu" else (3 if compile else 4)
    if model.is_moe:
        k, E = model.experts_per_token, model.num_experts
        te = expert_tp(tp, ep)  # f split over tp only with ep = 1
        copies = 3 + (1 if ep > 1 else 0)  # (N*k, h) copies; as many int64 (N*k,) indices
        mlp = 4.0 * tok * (E + k) + copies * (8.0 * k * tok + e * k * tok * h)
        if fp8:
            # float8 experts (precision/fp8.py Float8ExpertLinear): the dispatched input is
            # saved as n_in 1-byte copies (one per input linear) instead of one e-byte copy,
            # w2's input as 1 byte (as the dense MLP above)
            mlp += (n_in - e) * k * tok * h + ((n_f - 1) * e + 1) * k * tok * f / te
        else:
            mlp += n_f * e * k * tok * f / te
    elif fp8:
        mlp = (n_f - 1) * e * tok * f / tp + tok * f / tp  # w2's input saved as fp8
    else:
        mlp = n_f * e * tok * f / tp
    return norms + inputs + attn + mlp


def selective_layer_bytes(model: ModelConfig, *, tokens: float, tp: int, sp: bool, e: int,
                          r: int, ep: int = 1) -> float:
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
        out += (n_in * e * k * tokens * f / (expert_tp(tp, ep) * ep)
                + e * (k - 1) * tokens * h)
    else:
        out += n_in * e * tokens * f / tp
    return out


def selective_recompute_bytes(model: ModelConfig, *, full: float, stored: float,
                               tokens: float, tp: int, sp: bool, e: int) -> float:
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


def mlp_backward_work_bytes(model: ModelConfig, *, tokens: float, tp: int, sp: bool, e: int,
                            weight_bytes: int) -> float:
    """What a block's backward holds first, on top of what is stored: the gradient of the
    block's output, e*s_l*b*h (/t with SP), the MLP's first two (tokens x f) activation
    gradients, 2 x e*s_l*b*f/t (the gradient of w2's input and of the activation's input),
    and its first weight gradient, weight_bytes*h*f/t (unsharded).
    Source: dry-run of tiny-llama dp4 z2 b2 s128, ac=none: the largest rise inside the last
    block's backward is 202,752 B = 2 x 2 x 256 x 176 + 2 x 64 x 176, over a start that holds
    the block output's gradient (2 x 256 x 64). Ignores: MoE experts' (N*k, f) gradients (the
    dense f is used), norms' fp32 gradient temporaries (transient).
    """
    f, h = model.ffn_dim, model.dim
    return (e * tokens * h / (tp if sp else 1) + 2.0 * e * tokens * f / tp
            + weight_bytes * h * f / tp)


def head_activation_bytes(model: ModelConfig, *, seq_len: int, micro_batch: int, tp: int = 1,
                          sp: bool = False, cp: int = 1, precision: str = "bf16",
                          residual_fp32: bool = False, fused: bool = True) -> float:
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


def loss_backward_bytes(model: ModelConfig, *, seq_len: int, micro_batch: int, tp: int = 1,
                        cp: int = 1, fused: bool = True, precision: str = "bf16",
                        weight_bytes: int = 4, chunk_tokens: int = 0) -> float:
    """Temporaries of the loss backward on the last stage, alive while every activation is
    still stored (the peak of most steps).

    fused (models/loss.py's backward, per chunk of c tokens and V_l = V/t head rows): the
    hidden-state gradient e*s_l*b*h; the head gradient accumulator V_l*h in the weight's dtype
    (`weight_bytes`: 4 for fp32 parameters, 2 for FSDP2's 16-bit unsharded weight); the
    chunk's recomputed logits, fp32 c*V_l*4 beside their 16-bit matmul output or gradient
    cast c*V_l*e (none in fp32; the fp32 chunk is freed before one chunk's weight-gradient
    product, e*V_l*h, exists, so that product is not on top). Everything is /t: nothing of
    the full vocabulary exists on a tp rank. Measured with MemTracker under fake tensors
    (1024 tokens, GPT-2's vocabulary): bf16 weight 387.6 MB (these terms to 0.1 MB); fp32
    weight under autocast 541.9 MB, these terms plus the weight's own 16-bit cast (see below).
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
    # Not added: the weight's 16-bit cast e*V_l*h when the weight is fp32 under autocast. The
    # rank's states already count a 16-bit copy of every weight in flight (autocast's cached
    # casts); the fused loss makes its own cast instead of autocast's, so counting both
    # over-predicted by about that table (dry-run: gpt2-124m-L2 dp2 z0 bf16 +5.3%,
    # llama-1024-L4 dp2 z0 bf16 +5.1% with it).
    return out


def embedding_backward_bytes(model: ModelConfig, *, tp: int = 1, grad_bytes: int = 4,
                             tied: bool | None = None) -> float:
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


def held_logits_bytes(model: ModelConfig, *, seq_len: int, micro_batch: int, tp: int = 1,
                      cp: int = 1, precision: str = "bf16", fused: bool = True) -> float:
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


def activation_bytes(model: ModelConfig, *, seq_len: int, micro_batch: int,
                     num_layers: int | None = None, in_flight: float = 1.0,
                     **kw: object) -> float:
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


def buffer_terms(*, hidden: int, tokens: float, precision: str, zero: int, dp: int, tp: int,
                 sp: bool, pp: int, cp: int, ep: int, kv_dim: int, experts_per_token: int,
                 unit_params: float, zero_shards: int, device: str = "gpu",
                 reduce_bytes: int = 4, bucket_params: float = 0.0,
                 ffn_dim: int = 0, ddp: bool = True) -> dict[str, float]:
    """Named transient buffers on one rank (bytes). tokens = s_l * b of one micro-batch.

    ddp_buckets: DDP (zero 0, and zero 1 which runs over DDP): the reducer's flat bucket copy of
      every gradient, reduce_bytes x bucket_params (the rank's replicated parameters), kept for
      the run: the trainer's `replicate` keeps torch's default gradient_as_bucket_view=False
      (the dry-run adds the same term). Without bucket_params: 2 x 25 MB in flight (bucket_cap_mb).
      zero 2 is FSDP2 (no DDP buckets; its collectives are as zero 3's). ddp=False
      (`config.layout.ddp_reducer`: tp, ep or pp > 1): no reducer, the gradients are averaged
      after backward through flat buckets of <= 25 MiB each
      (parallel/data_parallel.py BUCKET_BYTES), freed one by one when the activations are
      already gone: not counted (dry-run, tiny-moe dp4 ep2 z0: the bucket term was +17% of
      the transient peak).
    fsdp_reduce_scatter: ZeRO-3 fp32 copy of one unit's grads fed to the reduce-scatter
      (reduce_bytes x unit) plus its output shard; fsdp_all_gather: the all-gather input shard.
      (the all-gathered output is the in-flight param copy counted under params).
    tp_all_gather: SP's gathered (s x b x h) activation; tp all-reduce is in place (0).
    pp_p2p: send + receive activation buffers (2 x e*s*b*h, /t with SP); the per-rank planner
      replaces it with `pp_recv_buffer_bytes` (torch keeps one receive buffer per micro-batch).
    cp_ring: K/V blocks in flight in the ring (2 blocks x K and V).
    ep_all_to_all: dispatch send + receive of k routed copies per token (2 x e*k*s*b*h).
    fp8_quantize: fp8's quantization temporary at the peak, the fp32 scaled copy of the
      largest operand quantized, 4 x s*b*max(h, f)/t (dry-run, gpt-mini dp2 fp8 z0 / z3: the
      planner's total is 3% / 8% under without it; tiny-llama z3 3% under).
    runtime_context: RUNTIME_CONTEXT_BYTES on a GPU, 0 on 'cpu'.
    Ignores: NCCL's internal channel buffers beyond the context term, cuDNN workspaces.
    """
    e = 4 if precision == "fp32" else 2
    out: dict[str, float] = {}
    if dp > 1 or zero_shards > 1:
        if zero >= 2:
            out["fsdp_reduce_scatter"] = reduce_bytes * unit_params * (1 + 1 / max(1, zero_shards))
            out["fsdp_all_gather"] = e * unit_params / max(1, zero_shards)
        elif ddp:
            out["ddp_buckets"] = reduce_bytes * bucket_params if bucket_params else 2 * 25 * 2**20
    if tp > 1 and sp:
        out["tp_all_gather"] = e * tokens * hidden
    if pp > 1:
        out["pp_p2p"] = 2 * e * tokens * hidden / (tp if sp else 1)
    if cp > 1:
        out["cp_ring"] = 2 * 2 * e * tokens * kv_dim / tp
    if ep > 1:
        out["ep_all_to_all"] = 2 * e * experts_per_token * tokens * hidden
    if precision == "fp8":
        out["fp8_quantize"] = 4.0 * tokens * max(hidden, ffn_dim) / tp
    out["runtime_context"] = 0.0 if device == "cpu" else RUNTIME_CONTEXT_BYTES
    return out


def pp_recv_buffer_bytes(*, hidden: int, tokens: float, precision: str, zero: int, tp: int,
                         sp: bool, pp: int, virtual: int, rank: int, microbatches: int) -> float:
    """Pipeline receive buffers of pipeline rank `rank` (bytes), kept for the whole step.

    torch.distributed.pipelining allocates, per stage and per micro-batch, one forward receive
    buffer on every stage but the first (`_setup_forward_recv_info`) and one gradient receive
    buffer on every stage but the last (`_setup_backward_recv_info`), each a (b, s_l, h)
    residual-stream tensor (/t with SP). Their dtype is the stream's: the FSDP2 policy's
    compute dtype under ZeRO-2/3 with 16-bit precision, else fp32 (the fp32 embedding output
    keeps the residual sum in fp32 under autocast). Rank r holds stages r, r + pp, ... (v of
    them). Source: measured with the dry-run (which allocates them as torch does),
    llama-1024-L4 pp2 1f1b z0 rank 1: 4 x 2.1 MB; interleaved(v2) rank 1: 3 x 4 x 2.1 MB.
    Ignores: the send side (a tensor the stage already holds), NCCL's own buffers.
    """
    if pp <= 1:
        return 0.0
    io = 2 if (zero >= 2 and precision != "fp32") else 4
    n_stages = pp * virtual
    stages = [rank + k * pp for k in range(virtual)]
    n_buf = sum(1 for s in stages if s > 0) + sum(1 for s in stages if s < n_stages - 1)
    return n_buf * microbatches * io * tokens * hidden / (tp if sp else 1)
