"""bf16 RMSNorm (models/norms.py `_RMSNorm16`) on DTensors, on 2 gloo ranks == one process.

Norm: a SequenceParallel norm (tensor_parallel.py's plan for attention_norm / ffn_norm / norm)
gets a Shard(1) bf16 input and a Replicate weight; with ac none, selective (the trainer's
per-op policy) and full (parallel/ac.py's wrappers). Every token is normalized on one rank
by the same ops as on one process, so the output and the input gradient are bit-identical;
the weight gradient is each rank's fp32 sum over its tokens, rounded to bf16 and summed over
the ranks (DTensor's Partial -> Replicate) where one process rounds the whole sum once:
|diff| <= 4 u sum_tokens |dy n| (u = 2^-8: two partials rounded, their sum rounded, the
reference rounded). What the norm keeps: this rank's bf16 slice and its fp32 rstd, nothing
fp32 of width h (under AC only the checkpoint's input).

Model: tiny-llama under tp2 + sp with bf16 parameters (the plan's real DTensor flow into and
out of the norms): selective and full AC give the no-AC gradients bit for bit, and the loss is the
single-process bf16 model's within bf16 rounding (2e-2 relative, test_fsdp_options' bound
for a bf16 run against another; measured 4e-6).
"""

from __future__ import annotations

import pytest
import torch

from scaletrain.models import build_model
from scaletrain.models.norms import RMSNorm
from scaletrain.parallel.launch import spawn

from ._norm_fns import SHAPE, norm_case, run_norm, sp_suite
from ._parity_fns import CONFIGS, batch

pytestmark = [pytest.mark.distributed]

ACS = ["none", "selective", "full"]


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn(sp_suite, 2, ACS)


def _reference():
    x, w, dy = norm_case()
    norm = RMSNorm(SHAPE[-1], 1e-5).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(w)
    xr = x.clone().requires_grad_()
    y, _ = run_norm(norm, xr, dy, "none")
    n = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)
    sum_dyn = (dy.double() * n).abs().sum((0, 1))
    return y.detach(), xr.grad, norm.weight.grad, sum_dyn


@pytest.mark.parametrize("ac", ACS)
def test_sequence_parallel_bf16_norm_equals_one_process(ranks, ac):
    y, gx, gw, sum_dyn = _reference()
    got = [r["norm"][ac] for r in ranks]
    assert got[0]["y_placements"] == "(Shard(dim=1),)"
    assert torch.equal(torch.cat([g["y"] for g in got], dim=1), y)
    assert torch.equal(torch.cat([g["gx"] for g in got], dim=1), gx)
    for g in got:
        assert g["gw"].dtype == torch.bfloat16
        assert ((g["gw"].double() - gw.double()).abs() <= 4 * 2.0**-8 * sum_dyn).all()
    b, t, h = SHAPE
    local = (b, t // 2, h)
    if ac == "none":
        assert sorted(got[0]["saved"]) == sorted(
            [("torch.bfloat16", local), ("torch.bfloat16", (h,)), ("torch.float32", (b, t // 2, 1))]
        )
    else:  # only the checkpoint's input
        assert got[0]["saved"] == [("torch.bfloat16", local)]


def test_tp_sp_bf16_model_checkpoints_and_tracks_one_process(ranks):
    model = build_model(CONFIGS["tiny-llama"], device="cpu", seed=0).to(torch.bfloat16)
    x, y = batch("tiny-llama", 0)
    ref = float(model(x, targets=y).detach())
    for r in ranks:
        none = r["model"]["none"]
        assert none["loss"] == pytest.approx(ref, rel=2e-2)
        for ac in ("selective", "full"):
            assert r["model"][ac]["loss"] == none["loss"]
            for name, g in none["grads"].items():
                assert torch.equal(r["model"][ac]["grads"][name], g), (ac, name)
