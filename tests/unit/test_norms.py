"""RMSNorm (models/norms.py) against a float64 reference, and what it keeps for backward.

Tolerances come from the arithmetic (u = unit roundoff: fp32 2^-24, bf16 2^-8, fp16 2^-11;
h = width, N = tokens). The reference is float64 autograd through w * x * rsqrt(mean(x^2) +
eps) from the very same (rounded) x, w and dy.
- output, elementwise: the fp32 rstd is off by at most (h/2 + 4) u32 relative (the mean of h
  squares, gamma_h, halved by the square root; the add of eps and rsqrt a few ulps), and two
  roundings to the output dtype follow (x * rstd, then times w): |dy| <= ((h/2 + 4) u32 +
  2 u_out) |y|. No cancellation: every step is a product.
- input gradient: dx = rstd (g - n mean(g n)), g = dy w, n = x rstd, cancels, so the bound is
  on the terms' magnitudes: (h + 10) u32 rstd (|g| + 2 |n| mean|g n|) (gamma_h for the
  mean of squares and again for the dot, a dozen single roundings) plus one rounding to x's
  dtype u_out |dx|.
- weight gradient: the sum over N tokens of dy n, n in fp32: (N + h/2 + 6) u32 sum|dy n| +
  u_w |dw| (gamma_N of the sum, n's own error, the final rounding to the weight's dtype).
These are worst cases, so they hold at any thread count.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from scaletrain.config import model_preset
from scaletrain.models import build_model, clean_fqn
from scaletrain.models.norms import RMSNorm
from scaletrain.parallel.ac import apply_ac

EPS = 1e-5
U32 = 2.0**-24
UNIT = {torch.float32: U32, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _case(x_dtype: torch.dtype, w_dtype: torch.dtype, shape=(2, 8, 256), seed=0):
    g = torch.Generator().manual_seed(seed)
    # a spread of token scales (0.03 .. 30): rstd varies over three decades
    scale = torch.logspace(-1.5, 1.5, shape[0] * shape[1]).reshape(*shape[:-1], 1)
    x = (torch.randn(shape, generator=g) * scale).to(x_dtype)
    w = (1 + 0.5 * torch.randn(shape[-1], generator=g)).to(w_dtype)
    dy = torch.randn(shape, generator=g)
    return x, w, dy


def _reference(x, w, dy):
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    y = w64 * (x64 * rstd)
    y.backward(dy.double())
    return y.detach(), x64.grad, w64.grad, rstd.detach()


def _run(x, w, dy):
    norm = RMSNorm(x.shape[-1], EPS).to(w.dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
    xr = x.clone().requires_grad_()
    y = norm(xr)
    y.backward(dy.to(y.dtype))
    return y.detach(), xr.grad, norm.weight.grad


@pytest.mark.parametrize(
    "x_dtype,w_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.float32),  # a 16-bit stream over fp32 weights
    ],
    ids=["fp32", "bf16", "fp16", "bf16-x-fp32-w"],
)
def test_rmsnorm_matches_float64_within_rounding(x_dtype, w_dtype):
    x, w, dy = _case(x_dtype, w_dtype)
    h, n_tok = x.shape[-1], x[..., 0].numel()
    y, gx, gw = _run(x, w, dy)
    out_dtype = torch.promote_types(x_dtype, w_dtype)
    assert y.dtype == out_dtype and gx.dtype == x_dtype and gw.dtype == w_dtype
    dy = dy.to(out_dtype)  # what backward was given
    y64, gx64, gw64, rstd = _reference(x, w, dy)
    u_out, u_x, u_w = UNIT[out_dtype], UNIT[x_dtype], UNIT[w_dtype]
    # forward: two roundings to x's dtype (n16, then w * n16; one when w is wider) after fp32
    rounds = 1 if w_dtype != x_dtype else 2
    bound_y = ((h / 2 + 4) * U32 + rounds * UNIT[x_dtype] + u_out) * y64.abs()
    assert ((y.double() - y64).abs() <= bound_y).all()
    n = x.double() * rstd
    g = dy.double() * w.double()
    mean_gn = (g * n).abs().mean(-1, keepdim=True)
    bound_x = (h + 10) * U32 * rstd * (g.abs() + 2 * n.abs() * mean_gn) + u_x * gx64.abs()
    assert ((gx.double() - gx64).abs() <= bound_x).all()
    lead = tuple(range(x.dim() - 1))
    sum_dyn = (dy.double() * n).abs().sum(lead)
    bound_w = (n_tok + h / 2 + 6) * U32 * sum_dyn + u_w * gw64.abs()
    assert ((gw.double() - gw64).abs() <= bound_w).all()
    # the bounds are not loose: a 16-bit run's worst element uses a good part of them
    if x_dtype != torch.float32:
        assert ((y.double() - y64).abs() / bound_y).max() > 0.25
        assert ((gx.double() - gx64).abs() / bound_x).max() > 0.25
    if w_dtype != torch.float32:  # fp32 sums stay far inside their worst case gamma_N
        assert ((gw.double() - gw64).abs() / bound_w).max() > 0.25


def test_16bit_forward_rounds_as_before():
    """The forward is the old expression op for op (CPU: rms_norm's composite decomposition),
    so a bf16 model's outputs do not move."""
    x, w, _ = _case(torch.bfloat16, torch.bfloat16)
    old = w * F.rms_norm(x.float(), (x.shape[-1],), eps=EPS).to(x.dtype)
    norm = RMSNorm(x.shape[-1], EPS).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(w)
        assert torch.equal(norm(x), old)


def _saved(norm: torch.nn.Module, x: torch.Tensor) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    params = {p.untyped_storage().data_ptr() for p in norm.parameters()}
    saved: list[tuple[torch.dtype, tuple[int, ...]]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            saved.append((t.dtype, tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        norm(x)
    return saved


def test_16bit_input_saves_itself_and_fp32_rstd_only():
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    norm = RMSNorm(64, EPS).to(torch.bfloat16)
    assert sorted(_saved(norm, x), key=str) == [
        (torch.bfloat16, (2, 8, 64)),  # x itself: 2 B per element, no fp32 upcast
        (torch.float32, (2, 8, 1)),  # rstd per token
    ]
    # fp32: autograd's own backward, unchanged (x, rstd, and the normalized output)
    xf = x.detach().float().requires_grad_()
    saved = _saved(RMSNorm(64, EPS), xf)
    assert (torch.float32, (2, 8, 64)) in saved and (torch.float32, (2, 8, 1)) in saved


def test_fake_tensors_and_autocast():
    with FakeTensorMode():
        norm = RMSNorm(4096, EPS)
        norm.weight = torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
        x = torch.empty(2, 1024, 4096, dtype=torch.bfloat16, requires_grad=True)
        y = norm(x)
        y.sum().backward()
        assert y.dtype == torch.bfloat16 and x.grad is not None and x.grad.shape == x.shape
    # autocast has nothing to cast inside (no matmul): same result as without it
    x, w, dy = _case(torch.bfloat16, torch.bfloat16, shape=(2, 4, 32))
    ref = _run(x, w, dy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _run(x, w, dy)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


def _bf16_grads(mode: str) -> dict[str, torch.Tensor]:
    cfg = model_preset("tiny-llama", vocab_size=61, dim=32, ffn_dim=48, max_seq_len=32)
    model = build_model(cfg, device="cpu", seed=3).to(torch.bfloat16)
    apply_ac(model, mode)
    tokens = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(1))
    model(tokens, targets=tokens).backward()
    return {clean_fqn(n): p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_bf16_model_checkpointing_recomputes_the_same_gradients(mode):
    """The norm's forward re-runs under the selective policy and full AC: bit-identical."""
    ref, got = _bf16_grads("none"), _bf16_grads(mode)
    assert got.keys() == ref.keys()
    for name in ref:
        assert torch.equal(got[name], ref[name]), name
