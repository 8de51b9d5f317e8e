"""FLOPs per token of a decoder-only transformer (torch-free).

Convention (stated because it moves MFU by ~12% at 8k context): one multiply-add = 2 FLOPs; only
matrix multiplications are counted (norms, activations, softmax, RoPE, residual adds, the
embedding lookup and the optimizer are ignored: together < 1% for h >= 768); causal attention is
*halved* by default (a flash kernel skips the masked half; Megatron-LM and PaLM-style counts
differ here: pass `causal=False` for the un-halved count of Narayanan et al. 2021, eq. 3).
A sliding window (`model.sliding_window` < seq_len, Mistral) is counted as full causal
attention: an over-count of the attention core, which with a mask argument runs a kernel that
computes the whole (T, T) block anyway.

DeepSeek-V2/V3 (config/deepseek.py): Multi-head Latent Attention's projections (the latents'
down- and up-projections) replace q/k/v; its core multiplies q/k heads of dn + dr and value heads
of dv; an MoE block adds its shared experts to the routed top-k; the first `num_dense_layers`
blocks are dense (`layer_kinds`: each kind counted with its own block).

Backward = 2 x forward (gradient w.r.t. inputs and w.r.t. weights, Kaplan et al. 2020 "6N").
Recompute adds forward work that is *hardware* FLOPs, not model FLOPs: MFU (PaLM, Chowdhery et
al. 2022, App. B) uses `recompute="none"`.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import Layout, ModelConfig, expert_tp

__all__ = [
    "flops_per_token",
    "forward_flops_per_token",
    "attention_core_flops_per_token",
    "matmul_params",
    "layer_forward_flops_per_token",
    "head_forward_flops_per_token",
    "FLASH_BACKWARD_FACTOR",
    "counted_flops_per_token",
    "capacity_rows_forward_flops",
    "op_sac_recompute_flops_per_token",
    "layer_kinds",
    "layers_forward_flops_per_token",
    "LoraFlops",
    "lora_flops",
]

FLASH_BACKWARD_FACTOR = 2.5
"""Attention-core backward / forward FLOPs of a flash-style kernel: the backward does dV = P^T dO,
dP = dO V^T, dQ = dS K, dK = dS^T Q and recomputes S = Q K^T (5 matmuls against the forward's 2;
Dao 2022 §3.1 and torch.utils.flop_counter.sdpa_backward_flop_count)."""


def layer_kinds(model: ModelConfig) -> tuple[tuple[int, ModelConfig], ...]:
    """(count, per-block config) of the model's kinds of blocks: every block alike, or an MoE
    model's dense first blocks (`ModelConfig.dense_layer_view`) and its MoE blocks."""
    dense = model.num_dense_layers if model.is_moe else 0
    if not dense:
        return ((model.num_layers, model),)
    return ((model.num_layers - dense, model), (dense, model.dense_layer_view()))


def _attention_matmul_params(model: ModelConfig) -> int:
    """Weights one token multiplies through in a block's attention: q, k, v, o (h*a*d + 2*h*g*d
    + a*d*h), or MLA's q (h*rq + rq*a*(dn + dr), or h*a*(dn + dr)), kv latent and RoPE key
    h*(r + dr), up-projection r*a*(dn + dv) and output a*dv*h."""
    h, a = model.dim, model.num_heads
    if not model.is_mla:
        d, g = model.head_dim, model.num_kv_heads
        return 2 * h * a * d + 2 * h * g * d
    rq, r, dn, dr, dv = (
        model.q_lora_rank,
        model.kv_lora_rank,
        model.qk_nope_head_dim,
        model.qk_rope_head_dim,
        model.v_head_dim,
    )
    q = h * rq + rq * a * (dn + dr) if rq else h * a * (dn + dr)
    return q + h * (r + dr) + r * a * (dn + dv) + a * dv * h


def matmul_params(model: ModelConfig) -> tuple[int, int]:
    """(per-layer, head) weights that one token multiplies through in the forward pass.

    Per layer (an MoE model's MoE block): the attention's projections
    (`_attention_matmul_params`), the MLP matrices of the top-k experts a token is routed to
    (2 or 3 x h*f each) and of the shared experts (3 x h*n_s*f), the router h*E. Head: V*h
    (also when tied: the tied matrix is still multiplied). Ignores biases and norm weights
    (elementwise work). A dense first block's: `matmul_params(model.dense_layer_view())`.
    """
    h, f = model.dim, model.ffn_dim
    n_mat = 3 if model.gated_mlp else 2
    experts = model.experts_per_token + model.num_shared_experts if model.is_moe else 1
    per_layer = _attention_matmul_params(model) + experts * n_mat * h * f + h * model.num_experts
    return per_layer, model.vocab_size * h


def attention_core_flops_per_token(
    model: ModelConfig, seq_len: int, *, causal: bool = True, value_dim: int = 0
) -> float:
    """Forward FLOPs per token of one layer's attention core: QK^T (2*s*a*d_qk) + AV
    (2*s*a*d_v).

    = 4*s*h per token for d_qk = d_v = h/a (Narayanan et al. 2021); halved for causal masks
    when `causal`. Independent of GQA (every query head still attends over s keys). MLA:
    d_qk = dn + dr, d_v = dv; `value_dim` replaces d_v (the dry-run's SDPA multiplies values
    zero-padded to d_qk: models/mla.py).
    """
    d_v = value_dim or model.value_head_dim
    core = 2.0 * seq_len * model.num_heads * (model.qk_head_dim + d_v)
    return core / 2 if causal else core


def layer_forward_flops_per_token(
    model: ModelConfig, seq_len: int, *, causal: bool = True
) -> float:
    """Forward FLOPs per token of one transformer block: 2 x matmul weights + attention core
    (an MoE model's MoE block; `layers_forward_flops_per_token` sums every block)."""
    per_layer, _ = matmul_params(model)
    return 2.0 * per_layer + attention_core_flops_per_token(model, seq_len, causal=causal)


def layers_forward_flops_per_token(
    model: ModelConfig, seq_len: int, *, causal: bool = True
) -> float:
    """Forward FLOPs per token of all blocks, each kind with its own (`layer_kinds`)."""
    return sum(
        n * layer_forward_flops_per_token(kind, seq_len, causal=causal)
        for n, kind in layer_kinds(model)
    )


def head_forward_flops_per_token(model: ModelConfig) -> float:
    """Forward FLOPs per token of the output head (logits): 2*V*h."""
    return 2.0 * model.vocab_size * model.dim


def forward_flops_per_token(model: ModelConfig, seq_len: int, *, causal: bool = True) -> float:
    """Forward FLOPs per token of the whole model: the L blocks + head."""
    return layers_forward_flops_per_token(model, seq_len, causal=causal) + (
        head_forward_flops_per_token(model)
    )


def flops_per_token(
    model: ModelConfig, seq_len: int, *, causal: bool = True, recompute: str = "none"
) -> float:
    """Training FLOPs per token: forward + backward (2 x forward) + recomputation.

    recompute: 'none' -> 3F (model FLOPs, what MFU uses); 'full' -> + one extra forward of every
    block (3F + F_blocks: the "96 instead of 72" of Narayanan et al. 2021; the head is not
    checkpointed); 'selective' -> + the attention core forward of every block (Korthikanti et al.
    2022 recompute only softmax/attention-over-values). For a dense GPT (f=4h, MHA, no bias) with
    `causal=False` this is exactly 72*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) per sequence.
    """
    fwd = forward_flops_per_token(model, seq_len, causal=causal)
    if recompute == "none":
        extra = 0.0
    elif recompute == "full":
        extra = layers_forward_flops_per_token(model, seq_len, causal=causal)
    elif recompute == "selective":
        extra = model.num_layers * attention_core_flops_per_token(model, seq_len, causal=causal)
    else:
        raise ValueError(f"recompute={recompute!r}: use 'none', 'selective' or 'full'")
    return 3.0 * fwd + extra


def _counted_matmul_params(model: ModelConfig, tp: int, ep: int) -> float:
    """`matmul_params`' per-layer weights as FlopCounterMode counts them on one rank: the
    DTensor matmuls (attention, a dense MLP) at their global shapes, the MoE experts (routed and
    shared, run on local tensors: parallel/tensor_parallel.py) at this rank's share, /tp when
    tensor parallelism splits them (ep = 1), and the router (plain, replicated) whole."""
    per_layer, _ = matmul_params(model)
    if not model.is_moe:
        return per_layer
    n_mat = 3 if model.gated_mlp else 2
    k = model.experts_per_token + model.num_shared_experts
    experts = k * n_mat * model.dim * model.ffn_dim
    return per_layer - experts + experts / expert_tp(tp, ep)


@dataclass(frozen=True, slots=True)
class LoraFlops:
    """A LoRA plan's matmul FLOPs per token against full training's (`lora_flops`)."""

    adapters_forward: float
    """One block's adapters in forward: 2 x rank x (in + out) per adapted projection."""
    saved_per_block: float
    """What a block's backward does not compute: the frozen weights' gradients (2 x their
    multiply-adds) less the adapters' backward (their input and weight gradients, 4 x)."""
    first_block_saved: float
    """What the first block's backward skips on top: the input gradients of q, k, v and of
    their adapters' A (their input, the frozen embedding's normed output, needs none)."""
    head_saved: float
    """The frozen head's weight gradient, 2 x V x h (fused head: one of its 4 x 2Vh)."""
    replicated_forward: float = 0.0
    """One block's forward FLOPs of the adapter halves tensor parallelism does not split
    (`parallel.tensor_parallel_lora`: A beside a column-parallel W, 2 x rank x in; B beside
    a row-parallel W, 2 x rank x out): every tp rank computes them whole, and their
    backward (weight and input gradients) whole too, 2 x forward. Counted once above, as
    FlopCounterMode counts DTensor's global shapes; `replicated_hardware` is what the tp
    group computes on top."""

    def replicated_hardware(self, tp: int, recompute: str = "none") -> float:
        """The hardware FLOPs per token of one block the tp group runs on top of the counted
        ones (forward + 2 x in backward, + the forward again under full recompute) for the
        halves every rank computes whole: (tp - 1) copies of them. A time model that divides
        a block's FLOPs by tp gets each rank's work with this added."""
        passes = 4.0 if recompute == "full" else 3.0
        return (tp - 1) * passes * self.replicated_forward


def lora_flops(model: ModelConfig, rank: int, targets: tuple[str, ...]) -> LoraFlops:
    """Per-token FLOPs LoRA (Hu et al. 2021) adds and removes, from `config.lora`'s
    projection shapes: every frozen weight skips its weight gradient (a third of a dense
    block's matmul FLOPs), each adapted projection adds two thin matmuls forward and four
    backward, and the first block skips the input gradients of what reads its input (q, k,
    v and their adapters' A: autograd computes no gradient for a tensor that needs none).
    Counted as FlopCounterMode counts the trainer's step (under tp, DTensor's global
    shapes: each adapter once). The halves tp leaves whole on every rank (A beside a
    column-parallel projection, B beside a row-parallel one, `config.lora.ROW_PARALLEL`)
    are `replicated_forward`. Ignores: the adapters' scaling (elementwise) and dropout."""
    from scaletrain.config.lora import ROW_PARALLEL, projection_shapes

    shapes = projection_shapes(model)
    per_layer, _ = matmul_params(model)
    adapted = {n: rank * (rows + cols) for n, (rows, cols) in shapes.items() if n in targets}
    qkv = ("wq", "wk", "wv")
    first = 2.0 * sum(rows * cols for n, (rows, cols) in shapes.items() if n in qkv)
    first += 2.0 * sum(rank * shapes[n][1] for n in qkv if n in targets)
    # the whole half of each adapter under tp: B (out x rank) beside a row-parallel W, else A
    whole = sum(
        rank * (rows if n in ROW_PARALLEL else cols)
        for n, (rows, cols) in shapes.items()
        if n in targets
    )
    return LoraFlops(
        adapters_forward=2.0 * sum(adapted.values()),
        saved_per_block=2.0 * per_layer - 4.0 * sum(adapted.values()),
        first_block_saved=first,
        head_saved=2.0 * model.vocab_size * model.dim,
        replicated_forward=2.0 * whole,
    )


def counted_flops_per_token(
    model: ModelConfig,
    seq_len: int,
    *,
    recompute: str = "none",
    layout: Layout | None = None,
    fused_head: bool = True,
    lora: LoraFlops | None = None,
    fp8: bool = False,
) -> float:
    """Training FLOPs per token of one rank as torch's `FlopCounterMode` counts them (the
    dry-run's figure, scaletrain's own kernels and parallel layouts; `layout`'s tp, cp and
    ep are what it reads, None: one rank).

    Weights: as `flops_per_token` (forward 2 x, backward 4 x the multiply-adds; head
    included), NOT divided by tp: DTensor's matmuls are counted at their global shapes, so
    they are the tensor-parallel group's; MoE experts run on local tensors, /tp where tp
    splits them (`_counted_matmul_params`; ep: the layout's, which keeps them whole per tp
    rank). Attention core: as the SDPA kernels' formulas count
    it, over the full s x s score matrix (the counter does not see the causal mask), a
    backward of FLASH_BACKWARD_FACTOR x the forward (the naive core's bmms: 2 x), on this
    rank's local heads (/ tp: the attention runs on plain local tensors) and, under cp, on
    the key blocks ring attention does not skip: with the zigzag layout each rank computes
    (cp + 1) / (2 cp) of its queries' full s x s work (own block whole, half of every other:
    parallel/context_parallel.py).
    fused_head (the trainer's fused head + loss, models/loss.py, on the last stage pipelined
    or not; False: the plain head of the logits path): the head runs on plain local tensors,
    V/tp rows, and its backward recomputes the logits: 4 x 2*V*h/tp per token (forward,
    recompute, the two gradients).
    Recompute repeats forward work: 'selective' (parallel/ac.py's per-op policy keeps every
    matmul and fused-attention output) only the naive core's S x S matmuls; 'full' the
    attention core and every block matmul but a dense block's last (the MLP's down
    projection: torch's non-reentrant checkpoint stops recomputing once every saved tensor is
    back, and that output is saved by nothing; an MoE block's experts' output is saved by the
    combine's multiply, so all of it is recomputed: dry-run, tiny-deepseek dp2 ac=full).
    fp8 (the block linears converted, precision/fp8.py): the down projection is recomputed
    too: `_Fp8Matmul` is an autograd Function, whose saved tensors are packed after its
    forward, so the early stop comes after its matmul (dry-run, llama3-70b-L4 and
    llama-256-L2 tp4 fp8 full AC: -6.5% / -5.9% without it).
    Ignores, like the counter: elementwise ops, norms, the embedding, the optimizer.
    Source: measured with the dry-run's FlopCounterMode, 43 layouts
    (benchmarks/results/planner_accuracy.md, `flops` column).
    lora (`lora_flops`): the adapters' forward added to every block, the frozen weights'
    gradients (and the first block's skipped input gradients, and the frozen head's weight
    gradient) taken off; recompute is not combined with it (counted as without LoRA).
    """
    tp, cp, ep = (layout.tp, layout.cp, layout.ep) if layout is not None else (1, 1, 1)
    _, head = matmul_params(model)
    # SDPA multiplies MLA's values zero-padded to the q/k width (models/mla.py)
    padded = model.qk_head_dim if model.is_mla and model.attention != "naive" else 0
    core = attention_core_flops_per_token(model, seq_len, causal=False, value_dim=padded)
    attn = model.num_layers * core / tp * (cp + 1) / (2 * cp)
    head_flops = 4.0 * 2.0 * head / tp if fused_head else 3.0 * 2.0 * head
    weights = sum(n * _counted_matmul_params(kind, tp, ep) for n, kind in layer_kinds(model))
    # the naive core's backward is its 4 matmuls (dV, dP, dQ, dK: 2 x its forward's 2), no
    # recomputed Q K^T as a flash kernel's
    bwd = 2.0 if model.attention == "naive" else FLASH_BACKWARD_FACTOR
    total = 3.0 * 2.0 * weights + head_flops + (1.0 + bwd) * attn
    if recompute == "full":
        # a dense block's down projection is not recomputed (its output is saved by nothing);
        # an MoE block's experts all are (the combine's multiply saves their output)
        down = 0.0
        if not fp8:
            down = sum(
                n * kind.dim * kind.ffn_dim for n, kind in layer_kinds(model) if not kind.is_moe
            )
        total += 2.0 * (weights - down) + attn
    elif recompute == "selective":
        total += attn if model.attention == "naive" else 0.0
    elif recompute != "none":
        raise ValueError(f"recompute={recompute!r}: use 'none', 'selective' or 'full'")
    if lora is not None:
        blocks = model.num_layers
        total += blocks * (lora.adapters_forward - lora.saved_per_block)
        total -= lora.first_block_saved + lora.head_saved / (tp if fused_head else 1)
    return total


def capacity_rows_forward_flops(model: ModelConfig, tokens: float) -> float:
    """Forward FLOPs per token one MoE block's routed experts run beyond the model's k rows
    under an expert capacity (models/moe_dispatch.py), when one forward routes `tokens`
    tokens: (R/tok - k) x 2 x n_mat x h x f, R/tok = `ModelConfig.expert_rows_per_token`
    (E*C padded: the padding rows are computed; unpadded min(E*C, N*k): dropped rows are
    not). 0 without a capacity. Not in the model FLOPs (`flops_per_token`, MFU's), which keep
    the k routed rows as Megatron-LM's count does (training.py num_floating_point_operations
    reads moe_router_topk); hardware FLOPs add it (forward, 2x in backward, and again under
    full recompute, which re-runs an MoE block's experts: `counted_flops_per_token`)."""
    if not model.is_moe or not model.moe_capacity_factor:
        return 0.0
    n_mat = 3 if model.gated_mlp else 2
    extra = model.expert_rows_per_token(tokens) - model.experts_per_token
    return 2.0 * extra * n_mat * model.dim * model.ffn_dim


def op_sac_recompute_flops_per_token(model: ModelConfig) -> float:
    """Forward FLOPs per token that torchtitan's per-op selective AC recomputes in one dense
    Llama block: its policy saves every compute op's output (mm, SDPA, reduce-scatter) "except
    every second mm", counted per block in call order (torchtitan
    models/llama3/infra/parallelize.py `_apply_ac_to_transformer_block`, `_custom_policy`):
    wq, wk, wv, wo, then w1, w3, w2 -> wk, wo and w3 are recomputed (2 FLOPs per
    multiply-add); the attention core is saved. Ignores the recomputed RMSNorms (elementwise).
    MoE blocks are not modelled (their experts run grouped GEMMs the policy does not count)."""
    h, d, a, g, f = model.dim, model.head_dim, model.num_heads, model.num_kv_heads, model.ffn_dim
    second_mlp = f * h  # w3 (SwiGLU) or, for a 2-matrix MLP, the down projection
    return 2.0 * (h * g * d + a * d * h + second_mlp)
