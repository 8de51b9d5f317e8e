"""fp8 changes nothing but the converted matmuls: under bf16 autocast an fp8 model's modules
emit the dtypes the bf16 model's do (residual stream, norms, attention, head, loss), its
gradients land in the same dtypes, and its step-0 gradient is the bf16 one up to fp8 rounding
(unbiased: norm ratio ~ 1, no systematic scaling). The precision benchmark's fp8-vs-bf16 gap
rests on this."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scaletrain.config import resolve_model
from scaletrain.models import build_model, causal_lm_loss
from scaletrain.precision import Float8Linear, apply_fp8

pytestmark = pytest.mark.usefixtures("one_thread")


def _step(scaling: str | None) -> tuple[dict[str, torch.dtype], dict[str, torch.Tensor]]:
    model = build_model(resolve_model("tiny-llama"), device="cpu", seed=0)
    if scaling:
        assert apply_fp8(model, scaling=scaling, backend="scaletrain")
    dtypes: dict[str, torch.dtype] = {}

    def hook(name: str):
        def record(_m: nn.Module, _i: tuple, out: torch.Tensor) -> None:
            if torch.is_tensor(out):
                dtypes[name] = out.dtype

        return record

    for name, mod in model.named_modules():
        mod.register_forward_hook(hook(name or "<model>"))
    tokens = torch.randint(0, 256, (4, 33), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
    causal_lm_loss(logits, tokens[:, 1:]).backward()
    return dtypes, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("scaling", ["tensorwise", "tilewise"])
def test_fp8_model_matches_bf16_dtypes_and_gradients(scaling: str) -> None:
    bf16_dtypes, bf16_grads = _step(None)
    fp8_dtypes, fp8_grads = _step(scaling)
    assert fp8_dtypes == bf16_dtypes  # module by module: Linear outputs bf16 in both
    assert bf16_dtypes["<model>"] == torch.bfloat16
    assert {g.dtype for g in fp8_grads.values()} == {torch.float32}
    num = sum((fp8_grads[n] - g).norm() ** 2 for n, g in bf16_grads.items()) ** 0.5
    den = sum(g.norm() ** 2 for g in bf16_grads.values()) ** 0.5
    ratio = sum(g.norm() ** 2 for g in fp8_grads.values()) ** 0.5 / den
    assert 0.005 < num / den < 0.10  # fp8 rounding (E4M3 x E5M2 ≈ 6%), and it really ran
    assert abs(ratio - 1) < 0.03  # unbiased: no scale error in dgrad/wgrad
    for name, g in bf16_grads.items():  # every parameter, not only the converted weights
        assert ((fp8_grads[name] - g).norm() / g.norm()) < 0.2, name


def test_converted_linears_are_the_only_difference() -> None:
    model = build_model(resolve_model("tiny-llama"), device="cpu", seed=0)
    before = {n: type(m) for n, m in model.named_modules()}
    converted = set(apply_fp8(model, scaling="tensorwise", backend="scaletrain"))
    after = {n: type(m) for n, m in model.named_modules()}
    assert before.keys() == after.keys()
    assert {n for n in before if before[n] is not after[n]} == converted
    assert all(after[n] is Float8Linear for n in converted)
