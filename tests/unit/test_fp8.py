"""fp8 linears: numerics against fp32, tile-wise vs per-tensor scaling, delayed scaling state,
model conversion, and a tiny model that trains in fp8.

Tolerances (relative Frobenius error vs the fp32 product, random normal data). Round-to-nearest
with m mantissa bits leaves a relative error uniform within ±2^-(m+1) of the binade's leading
power of two, RMS ≈ 2^-(m+1)/sqrt(3) · E[2^e/|v|] ≈ 2.6% for E4M3 (m=3) and 5.2% for E5M2
(m=2) on normal data. Independent errors of two operands add in quadrature through a dot
product: forward (E4M3 x E4M3) ≈ sqrt(2)·2.6% ≈ 3.7%, dgrad/wgrad (E5M2 x E4M3) ≈
sqrt(5.2² + 2.6²) ≈ 5.8% — what is measured. Bounds: 5% forward, 8% backward; a floor of 0.5%
proves the float8 path really ran (an fp32 fallback would be ~1e-7).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scaletrain.config import PrecisionConfig, resolve_model
from scaletrain.models import build_model, causal_lm_loss
from scaletrain.models.moe import GroupedExperts
from scaletrain.precision import (
    E4M3,
    Float8ExpertLinear,
    Float8Linear,
    apply_fp8,
    dequantize,
    maybe_apply_fp8,
    quantize,
)

pytestmark = pytest.mark.usefixtures("one_thread")


RECIPES = [("tensorwise", "current"), ("tensorwise", "delayed"), ("tilewise", "current")]


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("scaling,amax", RECIPES)
@pytest.mark.parametrize("shape", [(4, 40, 256), (3, 7, 64)])  # 64: tiles padded to 128
def test_fp8_linear_matches_fp32(scaling: str, amax: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    k, n = shape[-1], 192
    ref = nn.Linear(k, n)
    lin = Float8Linear.from_linear(ref, scaling=scaling, amax=amax)
    assert lin.weight is ref.weight and lin.bias is ref.bias
    x = torch.randn(*shape, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    dy = torch.randn(*shape[:-1], n)

    y = lin(x)
    y.backward(dy)
    dx, dw = x.grad, ref.weight.grad.clone()
    ref.weight.grad = None
    y_ref = F.linear(x_ref, ref.weight, ref.bias)
    y_ref.backward(dy)

    assert y.shape == y_ref.shape and y.dtype == torch.float32
    assert 0.005 < _rel(y, y_ref) < 0.05
    assert 0.005 < _rel(dx, x_ref.grad) < 0.08
    assert 0.005 < _rel(dw, ref.weight.grad) < 0.08
    assert dw.dtype == torch.float32


def test_fp8_linear_under_bf16_autocast() -> None:
    torch.manual_seed(0)
    lin = Float8Linear(64, 32, bias=False)
    x = torch.randn(2, 8, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    assert y.dtype == torch.bfloat16
    y.float().square().sum().backward()
    assert lin.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    assert _rel(y, F.linear(x, lin.weight)) < 0.05


def test_tilewise_beats_tensorwise_on_outliers() -> None:
    # A few outlier tokens (rows ×1e4, the massive activations of LLMs): one per-tensor scale
    # set by them pushes ordinary values into E4M3's subnormals; 1x128 tiles give each token
    # its own scale. Likewise one hot 128x128 block of a weight.
    torch.manual_seed(0)
    x = torch.randn(256, 256)
    x[:4] *= 1e4
    per_tensor = dequantize(*quantize(x, E4M3))
    tiled = dequantize(*quantize(x, E4M3, (1, 128)), (1, 128))
    normal = slice(4, None)
    err_tensor, err_tile = _rel(per_tensor[normal], x[normal]), _rel(tiled[normal], x[normal])
    assert err_tile < 0.05 < err_tensor
    assert _rel(tiled, x) <= _rel(per_tensor, x)

    # Through a Float8Linear, on the tokens that are not outliers.
    ref = nn.Linear(256, 128, bias=False)
    outs = {
        s: Float8Linear.from_linear(ref, scaling=s)(x).detach() for s in ("tensorwise", "tilewise")
    }
    y = F.linear(x, ref.weight).detach()
    err_tile = _rel(outs["tilewise"][normal], y[normal])  # ≈ the 3.7% of clean data
    assert err_tile < 0.05 and err_tile < 0.75 * _rel(outs["tensorwise"][normal], y[normal])


def test_delayed_scaling_records_and_uses_history() -> None:
    torch.manual_seed(0)
    lin = Float8Linear(64, 32, bias=False, amax="delayed", history_len=4)
    st = lin.fp8_state
    x1 = torch.randn(16, 64)
    lin(x1).sum().backward()
    assert st.x.num_recorded == st.w.num_recorded == st.dy.num_recorded == 1
    assert st.x.history[0] == x1.abs().amax() and st.x.history[1:].eq(0).all()
    amax1 = x1.abs().amax()

    # Step 2: the input grows 4x; the scale still comes from the history (amax1), so the
    # largest values saturate at 448 * scale — exactly the quantize(amax=amax1) result.
    x2 = 4 * x1
    y2 = lin(x2)
    xq, sx = quantize(x2, E4M3, amax=amax1)
    wq, sw = quantize(lin.weight.detach(), E4M3, amax=lin.weight.detach().abs().amax())
    expected = dequantize(xq, sx) @ dequantize(wq, sw).t()
    torch.testing.assert_close(y2, expected, rtol=1e-5, atol=1e-4)
    current = Float8Linear.from_linear(lin)(x2)  # current scaling does not saturate
    assert _rel(y2, x2 @ lin.weight.t()) > 2 * _rel(current, x2 @ lin.weight.t())
    assert st.x.history[0] == x2.abs().amax() and st.x.history[1] == amax1
    assert st.x.amax_for(x1) == x2.abs().amax()  # max over the window

    for _ in range(5):  # the window keeps only history_len steps
        lin(x1)
    assert st.x.history.amax() == amax1


def test_tilewise_delayed_is_rejected() -> None:
    with pytest.raises(ValueError, match="tilewise"):
        Float8Linear(64, 64, scaling="tilewise", amax="delayed")


def _linear_names(model: nn.Module, cls: type) -> set[str]:
    return {n for n, m in model.named_modules() if type(m) is cls}


def test_apply_fp8_converts_the_right_layers() -> None:
    cfg = resolve_model("tiny-llama")
    model = build_model(cfg, device="cpu")
    params_before = dict(model.named_parameters())
    keys_before = list(model.state_dict())
    converted = apply_fp8(model, backend="scaletrain")
    expected = {
        f"layers.{i}.{p}"
        for i in range(cfg.num_layers)
        for p in (
            "attention.wq",
            "attention.wk",
            "attention.wv",
            "attention.wo",
            "feed_forward.w1",
            "feed_forward.w2",
            "feed_forward.w3",
        )
    }
    assert set(converted) == expected == _linear_names(model, Float8Linear)
    assert type(model.output) is nn.Linear  # the head stays in higher precision
    assert list(model.state_dict()) == keys_before  # checkpoints are unchanged
    for name, p in model.named_parameters():  # the same Parameter objects, still fp32
        assert p is params_before[name] and p.dtype == torch.float32
    assert apply_fp8(model, backend="scaletrain") == []  # idempotent


def test_apply_fp8_skips_router_odd_dims_and_is_noop_off_fp8() -> None:
    moe = build_model(resolve_model("tiny-moe"))  # on meta: conversion allocates nothing
    converted = apply_fp8(moe, backend="scaletrain")
    assert converted and not any("router" in n or "output" in n for n in converted)
    assert all(type(m.router) is nn.Linear for n, m in moe.named_modules() if n.endswith("moe"))

    odd = build_model(dataclasses.replace(resolve_model("tiny-llama"), ffn_dim=40))
    converted = apply_fp8(odd, skip=("output", "wq"), backend="scaletrain")
    assert not any("feed_forward" in n or n.endswith("wq") for n in converted)
    assert {n.rsplit(".", 1)[-1] for n in converted} == {"wk", "wv", "wo"}

    plain = build_model(resolve_model("tiny-llama"))
    assert maybe_apply_fp8(plain, PrecisionConfig(dtype="bf16")) == []
    assert not _linear_names(plain, Float8Linear)
    tiled = maybe_apply_fp8(
        plain, PrecisionConfig(dtype="fp8", fp8_scaling="tilewise"), backend="scaletrain"
    )
    assert tiled and all(plain.get_submodule(n).fp8_state.scaling == "tilewise" for n in tiled)


@pytest.mark.parametrize("scaling", ["tensorwise", "tilewise"])
def test_tiny_model_trains_in_fp8(scaling: str) -> None:
    torch.manual_seed(0)
    model = build_model(resolve_model("tiny-llama"), device="cpu", seed=0)
    apply_fp8(model, scaling=scaling, backend="scaletrain")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # A learnable stream: each token is the previous one + a per-sequence stride, mod 256.
    base = torch.arange(17)
    data = torch.stack([(base * s + o) % 256 for s, o in zip(range(1, 5), range(0, 40, 10))])
    losses = []
    for _ in range(30):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(data[:, :-1])
        loss = causal_lm_loss(logits, data[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())


@pytest.mark.parametrize("scaling", ["tensorwise", "tilewise"])
def test_float8_experts_match_fp32_and_skip_empty_experts(scaling: str) -> None:
    """MoE experts in float8 (Float8ExpertLinear as `GroupedExperts.linear`): the output and
    the stacked weights' gradients within fp8's tolerance of F.linear's (the same bounds as a
    Float8Linear's three GEMMs above), an expert with no tokens contributing nothing."""
    torch.manual_seed(0)
    experts = GroupedExperts(64, 128, 4, activation="swiglu", bias=False)
    for p in experts.parameters():
        nn.init.normal_(p, std=0.05)
    counts = [37, 0, 19, 72]  # uneven, one expert idle
    x = torch.randn(sum(counts), 64)
    dy = torch.randn(sum(counts), 64)

    def run(linear):
        experts.linear = linear
        xi = x.clone().requires_grad_()
        y = experts(xi, counts)
        y.backward(dy)
        grads = {n: p.grad.clone() for n, p in experts.named_parameters()}
        experts.zero_grad(set_to_none=True)
        return y.detach(), xi.grad, grads

    y_ref, dx_ref, g_ref = run(F.linear)
    y, dx, g = run(Float8ExpertLinear(scaling))
    assert 0 < _rel(y, y_ref) < 0.08 and _rel(dx, dx_ref) < 0.12
    for name in ("w1", "w2", "w3"):
        assert 0 < _rel(g[name], g_ref[name]) < 0.12, (name, _rel(g[name], g_ref[name]))
        assert g[name][1].abs().max() == 0  # the idle expert's slice gets no gradient


def test_apply_fp8_converts_experts_unless_skipped() -> None:
    moe = build_model(resolve_model("tiny-moe"))
    names = apply_fp8(moe, scaling="tilewise", backend="scaletrain")
    experts = {n: m for n, m in moe.named_modules() if isinstance(m, GroupedExperts)}
    assert experts and set(experts) <= set(names)
    assert all(
        isinstance(m.linear, Float8ExpertLinear) and m.linear.fp8_state.scaling == "tilewise"
        for m in experts.values()
    )
    assert apply_fp8(moe, backend="scaletrain") == []  # idempotent
    kept = build_model(resolve_model("tiny-moe"))
    names = apply_fp8(kept, skip=("output", "router", "experts"), backend="scaletrain")
    assert names and not any(n.endswith("experts") for n in names)
    assert all(m.linear is F.linear for m in kept.modules() if isinstance(m, GroupedExperts))


def test_backend_follows_the_device_the_model_will_run_on() -> None:
    """'auto' decides by the device type it is given (a dry-run's target), not this host's
    CUDA: torchao's Float8Linear for 'cuda' where torchao is installed, ours for 'cpu', and
    `precision.fp8_backend` pins ours whatever the device."""
    pytest.importorskip("torchao.float8")
    from scaletrain.precision import fp8_backend_of

    def meta_model() -> nn.Module:
        return build_model(resolve_model("tiny-llama"), device="meta")

    gpu = meta_model()
    assert apply_fp8(gpu, device_type="cuda") and fp8_backend_of(gpu) == "torchao"
    cpu = meta_model()
    assert apply_fp8(cpu, device_type="cpu") and fp8_backend_of(cpu) == "scaletrain"
    pinned = meta_model()
    ours = PrecisionConfig(dtype="fp8", fp8_backend="scaletrain")
    assert maybe_apply_fp8(pinned, ours, device_type="cuda")
    assert fp8_backend_of(pinned) == "scaletrain"
    assert fp8_backend_of(meta_model()) == "none"


def test_torchao_linears_gather_in_float8_when_asked() -> None:
    """`precision.fp8_all_gather` under ZeRO-2/3 on torchao's backend: its own recipe
    (`Float8LinearConfig.enable_fsdp_float8_all_gather`, the weight wrapped in
    `WeightWithDynamicFloat8CastTensor`, whose FSDP2 hooks gather E4M3); without it the
    weights stay plain (FSDP2 gathers bf16). Ours are wrapped later, by `fp8_fsdp`."""
    pytest.importorskip("torchao.float8")
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    def wrapped(all_gather: bool) -> list[bool]:
        model = build_model(resolve_model("tiny-llama"), device="meta")
        names = apply_fp8(model, device_type="cuda", backend="torchao", all_gather=all_gather)
        return [
            isinstance(model.get_submodule(n).weight, WeightWithDynamicFloat8CastTensor)
            for n in names
        ]

    assert wrapped(True) and all(wrapped(True))
    assert not any(wrapped(False))
