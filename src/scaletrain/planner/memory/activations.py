"""Activation memory per GPU: what a block keeps or allocates for backward, per micro-batch
(torch-free); the head's, the loss's and the embedding's terms are in head.py.

Units: bytes; `GB` in docstrings means 1e9 bytes. Every function answers for ONE rank.
"""

from __future__ import annotations

from scaletrain.config import ModelConfig, compute_bytes, expert_tp

from .head import MicroBatchShape
from .naive_attention import naive_backward_bytes, naive_saved_bytes

__all__ = [
    "korthikanti_layer_bytes",
    "layer_activation_bytes",
    "activation_bytes",
    "selective_layer_bytes",
    "selective_recompute_bytes",
    "naive_backward_net_bytes",
    "mlp_backward_work_bytes",
    "mlp_saved_bytes",
    "attention_saved_bytes",
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
    rmsnorm_upcast: bool = False,
    naive_probs_only: bool = False,
) -> float:
    """Bytes one block keeps for backward, per micro-batch, on one rank.

    modern=False: Korthikanti's closed form (korthikanti_layer_bytes; fp32 doubles it).
    modern=True (scaletrain's models, SDPA, no dropout), derived per saved tensor, e = element
    bytes of activations (4 for fp32, else 2), r = residual-stream bytes (4 under autocast with
    fp32 params, else e), s_l = s/cp:
      norm inputs 2 x r*s_l*b*h (+ fp32 mean/rstd), 4 x with `post_norms` (Gemma 2's norms
        on the attention and MLP outputs) — /t with SP; RMSNorm over an fp32
        stream (r = 4) 2 x (4 + r)*s_l*b*h (x and the fp32 normalized output the weight's
        product saves); over a 16-bit stream scaletrain's norm (models/norms.py) saves x and
        rstd only, r; an eager `rms_norm(x.float()).type_as(x) * w` (rmsnorm_upcast=True:
        torchtitan's) its fp32 upcast and the cast-back output, 4 + r;
      QKV and MLP inputs 2 x e*s_l*b*h — NOT /t: DTensor SP all-gathers the normed input and the
        column-parallel linear saves the gathered copy (Korthikanti re-gather it instead);
      q/k RMSNorms (`qk_norm`, Qwen3) their inputs e*s_l*b*(q + kv)/t and an fp32 rstd per
        head (fp32: 8 bytes, x and the normalized output);
      q, k, v saved by SDPA e*s_l*b*(q + 2kv)/t, q = a*d (h unless `head_dim_override`):
        K and V at the g KV heads (SDPA's enable_gqa; the naive core groups queries instead
        of expanding K/V);
      under autocast (fp32 parameters, r = 4) each linear saves its own 16-bit cast of its
        input: + 2*e*s_l*b*h for q/k/v, + e*s_l*b*h for SwiGLU's gate/up;
      SDPA output (= out-proj input) e*s_l*b*q/t; flash/efficient log-sum-exp 4*a*s_l*b/t;
      'naive' attention its S x S set (`naive_saved_bytes`; naive_probs_only: e*a*s_l*s*b/t);
      GELU MLP: fc1 output and GELU output 2 x e*s_l*b*f/t; SwiGLU: gate, silu(gate), up and
        their product 4 x e*s_l*b*f/t (3 with torch.compile, which fuses silu*up); GeGLU the
        same with tanh-GELU for silu;
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
    e = compute_bytes(precision)
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
        model,
        tok=tok,
        e=e,
        r=r,
        tsp=tsp,
        fp8=fp8,
        residual_fp32=residual_fp32,
        upcast=rmsnorm_upcast,
    )
    if model.is_mla:
        attn = _mla_bytes(model, seq_len, micro_batch, tp, cp, e)
    else:
        attn = attention_saved_bytes(model, seq_len, micro_batch, tp, cp, e, fp8, naive_probs_only)
    mlp = _mlp_part(
        model, tok=tok, tp=tp, ep=ep, e=e, fp8=fp8, compile=compile, residual_fp32=residual_fp32
    )
    return norms + inputs + attn + mlp


def _mlp_part(
    model: ModelConfig,
    *,
    tok: float,
    tp: int,
    ep: int,
    e: int,
    fp8: bool,
    compile: bool,
    residual_fp32: bool = False,
) -> float:
    """The MLP's saved intermediates of one block: `_moe_bytes` for MoE (DeepSeekMoE:
    `_deepseek_moe_bytes`), else `_mlp_bytes`."""
    if model.is_moe and (model.num_shared_experts or model.router_scoring != "topk_softmax"):
        return _deepseek_moe_bytes(
            model, tok=tok, tp=tp, ep=ep, e=e, compile=compile, residual_fp32=residual_fp32
        )
    if model.is_moe:
        return _moe_bytes(model, tok=tok, tp=tp, ep=ep, e=e, fp8=fp8, compile=compile)
    return _mlp_bytes(model, tok=tok, tp=tp, e=e, fp8=fp8, compile=compile)


def mlp_saved_bytes(
    model: ModelConfig,
    *,
    tok: float,
    tp: int,
    ep: int,
    e: int,
    fp8: bool,
    compile: bool,
    residual_fp32: bool,
) -> float:
    """What one block's MLP saves without AC, its inputs with it (`layer_activation_bytes`'s
    terms): the gathered 16-bit input e*s_l*b*h (autocast: one cast per input linear,
    n_in x), or under fp8 each input linear's 1-byte copy, n_in*s_l*b*h (not /t), plus
    `_mlp_part`. Ignores: the MLP norm's saved input (alive until the norm's own backward)."""
    h = model.dim
    n_in = 2 if model.gated_mlp else 1
    if fp8:
        inputs = n_in * tok * h
    else:
        inputs = (n_in if residual_fp32 else 1) * e * tok * h
    mlp = _mlp_part(
        model, tok=tok, tp=tp, ep=ep, e=e, fp8=fp8, compile=compile, residual_fp32=residual_fp32
    )
    return inputs + mlp


def _mla_bytes(
    model: ModelConfig, seq_len: int, micro_batch: int, tp: int, cp: int, e: int
) -> float:
    """What one block's Multi-head Latent Attention (models/mla.py) saves beyond its input,
    per saved tensor (benchmarks/activation_ledger.py on a DeepSeek block, bf16 and fp32
    parameters: equal to the byte), tok = s_l*b tokens:
      each latent of width w (q's r_q when there is one, kv's r): the norm's input and the
        up-projection's input, 2 x e*w*tok (a 16-bit stream; fp32: the norm's input, its
        normalized output and the up-projection's input, 3 x 4*w*tok), + the fp32 rstd 4*tok;
        whole on every tp rank (replicated);
      SDPA's q, k, v and output, 4 x e*tok*a*(dn + dr)/t (v zero-padded to the q/k width, so
        the output is that wide too; k materialized per head: the RoPE key concatenated to
        each head's), + its fp32 log-sum-exp 4*a*tok/t;
      the output projection's input e*tok*a*dv/t (the cut output made contiguous).
    The naive core: SDPA's terms less the log-sum-exp and the padding, plus its S x S set
    (`naive_saved_bytes`). Ignores: RoPE (its cos/sin are shared buffers; the rotated q and k
    parts are not saved, only the concatenations), the wk_rope output (not saved)."""
    a, qk, dv = model.num_heads, model.qk_head_dim, model.v_head_dim
    tok = float(seq_len) / cp * micro_batch
    per_latent = 2 * e if e < 4 else 3 * e
    out = sum((per_latent * w + 4.0) * tok for w in (model.q_lora_rank, model.kv_lora_rank) if w)
    out += e * tok * a * dv / tp  # wo's input
    if model.attention == "naive":
        out += e * tok * a * (2 * qk + dv) / tp
        return out + naive_saved_bytes(
            model, seq_len=seq_len, micro_batch=micro_batch, tp=tp, cp=cp, e=e
        )
    return out + 4 * e * tok * a * qk / tp + 4.0 * a * tok / tp


def _deepseek_moe_bytes(
    model: ModelConfig,
    *,
    tok: float,
    tp: int,
    ep: int,
    e: int,
    compile: bool,
    residual_fp32: bool,
) -> float:
    """What one DeepSeekMoE block (models/deepseek_moe.py) saves, per saved tensor (measured
    with benchmarks/activation_ledger.py on a DeepSeek block, bf16 and fp32 parameters),
    tok = s_l*b tokens routed by this rank (the whole sequence under SP, as `_moe_bytes`):
      dispatch and combine as `_moe_bytes`: 3 (+1 with ep > 1) x (8*k + e*k*h)*tok (int64
        top-k ids, sort order, source tokens; the dispatched inputs, the experts' output and
        the weighted output); with an expert capacity its R rows, as `_moe_bytes`;
      routed experts' intermediates n_f x e*k*f*tok/t_e, shared experts' n_f x e*n_s*f*tok/t_e
        (t_e = `config.layout.expert_tp`; n_f as the dense MLP's);
      the router, in fp32: its input upcast, 4*h*tok, where the stream is 16-bit (FSDP's
        parameters; autocast's fp32 stream is read as is); the affinities 4*E*tok (sigmoid or
        softmax output); the chosen k weights 4*k*tok (and their sum twice, 8*tok, with
        norm_topk), cast for the combine e*k*tok (16-bit only); the group limit: the allowed-
        expert mask E*tok (bool), the chosen groups' ids 8*topk_groups*tok and, sigmoid, the
        two best of each group's ids 16*G*tok (softmax: each group's fp32 max 4*G*tok).
    Ignores: the router weight's fp32 copy (4*E*h per block and micro-batch, 16-bit
    parameters), the balance loss's (B, E) terms, fp8 experts (modelled as 16-bit)."""
    h, f, E, k = model.dim, model.ffn_dim, model.num_experts, model.experts_per_token
    te = expert_tp(tp, ep)
    n_f = _mlp_intermediates(model, compile)
    copies = 3 + (1 if ep > 1 else 0)
    if model.moe_capacity_factor:  # the permuted buffers' R rows, as `_moe_bytes`
        kr = model.expert_rows_per_token(tok)
        per_tok = _dispatch_index_bytes(model, tok, copies) / tok + copies * e * kr * h
        per_tok += n_f * e * (kr + model.num_shared_experts) * f / te
    else:
        per_tok = copies * (8.0 * k + e * k * h)
        per_tok += n_f * e * (k + model.num_shared_experts) * f / te
    per_tok += 4.0 * E + 4.0 * k + (e * k if e < 4 else 0.0)
    if model.router_norm_topk:
        per_tok += 8.0
    if model.router_groups > 1:
        g = model.router_groups
        per_tok += E + 8.0 * model.router_topk_groups
        per_tok += 16.0 * g if model.router_scoring == "sigmoid" else 4.0 * g
    if e < 4 and not residual_fp32:
        per_tok += 4.0 * h
    return per_tok * tok


def _norm_and_input_bytes(
    model: ModelConfig,
    *,
    tok: float,
    e: int,
    r: int,
    tsp: int,
    fp8: bool,
    residual_fp32: bool,
    upcast: bool,
) -> tuple[float, float]:
    """(norm inputs, the linears' saved inputs) of one block: `layer_activation_bytes`'s terms,
    tok = s_l*b tokens, tsp = t under SP (else 1), upcast = its rmsnorm_upcast."""
    h = model.dim
    stats = 8.0 if model.norm == "layernorm" else 4.0
    nb = float(r)
    if model.norm == "rmsnorm" and (r == 4 or upcast):
        # `weight * rms_norm(x.float()).to(x.dtype)` through autograd saves the fp32 x (the
        # input itself when r = 4) and the normalized output cast back (r): 4 + r per element
        # (dry-run: llama-style layouts were 5-7% under before this term). scaletrain's norm
        # over a 16-bit stream (models/norms.py `_RMSNorm16`) saves x and rstd alone: r
        # (activation_ledger.md, llama-block bf16 params, ac=none: 2,758,656 B measured =
        # analytic, 524,288 B less than the 4 + r norm's 3,282,944 B)
        nb = 4.0 + r
    norms = _norm_count(model) * (nb * h + stats) * tok / tsp
    n_in = 2 if model.gated_mlp else 1
    inputs = (3 + n_in) * tok * h if fp8 else 2 * e * tok * h
    if residual_fp32 and not fp8:
        # autocast casts the fp32 normed input once per linear, and each linear saves its
        # own copy: q, k, v read three copies (2 extra), SwiGLU's gate and up two (1 extra)
        # (dry-run, llama-style z0/z1 layouts; autocast caches casts of leaf weights only)
        inputs += e * tok * h * (2 + (1 if model.gated_mlp else 0))
    return norms, inputs


def _norm_count(model: ModelConfig) -> int:
    """Norms per block whose inputs are saved: the two pre-norms, and Gemma 2's two norms on
    the sub-layers' outputs (`post_norms`)."""
    return 4 if model.post_norms else 2


def attention_saved_bytes(
    model: ModelConfig,
    seq_len: int,
    micro_batch: int,
    tp: int,
    cp: int,
    e: int,
    fp8: bool,
    probs_only: bool,
) -> float:
    """What one block's attention saves beyond its input (`layer_activation_bytes`'s terms)."""
    a = model.num_heads
    tok = float(seq_len) / cp * micro_batch  # tokens this rank holds: s_l * b
    # q and the core's output at the query heads, K and V at the g KV heads (enable_gqa)
    q = model.q_dim
    attn = e * tok * (2 * q + 2 * model.kv_dim) / tp + (tok * q / tp if fp8 else 0.0)
    if model.qk_norm:
        # Qwen3's per-head q/k RMSNorms save their inputs, the q and k projections' outputs
        # (16-bit: x and an fp32 rstd per head and token, models/norms.py; fp32: x and the
        # normalized output the weight's product reads)
        heads = a + model.num_kv_heads
        attn += (e if e < 4 else 8) * tok * (q + model.kv_dim) / tp + 4.0 * tok * heads / tp
    if model.attention != "naive":
        attn += 4.0 * a * tok / tp  # flash/efficient log-sum-exp
    elif probs_only:  # a foreign recipe's fused 16-bit softmax keeps its probabilities only
        attn += e * a * tok * seq_len / tp
    else:
        attn += naive_saved_bytes(
            model, seq_len=seq_len, micro_batch=micro_batch, tp=tp, cp=cp, e=e
        )
    return attn


def naive_backward_net_bytes(
    model: ModelConfig,
    mb: MicroBatchShape,
    *,
    compile: bool = False,
    residual_fp32: bool = False,
    ep: int = 1,
) -> float:
    """`naive_backward_bytes` less what the block has freed when its core's backward runs:
    the saved tensors of everything after the core in forward order (backward ran those
    first and autograd released them): the MLP's intermediates (`_mlp_bytes`/`_moe_bytes`),
    the norms after the core (the second of two, the last three of Gemma 2's four: that share
    of `_norm_and_input_bytes`'s norms), the MLP's saved input (its autocast copies included;
    fp8: its 1-byte copies) and the out-projection's input, the core's output e*s_l*b*q/t.
    Ignores: the MLP/out-projection gradients written by then (the grads term), the head's
    activations (freed earlier; still in the stored side).
    Source: dry-run, llama3-8b L1 dp8 z1 s4096 b8 bf16: +7.8% with the whole stored set
    beside the S x S gradients, within 1% with these freed."""
    seq_len, micro_batch, tp, cp = mb.seq_len, mb.micro_batch, mb.tp, mb.cp
    e = compute_bytes(mb.precision)
    r = 4 if residual_fp32 else e
    h = model.dim
    tok = mb.tokens
    fp8 = mb.precision == "fp8"
    norms, _ = _norm_and_input_bytes(
        model,
        tok=tok,
        e=e,
        r=r,
        tsp=tp if mb.sp else 1,
        fp8=fp8,
        residual_fp32=residual_fp32,
        upcast=False,
    )
    n_in = 2 if model.gated_mlp else 1
    if fp8:
        mlp_in = n_in * tok * h
    else:
        mlp_in = e * tok * h * (n_in if residual_fp32 else 1)
    mlp = _mlp_part(model, tok=tok, tp=tp, ep=ep, e=e, fp8=fp8, compile=compile)
    after_core = (_norm_count(model) - 1) / _norm_count(model)
    freed = norms * after_core + mlp_in + mlp + e * tok * model.q_dim / tp
    gross = naive_backward_bytes(model, seq_len=seq_len, micro_batch=micro_batch, tp=tp, cp=cp, e=e)
    return max(0.0, gross - freed)


def _mlp_intermediates(model: ModelConfig, compile: bool) -> int:
    """(B, T, f) tensors a dense MLP saves: GELU 2; SwiGLU 4, 3 when compiled (silu*up fused)."""
    return 2 if not model.gated_mlp else (3 if compile else 4)


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
    byte (the router stays 16-bit).
    An expert capacity (`model.moe_capacity_factor`, models/moe_dispatch.py) sizes every
    permuted buffer by its R rows instead of N*k: R/tok = `ModelConfig.expert_rows_per_token`
    (E*C padded; min(E*C, N*k) unpadded, the balanced router's, which the dry-run
    dispatches); the top-k ids stay (N, k); the other int64 indices are R long, one more
    padded (the padding rows' output row: `_dispatch_index_bytes`)."""
    h, f = model.dim, model.ffn_dim
    n_f = _mlp_intermediates(model, compile)
    n_in = 2 if model.gated_mlp else 1
    k, E = model.experts_per_token, model.num_experts
    kr = model.expert_rows_per_token(tok)  # permuted rows per token: k without a capacity
    te = expert_tp(tp, ep)  # f split over tp only with ep = 1
    copies = 3 + (1 if ep > 1 else 0)  # (N*k, h) copies; as many int64 (N*k,) indices
    if model.moe_capacity_factor:
        mlp = 4.0 * tok * (E + k) + _dispatch_index_bytes(model, tok, copies)
        mlp += copies * e * kr * tok * h
    else:
        mlp = 4.0 * tok * (E + k) + copies * (8.0 * k * tok + e * k * tok * h)
    if fp8:
        # float8 experts (precision/fp8.py Float8ExpertLinear): the dispatched input is
        # saved as n_in 1-byte copies (one per input linear) instead of one e-byte copy,
        # w2's input as 1 byte (as the dense MLP)
        mlp += (n_in - e) * kr * tok * h + ((n_f - 1) * e + 1) * kr * tok * f / te
    else:
        mlp += n_f * e * kr * tok * f / te
    return mlp


def _dispatch_index_bytes(model: ModelConfig, tok: float, copies: int) -> float:
    """The int64 indices an MoE block with an expert capacity saves (models/moe_dispatch.py,
    saved-tensor hooks on a 64-wide, 8-expert layer: equal to the byte): the router's top-k
    ids 8*k*tok, and per permuted row (R = `expert_rows_per_token` x tok) the rows' source
    assignment (the combine weights' gather) and source token (the dispatch gather and the
    combine's index_add), 2 x 8*R, padded one more (the output row, a padding row's the spare
    one); ep > 1 its regrouping permutation, 8*R (copies - 3)."""
    k, kr = model.experts_per_token, model.expert_rows_per_token(tok)
    per_row = copies - 1 + (1 if model.moe_pad_to_capacity else 0)
    return 8.0 * k * tok + per_row * 8.0 * kr * tok


def selective_layer_bytes(
    model: ModelConfig, *, tokens: float, tp: int, sp: bool, e: int, r: int, ep: int = 1
) -> float:
    """Bytes one block keeps under `memory.ac="selective"` (parallel/ac.py's per-op policy:
    the whole block is checkpointed, the outputs of matmuls, fused attention kernels and TP
    reductions are saved, everything else is recomputed in backward). tokens = s_l*b.

    Counts: the block input r*s_l*b*h (/t with SP; the checkpoint's input); the q, k, v
    projections e*s_l*b*(q + 2kv)/t (q = a*d; MLA: its latents e*s_l*b*(r_q + r + d_r), whole
    on every tp rank, and its per-head projections e*s_l*b*a*(2 d_n + d_r + d_v)/t; SDPA's
    output at the q/k width); SDPA's output e*s_l*b*q/t and fp32 log-sum-exp
    4*a*s_l*b/t (the naive core's S x S matmuls are recomputed: no attention term); the
    output projections wo and w2, e*s_l*b*h each and NOT /t (a row-parallel matmul's output is
    this rank's partial sum over the full hidden width); with tp > 1 the reduction of each of
    those, saved too: reduce-scatter e*s_l*b*h/t (SP) or all-reduce e*s_l*b*h; the MLP's
    input matmuls, n_in x e*s_l*b*f/t (n_in = 2 for SwiGLU's gate and up, 1 for GELU). MoE:
    the router's matmul e*s_l*b*E and the experts' matmuls for k*s_l*b routed tokens (n_in x
    e*k*s_l*b*f/(t_e*ep) + e*k*s_l*b*h, t_e = `config.layout.expert_tp`; with an expert
    capacity R rows for k*s_l*b, `ModelConfig.expert_rows_per_token`); DeepSeekMoE's
    router in fp32 (4 bytes) and its shared experts' matmuls (n_in x e*s_l*b*n_s*f/t_e and
    their down projection e*s_l*b*h); the dense MLP terms are replaced.
    Ignores: RoPE tables (shared buffers), the fp8 scales (a few floats per tensor).
    Source: torch.utils.checkpoint's selective policy keeps exactly the outputs of the ops
    `ac.SELECTIVE_SAVED_OPS` names; checked against the dry-run (planner_accuracy.md).
    """
    h, a, f, kv = model.dim, model.num_heads, model.ffn_dim, model.kv_dim
    tsp = tp if sp else 1
    n_in = 2 if model.gated_mlp else 1
    q = model.q_dim
    out = r * tokens * h / tsp
    if model.is_mla:
        # MLA's matmuls: the latents' (r_q, r, d_r: whole on every tp rank) and the heads'
        # (q, k_nope | v); SDPA's output at the q/k width (v padded: models/mla.py)
        qk, dn, dv = model.qk_head_dim, model.qk_nope_head_dim, model.v_head_dim
        latents = model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim
        out += e * tokens * latents + e * tokens * a * (qk + dn + dv) / tp
        if model.attention != "naive":
            out += e * tokens * a * qk / tp + 4.0 * a * tokens / tp
    else:
        out += e * tokens * (q + 2 * kv) / tp
        if model.attention != "naive":
            out += e * tokens * q / tp + 4.0 * a * tokens / tp
    reduced = 0.0 if tp == 1 else (e * tokens * h / tp if sp else e * tokens * h)
    out += 2 * (e * tokens * h + reduced)  # wo and w2 outputs, and their TP reductions
    if model.is_moe:
        kr = model.expert_rows_per_token(tokens)  # the permuted rows: k without a capacity
        deepseek = model.num_shared_experts or model.router_scoring != "topk_softmax"
        # the router's logits (DeepSeek's router runs in fp32)
        out += (4 if deepseek else e) * tokens * model.num_experts
        out += n_in * e * kr * tokens * f / (expert_tp(tp, ep) * ep) + e * (kr - 1) * tokens * h
        if model.num_shared_experts:  # their input matmuls and down projection
            fs = model.num_shared_experts * f
            out += n_in * e * tokens * fs / expert_tp(tp, ep) + e * tokens * h
    else:
        out += n_in * e * tokens * f / tp
    return out


def selective_recompute_bytes(
    model: ModelConfig, *, full: float, stored: float, tokens: float, tp: int, sp: bool, e: int
) -> float:
    """Bytes the recomputation re-creates while one block runs its backward under
    `memory.ac="selective"`, on top of what the block keeps (`selective_layer_bytes`), net of
    what the recomputation frees.

    The checkpoint re-runs the block's forward from its saved tensors: every tensor the no-AC
    set saves (`full`, `layer_activation_bytes(ac="none")`) is alive again, except those the
    policy kept, which the recompute takes from its cache. The kept set (`stored`) holds two
    tensors the no-AC set does not: the outputs of the output projections wo and w2 (and, with
    tp > 1, their saved reductions), e*s_l*b*h + the reduction each, which no backward op
    reads. The recompute *pops* each cached output as it replays the op
    (torch.utils.checkpoint `_CachedTorchDispatchMode`: `storage[func].pop(0)`), so wo's
    output and its reduction are referenced by nothing once the residual add that reads them
    has run, and are freed inside the recompute; w2's are not: checkpoint's early stop
    (`set_checkpoint_early_stop`, on by default) ends the recompute when w2's matmul packs its
    saved input, before the matmul (and its reduction) replay, so they stay cached until the
    block's backward ends. So what the backward adds is full - (stored - both outputs) - wo's
    output = full - stored + (e*s_l*b*h + its reduction).
    Counts: the block's no-AC set less the kept overlap, less wo's freed output. Ignores: the
    order in which backward frees the re-created tensors (all are alive when the MLP's
    backward starts, where the bf16 dry-run peaks). Source: dry-run op trace (MemTracker's
    running total per dispatched op) of Llama-3-70B TP8+SP bf16 selective, 2 blocks, dp32
    ZeRO-3, 16 x 8,192 tokens: the recompute's residual add after attention frees 2,147 MB
    (wo's (tokens x h) partial sum) + 268 MB (its reduce-scatter), and w2's backward then
    runs with no free of that size (planned +5.0% while both were counted); tiny-llama dp4 z2
    b2 s128: the largest rise inside the last block's backward (`mlp_backward_work_bytes`
    on top of this term).
    """
    h = model.dim
    reduced = 0.0 if tp == 1 else (e * tokens * h / tp if sp else e * tokens * h)
    return max(0.0, full - stored + (e * tokens * h + reduced))


def mlp_backward_work_bytes(
    model: ModelConfig, *, tokens: float, tp: int, sp: bool, e: int, weight_bytes: int
) -> float:
    """What a block's backward holds first, on top of what is stored: the gradient of the
    block's output, e*s_l*b*h (/t with SP), its first weight gradient, w2's
    weight_bytes*h*f/t (unsharded), and the larger of the MLP backward's two stages:
    - w2's backward (SP only): the output gradient all-gathered over the tp ranks, e*s_l*b*h
      (the row-parallel w2 reads the whole (tokens x h) gradient: DTensor's Shard -> Partial
      redistribution, a sequence all-gather, in backward), alive through both of w2's
      matmuls, and the gradient of w2's input, e*s_l*b*f/t;
    - the activation's backward: the (tokens x f) activation gradients, n x e*s_l*b*f/t, the
      gathered gradient freed. n: the gradient of w2's input, plus what the activation's
      backward allocates (SwiGLU's mul: the gradients of silu(gate) and of up, 2; GELU: that
      of its input, 1), minus w2's saved input, freed once w2's backward has run: 2 for
      SwiGLU, 1 for GELU (whose peak is w2's backward itself: its input gradient and weight
      gradient).
    Without SP the first stage is the second's less its activation gradients, so the second
    is the term. Source: dry-run of tiny-llama dp4 z2 b2 s128, ac=none: the largest rise
    inside the last block's backward is 202,752 B = 2 x 2 x 256 x 176 + 2 x 64 x 176, over a
    start that holds the block output's gradient (2 x 256 x 64); tiny dp2 z3 fp32 b1 s128
    (GELU): the peak is inside w2's backward with 4 x 128 x 256 + 4 x 64 x 256 on top of the
    output's gradient (4 x 128 x 64); Llama-3-70B TP8+SP bf16 selective, 2 blocks (h = 8,192
    against f/t = 3,584): the peak is w2's input-gradient matmul with the gathered 2,147 MB
    gradient alive (op trace of the dry-run; tiny-llama tp2+sp, f/t > h, peaks in SwiGLU's
    mul backward instead). Ignores: MoE experts' (N*k, f) gradients (the dense f is used),
    norms' fp32 gradient temporaries (transient).
    """
    f, h = model.ffn_dim, model.dim
    n = 2.0 if model.gated_mlp else 1.0
    fe = e * tokens * f / tp
    w2_stage = e * tokens * h + fe if sp and tp > 1 else 0.0
    stage = max(n * fe, w2_stage)
    return e * tokens * h / (tp if sp else 1) + stage + weight_bytes * h * f / tp


def rope_table_bytes(model: ModelConfig) -> float:
    """RoPE's cos and sin tables, one pair per model (models/attention.py: two fp32
    (max_seq_len, head_dim) non-persistent buffers; MLA: its RoPE width), 8*max_seq_len*
    head_dim bytes, two pairs with Gemma 3's own base for the windowed layers
    (`rope_local_theta`); 0 for learned positions (their table is a parameter). Source: the
    dry-run's 'module_buffers' (llama2-7b widths: 4.19 MB)."""
    if model.position != "rope":
        return 0.0
    local = model.rope_local_theta
    pairs = 2 if local and local != model.rope_theta else 1
    return pairs * 8.0 * model.max_seq_len * model.rope_dim


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
