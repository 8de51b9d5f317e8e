"""Comparing parameters after AdamW steps taken in two summation orders.

Another layout (or accumulation) sums the same terms in another order, so each gradient element
differs by fp32 rounding. Norm-wise that is tiny: 1e-5 relative is ~100 roundings (u = 6e-8)
deep. Element-wise it is not bounded that way: where an element's gradient is a cancellation
(terms of 1e-3 summing to ~1e-9), its rounding error is a large part of it, and Adam's
normalized step m / sqrt(v) passes that on whole (seen: 1.6e-5 on one of 16,384 elements at
lr 1e-3, the cp2-llama parity row). What bounds every element is AdamW itself: bias-corrected
|m| / sqrt(v) <= 1 (beta1^2 <= beta2), so two runs move an element apart by at most 2 lr per
step.
"""

from __future__ import annotations

import math

import torch


def zero_true_gradient(name: str) -> bool:
    """Parameters whose exact gradient is 0: a key bias adds q.b to every score of a query's
    row, and softmax ignores a constant added to a row. Their computed gradient is rounding
    noise, which AdamW's normalized step turns into ~lr-sized random moves, different in every
    summation order: only the element-wise bound applies to them."""
    return name.endswith("attention.wk.bias")


def assert_adam_close(
    got: torch.Tensor, ref: torch.Tensor, *, lr: float, steps: int, where: str = ""
) -> None:
    """Element-wise within AdamW's own bound (|step| <= lr: 2 lr apart per step); norm-wise
    within 1e-5 (~100 fp32 roundings deep) of the tensor's scale: its norm plus how far AdamW
    can move it (lr x steps x sqrt(n)), unless `where` names a parameter whose exact gradient
    is 0 (`zero_true_gradient`)."""
    diff = got.detach().double() - ref.detach().double()
    worst = float(diff.abs().max())
    assert worst <= 2 * lr * steps, f"{where}: element off by {worst:.3g} > 2 lr x steps"
    if zero_true_gradient(where):
        return
    scale = float(ref.detach().double().norm()) + lr * steps * math.sqrt(ref.numel())
    rel = float(diff.norm()) / scale
    assert rel <= 1e-5, f"{where}: norm-wise error {rel:.3g} of the tensor's scale > 1e-5"
