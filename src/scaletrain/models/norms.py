"""RMSNorm (Zhang & Sennrich 2019), normalized in fp32 like HF Llama, keeping for backward only
what backward needs.

fp32 input: `weight * F.rms_norm(x)` as before, autograd's own backward (it saves x, the
per-token rstd and the normalized output for the weight's gradient; x is the input itself, so
nothing is copied).

16-bit input (bf16/fp16: FSDP2's mixed-precision parameters, a bf16 residual stream): autograd
through `F.rms_norm(x.float())` would save the fp32 upcast of x (4 bytes per element) and the
16-bit normalized output `weight * normed` reads (2 more), neither of which backward needs:
the 16-bit x holds the values exactly. `_RMSNorm16` saves x and the fp32 rstd (tokens x 1)
and recomputes the fp32 normalized value in backward: 2 + 4/h bytes per element instead of
6 + 4/h (benchmarks/results/activation_ledger.md, finding F2).

Forward rounds as before (fp32 normalize, cast to x's dtype, times the weight). Backward runs
in fp32 and rounds once per gradient: dx = rstd * (g - n * mean(g * n)) with g = dy * weight
and n = x * rstd (the derivative of x * rsqrt(mean(x^2) + eps)), dweight = sum over tokens of
dy * n (n in fp32; the forward multiplied n rounded to x's dtype, a difference within that
rounding). It works in place in its own fp32 temporaries (at most three tokens x h alive):
on one CPU thread a bf16 (4, 512, 1024) norm's forward + backward took 0.73x the time of
autograd through `F.rms_norm(x.float())` (median of 5 alternated pairs, a loaded host).

Only elementwise ops and reductions over the last dim: it runs wherever they run — CPU and
CUDA, autocast (no matmul inside), fake tensors, checkpointing (the forward is re-run), and
DTensors: sequence-parallel norms get a Shard(1) input and a Replicate weight, and the weight's
gradient sums over the sharded tokens into a Partial, as `weight * normed`'s backward does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..numerics import upcast

__all__ = ["RMSNorm", "rms_norm16"]

_HALF = (torch.bfloat16, torch.float16)


class _RMSNorm16(torch.autograd.Function):
    """weight * rms_norm(x.float()).to(x.dtype), saving x (16-bit) and rstd (fp32) only.
    plus_one (Gemma): (rms_norm(x.float()) * (1 + weight.float())).to(x.dtype), the scale
    applied in fp32 before the cast as HF's Gemma2RMSNorm does."""

    @staticmethod
    def forward(
        ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, plus_one: bool = False
    ) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1) fp32
        ctx.save_for_backward(x, weight, rstd)
        ctx.plus_one = plus_one
        if plus_one:
            return (xf.mul_(rstd) * (1.0 + weight.float())).to(x.dtype)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        normed = x.float().mul_(rstd)  # fp32, recomputed (x is 16-bit: a new tensor)
        gf = grad.float()  # grad itself when fp32 (an fp32 weight): not written to
        gx = gw = None
        if ctx.needs_input_grad[1]:
            lead = tuple(range(grad.dim() - 1))
            gw = (gf * normed).sum(dim=lead).to(weight.dtype)
        if ctx.needs_input_grad[0]:
            g = gf * (1.0 + weight.float() if ctx.plus_one else weight.float())
            del gf  # three fp32 (tokens x h) alive at most: normed, g and one product
            dot = (g * normed).mean(-1, keepdim=True)
            gx = g.sub_(normed.mul_(dot)).mul_(rstd).to(x.dtype)
        return gx, gw, None, None


def rms_norm16(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, plus_one: bool = False
) -> torch.Tensor:
    """`weight * F.rms_norm(x.float(), eps).to(x.dtype)`: for 16-bit x the memory-lean
    autograd.Function (module docstring), for any other dtype this very expression (fp32: the
    casts are no-ops, autograd's backward, the default job's path unchanged). plus_one: the
    scale is 1 + weight (Gemma), applied in fp32."""
    if x.dtype in _HALF:
        return _RMSNorm16.apply(x, weight, eps, plus_one)
    scale = 1.0 + weight if plus_one else weight
    return scale * F.rms_norm(upcast(x), (x.shape[-1],), eps=eps).to(x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), normalized in fp32 like HF Llama; a
    16-bit input is saved as is, with an fp32 rstd per token (`rms_norm16`).

    `plus_one` (Gemma): the stored weight w is an offset, the scale is 1 + w (w initialized
    to 0, `models.init`), applied in fp32 before the cast back as HF's `Gemma2RMSNorm`."""

    def __init__(self, dim: int, eps: float, *, plus_one: bool = False) -> None:
        super().__init__()
        self.eps, self.plus_one = eps, plus_one
        self.weight = nn.Parameter(torch.zeros(dim) if plus_one else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm16(x, self.weight, self.eps, plus_one=self.plus_one)
