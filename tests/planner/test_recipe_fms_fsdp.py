"""The fms-fsdp recipe (registry.py RECIPES['fms-fsdp']): torch FSDP1 as IBM's fms-fsdp runs it
(foundation-model-stack/fms-fsdp at 2fdced7): bfSixteen mixed precision, so the gradient
reduce-scatter and HSDP's replica all-reduce send bf16 (Recipe.fsdp_reduce_bytes), and no
torch.compile, so the Llama block's elementwise kernels run eager."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.planner import estimate
from scaletrain.planner.recipes.published import FRAMEWORK_RECIPE, load_runs, plan_input
from scaletrain.planner.recipes.registry import RECIPES


@pytest.fixture(scope="module")
def hsdp_row():
    return next(r for r in load_runs() if r.name == "fms-fsdp-a100-llama2-13b-hsdp-128g-b1")


def test_fms_rows_plan_with_their_recipe() -> None:
    assert FRAMEWORK_RECIPE["fms-fsdp"] == "fms-fsdp"
    r = RECIPES["fms-fsdp"]
    assert r.fsdp_reduce_bytes == 2 and r.zero_stages == (3,)
    assert r.eager_elementwise and r.eager_block == "llama"
    # every other recipe reduces in fp32, as before the field existed
    assert {n for n, x in RECIPES.items() if x.fsdp_reduce_bytes != 4} == {"fms-fsdp"}


def test_bf16_reduce_halves_the_gradient_traffic(hsdp_row) -> None:
    plan = plan_input(hsdp_row, "fms-fsdp")
    fp32 = dataclasses.replace(RECIPES["fms-fsdp"], fsdp_reduce_bytes=4)
    RECIPES["fms-fsdp-fp32-test"] = dataclasses.replace(fp32, name="fms-fsdp-fp32-test")
    try:
        other = estimate(dataclasses.replace(plan, recipe="fms-fsdp-fp32-test")).time
    finally:
        del RECIPES["fms-fsdp-fp32-test"]
    t = estimate(plan).time
    for fam in ("fsdp_reduce_scatter", "hsdp_allreduce"):
        assert t.comm_terms[fam] == pytest.approx(other.comm_terms[fam] / 2, rel=0.05)
    # the parameters' all-gather is bf16 either way
    assert t.comm_terms["fsdp_all_gather"] == pytest.approx(other.comm_terms["fsdp_all_gather"])


def test_eager_elementwise_kernels_add_compute(hsdp_row) -> None:
    own = estimate(plan_input(hsdp_row, "fms-fsdp")).time
    no_eager = dataclasses.replace(RECIPES["fms-fsdp"], eager_elementwise=False)
    RECIPES["fms-fsdp-fused-test"] = dataclasses.replace(no_eager, name="fms-fsdp-fused-test")
    try:
        fused = estimate(
            dataclasses.replace(plan_input(hsdp_row, "fms-fsdp"), recipe="fms-fsdp-fused-test")
        ).time
    finally:
        del RECIPES["fms-fsdp-fused-test"]
    assert own.compute_s > 1.05 * fused.compute_s
