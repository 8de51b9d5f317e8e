"""scaletrain's Adafactor (trainer/adafactor.py): without a first moment it is torch's
Adafactor; with one (beta1) and with the absolute step it follows the formulas of Shazeer &
Stern 2018 as T5X keeps them, checked against a float64 reference written here from the
formulas, not from the implementation."""

from __future__ import annotations

import math

import pytest
import torch

from scaletrain.trainer.adafactor import Adafactor

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = [(7, 5), (9,), (2, 3, 4)]
"""A matrix, a vector (unfactored second moment) and a batch of matrices."""

RTOL = 1e-12
"""float64: the two computations differ by where scalars round (u = 1.1e-16) and by the
summation order of the means (n u for n <= 35 values), carried on relatively through the
rsqrt, the clip and a few steps: ~1e-14 of the distance moved. 1e-12 leaves 100x; a formula
difference (a missing clip, a mean over the wrong dim, bias correction) is O(1) of it."""


def _initial(gen: torch.Generator) -> list[torch.Tensor]:
    """The float64 starting values of SHAPES (then the same generator draws the gradients)."""
    return [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]


def _start() -> list[torch.Tensor]:
    return _initial(torch.Generator().manual_seed(0))


def _run(opt_cls, steps: int, **kw) -> list[torch.Tensor]:
    """`steps` steps of `opt_cls(**kw)` from `_start`, seeded gradients."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(x) for x in _initial(gen)]
    opt = opt_cls(params, **kw)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
        opt.step()
    return [p.detach() for p in params]


def _assert_close(got: list[torch.Tensor], ref: list[torch.Tensor]) -> None:
    for shape, g, r, x0 in zip(SHAPES, got, ref, _start(), strict=True):
        moved = float((r - x0).abs().max())
        assert moved > 0, shape
        worst = float((g - r).abs().max())
        assert worst <= RTOL * moved, (shape, worst, moved)


def test_without_first_moment_it_steps_as_torchs_adafactor():
    kw = {"lr": 0.05, "weight_decay": 0.1}
    got = _run(Adafactor, 5, beta1=0.0, **kw)
    ref = _run(torch.optim.Adafactor, 5, foreach=False, **kw)
    _assert_close(got, ref)


def _rms(x: torch.Tensor) -> float:
    return math.sqrt(float((x * x).mean()))


def _reference(
    steps: int, *, lr: float, beta1: float, wd: float, relative: bool
) -> list[torch.Tensor]:
    """Shazeer & Stern 2018 in float64, written from the paper's formulas: for an m x n
    gradient G at step t, R = EMA of mean_j G^2, C = EMA of mean_i G^2 with weight t^-0.8,
    V = R C^T / mean(R), U = G / sqrt(V), Û = U / max(1, RMS(U)); the step size
    alpha = max(1e-3, RMS(X)) min(lr, t^-0.5) (relative) or lr; X <- X (1 - lr wd);
    M = beta1 M + (1 - beta1) alpha Û (T5X's first moment, no bias correction); X <- X - M."""
    gen = torch.Generator().manual_seed(0)
    xs = _initial(gen)
    eps1 = torch.finfo(torch.float64).eps
    state = [{"m": torch.zeros_like(x), "r": None, "c": None, "v": torch.zeros_like(x)} for x in xs]
    for t in range(1, steps + 1):
        w = t**-0.8
        for i, x in enumerate(xs):
            g = torch.randn(x.shape, generator=gen, dtype=torch.float64)
            st = state[i]
            alpha = max(1e-3, _rms(x)) * min(lr, t**-0.5) if relative else lr
            x = x * (1 - lr * wd)
            if g.dim() == 1:
                st["v"] = (1 - w) * st["v"] + w * g**2
                v = st["v"]
            else:
                r_new, c_new = (g**2).mean(dim=-1), (g**2).mean(dim=-2)  # (.., m), (.., n)
                st["r"] = w * r_new if st["r"] is None else (1 - w) * st["r"] + w * r_new
                st["c"] = w * c_new if st["c"] is None else (1 - w) * st["c"] + w * c_new
                r, c = st["r"], st["c"]
                mean_r = r.mean(dim=-1).clamp(min=eps1)[..., None, None]
                v = r[..., :, None] * c[..., None, :] / mean_r  # (.., m, n)
            u = g / v.clamp(min=eps1**2).sqrt()
            u_hat = u / max(1.0, _rms(u))
            st["m"] = beta1 * st["m"] + (1 - beta1) * alpha * u_hat
            xs[i] = x - st["m"]
    return xs


@pytest.mark.parametrize("beta1", [0.0, 0.9])
@pytest.mark.parametrize("relative", [True, False])
def test_steps_follow_the_formulas(beta1, relative):
    lr = 0.05 if relative else 3e-3
    kw = {"lr": lr, "weight_decay": 0.1}
    got = _run(Adafactor, 3, beta1=beta1, relative_step=relative, **kw)
    _assert_close(got, _reference(3, beta1=beta1, wd=0.1, lr=lr, relative=relative))


def test_the_first_moment_changes_the_update_as_the_ema_says():
    """Step 1 with beta1 moves (1 - beta1) of the step without it (M_0 = 0); by step 3 the two
    trajectories part by far more than the formulas' tolerance."""
    kw = {"lr": 0.05, "weight_decay": 0.0}
    x0 = _start()
    plain, momentum = _run(Adafactor, 1, beta1=0.0, **kw), _run(Adafactor, 1, beta1=0.9, **kw)
    for a, b, x in zip(plain, momentum, x0, strict=True):
        torch.testing.assert_close(b - x, 0.1 * (a - x), rtol=1e-12, atol=0)
    plain, momentum = _run(Adafactor, 3, beta1=0.0, **kw), _run(Adafactor, 3, beta1=0.9, **kw)
    for a, b, x in zip(plain, momentum, x0, strict=True):
        assert float((a - b).abs().max()) > 1e-3 * float((a - x).abs().max())


def test_the_first_moment_is_one_parameter_sized_state():
    params = [torch.nn.Parameter(torch.randn(s, dtype=torch.float32)) for s in SHAPES]
    for beta1, expected in ((0.0, {"step", "row_var", "col_var", "variance"}), (0.9, None)):
        opt = Adafactor(params, beta1=beta1)
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
        keys = {k for st in opt.state.values() for k in st}
        if expected is not None:
            assert keys == expected
            continue
        for p in params:
            m = opt.state[p]["exp_avg"]
            assert m.shape == p.shape and m.dtype == p.dtype


@pytest.mark.parametrize(
    "kw", [{"beta1": 1.0}, {"beta1": -0.1}, {"lr": -1.0}, {"d": 0.5}, {"beta2_decay": 0.1}]
)
def test_bad_arguments_are_refused(kw):
    with pytest.raises(ValueError):
        Adafactor([torch.nn.Parameter(torch.ones(2, 2))], **kw)
