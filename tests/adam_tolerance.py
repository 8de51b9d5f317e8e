"""Comparing parameters after AdamW steps taken in two summation orders.

Another layout (or accumulation) sums the same terms in another order, so each gradient element
differs by rounding. AdamW's normalized step m / (sqrt(v) + eps) passes a gradient element's
rounding on amplified where the element is near eps: its slope d(step)/dg is at most lr / eps
(at g = 0), 1e5 at lr 1e-3, eps 1e-8. In fp32 a cancelling element's rounding (3e-9 of a 4e-8
gradient, seen on the cp2-llama row) then moves a parameter by ~1e-5, and whether one element of
16,384 lands just over or under a 1e-5 bound depends on which kernels the CPU picked (an Intel
AMX host failed 9 such rows): the fp32 verdict is the CPU's luck, not the code's.

So the parity runs are float64 end to end (`float64_default`; every "at least fp32" op in the
model keeps float64: `scaletrain.numerics.upcast`) and are held to a bound the arithmetic gives:

- a gradient element's rounding error in float64 is at most ~n u |g|max with u = 1.1e-16 and n
  the depth of its sums (tokens x width: <= 1e4 here), |g|max <= 1 (clipped at 0.5): 1e-12;
- AdamW turns that into at most lr / eps x 1e-12 = 1e-7 per step in the worst case (an element
  at g ~ 0), and lr (the step's own size) times the relative error (1e-12) elsewhere.

`FLOAT64_PARAM_ATOL` = 1e-6 covers STEPS = 5 worst-case steps 2x over; a real bug (a missing
all-reduce, a wrong scale, a shard in the wrong place) moves parameters by ~lr = 1e-3 within one
step, 1,000x over it. Measured on the parity matrix (AMD EPYC, torch 2.13, 1 thread per rank):
see tests/distributed/test_parity_matrix.py's docstring.

`assert_adam_close` stays for the fp32 trainer tests (the CLI's precision is fp32 at least):
AdamW's own element-wise bound, |step| <= lr, which holds in any rounding.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

FLOAT64_PARAM_ATOL = 1e-6
"""Largest parameter difference after the parity tests' AdamW steps in float64 (derivation in
the module docstring)."""

FLOAT64_RTOL = 1e-10
"""Losses and gradient norms in float64: ~n u = 1e-12 relative at most, with 100x headroom."""


@contextlib.contextmanager
def float64_default() -> Iterator[None]:
    """Modules, initial values and RoPE tables built inside are float64 (the default dtype)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def zero_true_gradient(name: str) -> bool:
    """Parameters whose exact gradient is 0: a key bias adds q.b to every score of a query's
    row, and softmax ignores a constant added to a row. Their computed gradient is rounding
    noise, which AdamW's normalized step turns into ~lr-sized random moves in fp32 (a noise
    above eps), different in every summation order: only the element-wise bound applies to
    them there. In float64 the noise (~1e-19) is far below eps and the moves vanish."""
    return name.endswith("attention.wk.bias")


def assert_float64_close(got: torch.Tensor, ref: torch.Tensor, *, where: str = "") -> None:
    """Every element within FLOAT64_PARAM_ATOL (module docstring); both must be float64."""
    assert got.dtype == ref.dtype == torch.float64, f"{where}: {got.dtype} / {ref.dtype}"
    worst = float((got.detach() - ref.detach()).abs().max())
    assert worst <= FLOAT64_PARAM_ATOL, f"{where}: element off by {worst:.3g} > 1e-6 (float64)"


def assert_adam_close(
    got: torch.Tensor, ref: torch.Tensor, *, lr: float, steps: int, where: str = ""
) -> None:
    """fp32: element-wise within AdamW's own bound (|step| <= lr: 2 lr apart per step);
    norm-wise within 1e-5 of the tensor's scale (its norm plus how far AdamW can move it,
    lr x steps x sqrt(n)), unless `where` names a parameter whose exact gradient is 0."""
    diff = got.detach().double() - ref.detach().double()
    worst = float(diff.abs().max())
    assert worst <= 2 * lr * steps, f"{where}: element off by {worst:.3g} > 2 lr x steps"
    if zero_true_gradient(where):
        return
    scale = float(ref.detach().double().norm()) + lr * steps * math.sqrt(ref.numel())
    rel = float(diff.norm()) / scale
    assert rel <= 1e-5, f"{where}: norm-wise error {rel:.3g} of the tensor's scale > 1e-5"
