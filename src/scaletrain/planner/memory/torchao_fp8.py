"""torchao's fp8 Linears (`PlanInput.fp8_backend == 'torchao'`): what a block's backward holds
inside a converted Linear beyond the saved set and the output gradient.

The trainer converts with `torchao.float8.convert_to_float8_training` and torchao's default
`Float8LinearConfig` (tensorwise scaling, dynamic (current) amax, `_scaled_mm`; no FSDP fp8
all-gather: precision/fp8_apply.py). Source: torchao 0.18.0, float8/float8_linear.py
`matmul_with_hp_or_float8_args`, float8/float8_training_tensor.py `_ToFloat8ConstrFunc`,
float8/float8_utils.py `to_fp8_saturated`, float8/float8_ops.py (`_scaled_mm`'s operand
layouts). Saved for backward: the Linear's 16-bit input and a view of its weight, not fp8
copies (`PlanInput.saved_precision`: the activation terms count a bf16 Linear's saved set).

One eager cast of a 16-bit tensor of n elements (`_ToFloat8ConstrFunc.forward`:
`tensor.to(float32) * scale`, then `to_fp8_saturated`: `clamp`, `.to(float8)`) holds the
scaled fp32 product, the clamped fp32 copy and the fp8 result at once: 9 B per element
(`TORCHAO_EAGER_CAST_BYTES`; the fp32 upcast and the product, 8 B, come before, and |x|'s
16 bits for the amax before that). The backward of a Linear with output gradient G (M x N)
and saved input x (M x K) casts G twice (once per GEMM layout, `cast_config_grad_output` and
`..._for_grad_weight`), the weight, then x, and keeps each fp8 result to the end:
- casting G the second time: G's first fp8 (1 B), the cast (9 B) and the input gradient
  already computed (2 B x M x K): 10 M N + 2 M K;
- casting x: G's two fp8 copies (2 B), the input gradient (2 B) and the cast (9 B):
  2 M N + 11 M K.
Under ZeRO-2/3 with `precision.fp8_all_gather`, torchao's own fp8 all-gather
(`Float8LinearConfig.enable_fsdp_float8_all_gather`, float8/fsdp_utils.py
`WeightWithDynamicFloat8CastTensor`) gathers the converted weights as float8 and hands the
Linear a `Float8TrainingTensor`: the unsharded weights are 1 B (`PlanInput.gathers_fp8`,
`states._in_flight`, `rank_terms.rank_states`' unit bytes); the all-gather's input shard is
still counted at 16 bits (`buffers.fsdp_all_gather`, 1/zero_shards of a unit: ignored).
Measured (MemTracker on CPU tensors, torchao 0.18 / torch 2.13, one bf16 Float8Linear,
M = 4096): (K, N) = (256, 1024): 10,816 B per token beyond G, against 10N + 2K = 10,752;
(1024, 256): 11,840 against 2N + 11K = 11,776 (the 64 B: the weight's casts, N K / M).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scaletrain.planner.types import PlanInput

__all__ = ["TORCHAO_EAGER_CAST_BYTES", "torchao_cast_bytes", "torchao_linear_backward_bytes"]

TORCHAO_EAGER_CAST_BYTES = 9.0
"""Bytes per element one eager torchao cast of a 16-bit tensor holds at its end: the scaled
fp32 product (4), its clamped fp32 copy (4) and the fp8 result (1) (module docstring)."""


def torchao_linear_backward_bytes(n_out: float, k_in: float, *, compile: bool) -> float:
    """Bytes per token that one torchao Float8Linear's backward holds beyond its output
    gradient (n_out wide) and its saved input (k_in wide), at its largest.

    Eager: max(10 N + 2 K, 2 N + 11 K) (the module docstring's two moments). Compiled
    (`torch.compile`: inductor fuses the amax, scaling, clamp and cast into kernels that
    write fp8, no fp32 copy): G's two fp8 copies, x's fp8, the input gradient and the two
    contiguous copies `_scaled_mm` reads for the weight gradient (G^T row-major, x column-
    major, float8_ops.py `preprocess_addmm`): 3 N + 4 K. From the code, not measured (no GPU
    run of a compiled fp8 step yet). Ignores the weight's casts (N K elements per Linear,
    not per token)."""
    if compile:
        return 3.0 * n_out + 4.0 * k_in
    c = TORCHAO_EAGER_CAST_BYTES
    return max((c + 1.0) * n_out + 2.0 * k_in, 2.0 * n_out + (c + 2.0) * k_in)


def torchao_cast_bytes(plan: PlanInput) -> float:
    """torchao's fp8 temporaries inside a block's backward (bytes, one rank): the
    `fp8_quantize` buffer term for `fp8_backend='torchao'`, counted at the moment
    `rank_moments` places ours (the MLP backward's start, beside the block output's gradient
    and its SP-gathered copy), tok = s_l*b, t = tp.

    Counts the row-parallel Linears (w2: x = (tok, f/t), wo: x = (tok, q/t)), whose output
    gradient is the whole (tok, h) (all-gathered under SP) and whose backward comes first in
    their half of the block: `torchao_linear_backward_bytes(h, K)`, the larger of the two.
    Under full AC also the recompute's end, w2's input cast in forward (9 B x tok x f/t; x and
    p are in the recompute's saved set, 16-bit, counted there), where larger.
    Measured (dry-run, torchao on a GPU target; planner vs dry-run): dim-256 llama dp2 ZeRO-3
    tp1 b4 s512 (f 896): peak inside w2's backward casting its input, 2h + 11f per token
    (-12.8% with our cast's 5 x tok x f); tp4+SP full AC (-9.7%); Llama-3-70B TP8+SP full AC
    at 4 blocks (-21.0%): benchmarks/results/planner_accuracy_torchao.md.
    Ignores: the column-parallel Linears' backward (w1/w3, q/k/v: x is (tok, h) there, 2N + 13K
    with a sibling's input gradient held, but the MLP's intermediates and w2's saved input are
    freed by then), the forward's casts (9 B x its input, below the backward's at these
    moments), the weights' casts, MoE experts (ours, `fp8_quantize_bytes`).
    """
    L, model = plan.layout, plan.model
    tok = plan.seq_len / L.cp * plan.micro_batch  # s_l * b of one micro-batch
    h, f, q = model.dim, model.ffn_dim / L.tp, model.q_dim / L.tp
    per_token = max(torchao_linear_backward_bytes(h, k, compile=plan.compile) for k in (f, q))
    if plan.ac == "full" and not plan.compile:
        per_token = max(per_token, TORCHAO_EAGER_CAST_BYTES * f)
    return tok * per_token
