"""Comparing parameters after AdamW steps taken in two summation orders (see the callers)."""

from __future__ import annotations

import math

import torch


def assert_adam_close(got: torch.Tensor, ref: torch.Tensor, *, lr: float, steps: int,
                      where: str = "") -> None:
    """Element-wise within AdamW's own bound (|step| <= lr: 2 lr apart per step); norm-wise
    within 1e-5 (~100 fp32 roundings deep) of the tensor's scale: its norm plus how far AdamW
    can move it (lr x steps x sqrt(n))."""
    diff = got.double() - ref.double()
    worst = float(diff.abs().max())
    assert worst <= 2 * lr * steps, f"{where}: element off by {worst:.3g} > 2 lr x steps"
    scale = float(ref.double().norm()) + lr * steps * math.sqrt(ref.numel())
    rel = float(diff.norm()) / scale
    assert rel <= 1e-5, f"{where}: norm-wise error {rel:.3g} of the tensor's scale > 1e-5"
