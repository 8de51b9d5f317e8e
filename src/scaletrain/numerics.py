"""The one rule for "compute this in at least fp32": `acc_dtype` / `upcast`.

Reductions whose rounding matters (softmax, norms, RoPE, the loss, ring-attention merges, the
gradient norm) run in fp32 when the tensors are 16-bit or fp32, and stay in float64 when they
are float64: `torch.promote_types(dtype, float32)`. A bare `.float()` would round a float64 run
back to fp32 at every such op, and the float64 parity tests (tests/distributed) would then
compare fp32 roundings again.
"""

from __future__ import annotations

import torch

__all__ = ["acc_dtype", "upcast"]


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for 16-bit and fp32 dtypes, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """`x` in `acc_dtype(x.dtype)`: `x.float()` except that float64 stays float64 (integer
    and bool tensors become fp32, as `.float()` makes them)."""
    if not x.is_floating_point():
        return x.float()
    return x.to(acc_dtype(x.dtype))
