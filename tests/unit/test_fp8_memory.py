"""What a Float8Linear keeps from forward to backward — the bytes the planner's fp8 recipe must
model (see the module docstring of scaletrain.precision.fp8): the fp8 input and its scales, a
reference to the weight Parameter and its scale; never an fp8 (or bf16) copy of the weight."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from scaletrain.precision import E4M3, E5M2, Float8Linear, quantize

TILE = 128


def _saved(mod: nn.Module, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = mod(x)
    return saved, y


@pytest.mark.parametrize("scaling", ["tensorwise", "tilewise"])
@pytest.mark.parametrize("m,n,k", [(48, 192, 256), (40, 64, 96)])  # 96, 64: padded tiles
def test_saved_bytes_are_the_fp8_input_and_scales(scaling: str, m: int, n: int, k: int) -> None:
    torch.manual_seed(0)
    lin = Float8Linear(k, n, bias=False, scaling=scaling)
    x = torch.randn(m, k, requires_grad=True)
    saved, y = _saved(lin, x)
    weights = [t for t in saved if t is lin.weight]
    others = [t for t in saved if t is not lin.weight]
    assert len(weights) == 1  # the Parameter itself: no bytes of its own
    kp, np_ = TILE * math.ceil(k / TILE), TILE * math.ceil(n / TILE)
    if scaling == "tensorwise":
        want = m * k + 4 + 4  # fp8 x, its 0-dim scale, W's 0-dim scale
    else:  # fp8 x and 1x128 scales (K padded to 128), 128x128 weight-block scales
        want = m * kp + 4 * m * kp // TILE + 4 * (np_ // TILE) * (kp // TILE)
    assert sum(t.numel() * t.element_size() for t in others) == want
    assert all(t.dtype in (torch.float8_e4m3fn, torch.float32) for t in others)
    assert not any(t.numel() >= n * k and t.dtype != torch.float8_e4m3fn for t in others)
    assert not any(
        t.dtype == torch.float8_e4m3fn and t.shape[0] in (n, np_) and t.shape[0] != m
        for t in others
    )  # no fp8 weight copy

    # Re-quantizing W in backward gives the forward's fp8 weight: backward is exactly the one
    # computed from the dequantized fp8 operands.
    y.backward(torch.ones_like(y))
    assert torch.isfinite(lin.weight.grad).all() and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("amax", ["current", "delayed"])
def test_dgrad_uses_the_forwards_fp8_weight_exactly(amax: str) -> None:
    # dx = dy_q W_q with W_q re-quantized in backward: bit-identical to a _scaled_mm on the
    # forward's W_q, also under delayed scaling, whose history has moved on by then.
    torch.manual_seed(0)
    lin = Float8Linear(256, 128, bias=False, amax=amax, history_len=2)
    lin(torch.randn(32, 256)).sum().backward()  # step 1 fills the histories
    with torch.no_grad():
        lin.weight.mul_(3)  # step 2's W amax is 3x the recorded one: delayed scales saturate
    x = torch.randn(32, 256, requires_grad=True)
    dy = torch.randn(32, 128)
    w = lin.weight.detach()
    w_amax = lin.fp8_state.w.history.amax() if amax == "delayed" else w.abs().amax()
    dy_amax = lin.fp8_state.dy.history.amax() if amax == "delayed" else dy.abs().amax()
    wq, sw = quantize(w, E4M3, amax=w_amax)
    dyq, sdy = quantize(dy, E5M2, amax=dy_amax)
    lin(x).backward(dy)
    want = torch._scaled_mm(
        dyq, wq.t().contiguous().t(), scale_a=sdy, scale_b=sw, out_dtype=torch.float32
    )
    assert torch.equal(x.grad, want)
