"""The memory traffic of a Megatron-Core MoE layer's routed rows beside its GEMMs. Torch-free.

Every routed (token, expert) row passes through kernels that move bytes and do almost no
arithmetic (far below every GPU's ridge point), so they cost bytes / memory bandwidth on top of
the expert GEMMs (`moe_row_bytes_per_token`). Counted from the kernels Megatron-Core runs for
a dropless top-k MoE layer under the Megatron-LM and NeMo recipes (recipes.activations
`megatron_moe_applies`: Qwen3-MoE, Mixtral), k routed rows per token, h = hidden, f = expert
ffn, e = 2-byte elements, each tensor read once and written once per kernel:

- the permute before the dispatch and the unpermute after the combine (megatron/core/
  transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher.dispatch_preprocess /
  combine_postprocess, moe_utils.py permute / unpermute with moe_permute_fusion: Transformer
  Engine's fused mask-map permute, transformer_engine/pytorch/permutation.py; the flex
  dispatcher (DeepEP / HybridEP) fuses the global permute into its communication kernel but
  still permutes the received rows by local expert): each writes or reads the k rows, e*k*h,
  and reads or writes the token, e*h; their backward the same again: 4 x e*(k*h + h);
- the fused weighted SwiGLU (megatron/core/transformer/moe/experts.py TEGroupedMLP.forward
  bias_act_func, megatron/core/fusions/fused_bias_swiglu.py WeightedSwiGLUFunction): forward
  reads the fc1 output e*2f and writes e*f, backward reads the gradient e*f and the saved
  input e*2f and writes the input gradient e*2f: 8 x e*k*f;
- under fp8 the grouped GEMMs' casts (Transformer Engine GroupedLinear: one quantize kernel
  per GEMM input writing both layouts, fp8_casts.CAST_BYTES['transformer_engine'], 4 B per
  element): fc1's input k*h and fc2's input k*f in forward, fc2's output gradient k*h and
  fc1's output gradient k*2f in backward.
The alltoall dispatcher (`PlanInput.moe_dispatcher` 'alltoall') adds, the flex dispatcher
(DeepEP / HybridEP: the padding and the local permute fused into one kernel) does not:
- its chunk sorts by local expert when a rank holds more than one (token_dispatcher.py
  dispatch_postprocess / combine_preprocess, moe_utils.py sort_chunks_by_idxs, fused:
  permutation.py moe_sort_chunks_by_index): a read + write of the k rows before the experts
  and after them, and each one's backward: 4 x 2e*k*h;
- under fp8 the experts' padding of each expert's rows to the GEMM's alignment and the
  unpadding of the output (experts.py TEGroupedMLP.forward quantization_padding /
  quantization_unpadding, Transformer Engine module/fp8_padding.py Fp8Padding /
  Fp8Unpadding: a copy into a new buffer unless every expert's rows are aligned already,
  which routing makes rare): 4 x 2e*k*h with their backward.
A dispatcher not stated ('unstated') is charged neither (the kernels every dispatcher runs).
Full recompute re-runs the forward's share.

Ignores: the router's kernels (a (T, E) logits matrix), Transformer Engine's current-scaling
amax pass, the MXFP8 scale tensors (1/32 of an element), L2 hits on the k reads of one token,
the all-to-all buffers' own copies (the communication model's). Kernel launch gaps (host
boundedness) are not modelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scaletrain.config import expert_tp

from ..recipes.activations import megatron_moe_applies
from .fp8_casts import CAST_BYTES

if TYPE_CHECKING:
    from ..recipes.schema import Recipe
    from ..types import PlanInput

__all__ = ["MEGATRON_CORE_RECIPES", "moe_row_bytes_per_token", "moe_row_seconds_per_token"]

MEGATRON_CORE_RECIPES = ("megatron", "nemo")
"""Recipes whose MoE layers are Megatron-Core's (the module docstring's kernels)."""


def moe_row_bytes_per_token(plan: PlanInput, recipe: Recipe | None) -> float:
    """Bytes one MoE layer's routed-row kernels move per token of this rank's sequence
    (forward, backward, and the forward again under full recompute; module docstring); 0
    outside a Megatron-Core recipe's dropless top-k MoE layer and on a CPU. The routed rows
    of a token's layer run on the ranks its experts live on: balanced routing gives each rank
    as many rows as its own tokens route (k per token, x t_e when the expert tp group gathers
    them, `config.layout.expert_tp`; f split by t_e)."""
    if (
        recipe is None
        or recipe.name not in MEGATRON_CORE_RECIPES
        or plan.hardware.is_cpu
        or not megatron_moe_applies(plan, recipe)
    ):
        return 0.0
    m, L = plan.model, plan.layout
    e = plan.compute_bytes
    h, f, k = m.dim, m.ffn_dim, m.experts_per_token
    te = expert_tp(L.tp, L.ep)
    rows = k * te
    # permute + unpermute (each with its backward): e*(k*h + h) each of the four
    perm_fwd = 2.0 * e * (rows * h + h)
    perm_bwd = perm_fwd
    # fused weighted SwiGLU: forward 3 e*f per row, backward 5 e*f per row (f split by t_e)
    act_fwd = 3.0 * e * rows * f / te
    act_bwd = 5.0 * e * rows * f / te
    cast_fwd = cast_bwd = 0.0
    if plan.precision == "fp8" and recipe.te_fp8_gemm_inputs:
        c = CAST_BYTES["transformer_engine"]
        cast_fwd = c.activation * rows * (h + f / te)
        cast_bwd = c.gradient * rows * (h + 2.0 * f / te)
    fp8 = plan.precision == "fp8" and recipe.te_fp8_gemm_inputs
    if plan.moe_dispatcher == "alltoall":
        # its chunk sorts (a rank with > 1 local expert) and fp8 padding copies, each a read +
        # write of the k rows before and after the experts, as many in backward
        copies = (1 if m.num_experts // max(1, L.ep) > 1 else 0) + (1 if fp8 else 0)
        perm_fwd += copies * 2 * 2.0 * e * rows * h
        perm_bwd += copies * 2 * 2.0 * e * rows * h
    forward = perm_fwd + act_fwd + cast_fwd
    total = forward + perm_bwd + act_bwd + cast_bwd
    if plan.ac == "full":
        total += forward
    return total


def moe_row_seconds_per_token(plan: PlanInput, recipe: Recipe | None) -> float:
    """`moe_row_bytes_per_token` over the memory bandwidth (memory-bound kernels): seconds per
    token of one MoE layer; 0 with a user-set efficiency (which stands for the whole
    block)."""
    if plan.efficiency > 0:
        return 0.0
    return moe_row_bytes_per_token(plan, recipe) / plan.hardware.memory_bw
