"""FSDP2's exposed ends of a ZeRO-3 pass (time.exposure.fsdp2_end_exposure) and torchtitan's
gradient clipping pass (Recipe.optimizer_pass_bytes): torch's _fsdp_state.py leaves the first
unit's and block 0's all-gathers and block 0's and the end unit's reduce-scatters with no
compute to hide behind."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset, resolve_model
from scaletrain.planner import estimate
from scaletrain.planner.recipes.registry import recipe_named
from scaletrain.planner.time.comm import comm_terms
from scaletrain.planner.time.exposure import ComputeWindow, exposed_by_family, fsdp2_end_exposure
from scaletrain.planner.time.step_time import comm_arguments
from scaletrain.planner.types import PlanInput


def _plan(ends: str = "root", precision: str = "bf16", **layout) -> PlanInput:
    lay = Layout(**{"dp": 8, "zero": 3, **layout})
    return PlanInput(
        resolve_model("llama3-8b"),
        hardware_preset("h100-sxm"),
        8,
        lay,
        8192,
        8,
        1,
        precision,
        "selective",
        recipe="torchtitan",
        fsdp_ends=ends,
    )


def _ends(p: PlanInput) -> tuple[tuple[float, float] | None, dict, float]:
    params = p.model.num_params() / p.layout.tp
    inputs = comm_arguments(p, params, None, None, recipe_named("torchtitan"))
    terms = comm_terms(inputs)
    return fsdp2_end_exposure(p, recipe_named("torchtitan"), inputs, terms), terms, params


def test_end_units_are_sized_by_the_fsdp_ends() -> None:
    """Under 'root' the first gather is the root unit (embedding, final norm, head) and block
    0; under 'own_units' the embedding unit and block 0: the bytes' share of one full pass."""
    c = resolve_model("llama3-8b").param_counts()
    for ends, end in (
        ("root", c.embedding + c.final_norm + c.head),
        ("own_units", c.embedding),
    ):
        got, terms, P = _ends(_plan(ends))
        assert got is not None
        block = (P - end) / c.num_layers
        per = terms["fsdp_all_gather"][1] / 2  # one pass of a micro-batch
        rs = terms["fsdp_reduce_scatter"][1]
        assert got[0] == pytest.approx(per * (end + block) / P, rel=1e-12)
        assert got[1] == pytest.approx(rs * (end + block) / P, rel=1e-12)
    root, _, _ = _ends(_plan("root"))
    own, _, _ = _ends(_plan("own_units"))
    assert root is not None and own is not None and root[0] > 1.5 * own[0]


def test_fp8_gathered_block_weights_travel_at_one_byte() -> None:
    """torchao's float8 all-gather sends the blocks' Linear weights as 1 B: block 0's share of
    the first gather shrinks, the end units (embedding, head: no Float8Linear) do not."""
    p = dataclasses.replace(_plan("root", "fp8"), fp8_all_gather=True)
    got, terms, P = _ends(p)
    bf, bterms, _ = _ends(_plan("root", "fp8"))
    assert got is not None and bf is not None
    # seconds per gathered byte are the same; the gathered bytes of a pass differ
    assert terms["fsdp_all_gather"][1] < bterms["fsdp_all_gather"][1]
    assert got[0] < bf[0]
    # the reduce-scatter is of gradients in the reduce dtype either way
    assert got[1] == pytest.approx(bf[1], rel=1e-12)


def test_only_fsdp2_recipes_at_zero3_without_pipeline() -> None:
    """Recipe.fsdp2_ends_exposed: the FSDP2 frameworks (torchtitan, torchtune); not the
    default recipe (its calibrated efficiency) nor DeepSpeed's ZeRO-3."""
    assert recipe_named("torchtitan").fsdp2_ends_exposed
    assert recipe_named("torchtune").fsdp2_ends_exposed
    assert not recipe_named("scaletrain").fsdp2_ends_exposed
    assert (
        "_root_post_backward_final_callback"
        in recipe_named("torchtitan").sources["fsdp2_ends_exposed"]
    )
    p = _plan()
    inputs = comm_arguments(p, 8e9, None, None, recipe_named("torchtitan"))
    terms = comm_terms(inputs)
    assert fsdp2_end_exposure(p, recipe_named("deepspeed"), inputs, terms) is None
    assert fsdp2_end_exposure(p, recipe_named("scaletrain"), inputs, terms) is None
    assert fsdp2_end_exposure(p, None, inputs, terms) is None
    z2 = _plan(zero=2)
    i2 = comm_arguments(z2, 8e9, None, None, recipe_named("torchtitan"))
    assert fsdp2_end_exposure(z2, recipe_named("torchtitan"), i2, comm_terms(i2)) is None


def test_exposure_charges_the_ends_when_compute_hides_the_rest() -> None:
    """Compute-bound (the windows far exceed the collectives): the forward's exposure is the
    first gathers, the backward's the last reduce-scatters; without ends the old rule (one
    average unit of layers + 1) stays."""
    p = _plan()
    got, terms, P = _ends(p)
    assert got is not None
    w = ComputeWindow(microbatches=1, forward_s=10.0, backward_s=20.0, core_s=0.0, layers=32)
    ends = dataclasses.replace(w, fsdp_ends=got)
    out = exposed_by_family(terms, p, ends, stage_params=P, gpus_per_node=8)
    assert out["fsdp_all_gather"] == pytest.approx(got[0] + got[1], rel=1e-12)
    old = exposed_by_family(terms, p, w, stage_params=P, gpus_per_node=8)
    per = terms["fsdp_all_gather"][1] / 2
    assert old["fsdp_all_gather"] == pytest.approx(per / 33, rel=1e-12)
    assert out["fsdp_all_gather"] > 4 * old["fsdp_all_gather"]
    # comm-bound: each pass's aggregate exposure already holds its ends (the end gathers are
    # part of the pass's gathers, not on top of them)
    tight = ComputeWindow(
        microbatches=1, forward_s=0.0, backward_s=0.0, core_s=0.0, layers=32, fsdp_ends=got
    )
    t = exposed_by_family(terms, p, tight, stage_params=P, gpus_per_node=8)
    rs = terms["fsdp_reduce_scatter"][1]
    assert t["fsdp_all_gather"] == pytest.approx(per + per + rs, rel=1e-12)


def test_torchtitan_step_charges_ends_and_clipping() -> None:
    """The torchtitan recipe's step: the end units' exposure and the clip's 12 B per sharded
    parameter (norm 4, in-place scale 4 + 4) over memory bandwidth beside the optimizer."""
    p = _plan()
    e = estimate(p)
    got, _, P = _ends(p)
    assert got is not None
    assert e.time.comm_exposed_s >= got[0] + got[1] - 1e-12
    assert recipe_named("torchtitan").optimizer_pass_bytes == 12.0
    no_clip = dataclasses.replace(recipe_named("torchtitan"), optimizer_pass_bytes=0.0)
    from scaletrain.planner.time.step_time import _optimizer_seconds

    diff = _optimizer_seconds(p, P, recipe_named("torchtitan")) - _optimizer_seconds(p, P, no_clip)
    assert diff == pytest.approx(12.0 * P / 8 / p.hardware.memory_bw, rel=1e-9)
