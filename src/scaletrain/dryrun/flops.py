"""FLOPs of the dry-run's step: torch's `FlopCounterMode`, taught the CPU SDPA kernels."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["flop_counter"]


def _sdpa_cpu_flops(query_shape, key_shape, value_shape, *_, **__) -> int:  # noqa: ANN001
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *_, **__) -> int:  # noqa: ANN001
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _grouped_mm_flops(a_shape, b_shape, *_, out_shape=None, **__) -> int:  # noqa: ANN001
    """`torch._grouped_mm` (the MoE experts' grouped GEMMs, `models.moe`): 2 FLOPs per
    multiply-add of every group, i.e. 2 * out.numel() * K with K the contraction (a's last
    dim); when both operands are 2-D the groups split the contraction itself (the weight
    gradient: out (G, m, n), each group contracting its own rows), so 2 * m * n * K_total."""
    k = a_shape[-1]
    out = 1
    for d in out_shape:
        out *= d
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * (out // out_shape[0]) * k
    return 2 * out * k


def flop_counter() -> Any:
    """FlopCounterMode that also counts the CPU flash-attention kernels.

    torch's counter has formulas for the CUDA SDPA kernels only; the CPU ones (what a dry-run
    on this machine dispatches to) get the same formula: QK^T and AV over the *full* T x T
    matrix (2 x 2*B*nh*T*T*hd forward, 2x that backward), i.e. no causal halving. Counted are
    matmuls (mm, addmm, bmm, baddbmm, SDPA, and the experts' `_grouped_mm`, which torch's
    counter does not know) only, like the planner.
    """
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    mapping = {
        aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flops,
        aten._grouped_mm: _grouped_mm_flops,
    }
    return FlopCounterMode(display=False, custom_mapping=mapping)
