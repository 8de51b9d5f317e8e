"""Pipeline schedule calls per step (`PlanInput.pp_schedule_microbatches`,
`time.pipeline.schedule_microbatches`): NeMo AutoModel calls torch's schedule once per local
batch, so the torch stages' per-micro-batch buffers and the in-flight count follow one call's
micro-batches, and each call pays its own fill and drain."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scaletrain.config import ConfigError, Layout, hardware_preset, model_preset
from scaletrain.planner import estimate
from scaletrain.planner.recipes.memory import recipe_rank_memory, torch_stage_buffers
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.time.pipeline import bubble_fraction, schedule_microbatches
from scaletrain.planner.types import PlanInput

AM = RECIPES["automodel"]
LAYOUT = Layout(dp=1, pp=4, pp_schedule="interleaved", pp_virtual=2)


def _plan(global_batch: int, per_call: int = 0) -> PlanInput:
    return PlanInput(
        dataclasses.replace(model_preset("tiny-llama"), num_layers=8),
        hardware_preset("h100-sxm"),
        LAYOUT.world_size,
        LAYOUT,
        128,
        global_batch,
        1,
        "bf16",
        ac="full",
        recipe="automodel",
        pp_schedule_microbatches=per_call,
    )


def test_schedule_microbatches_defaults_to_the_step_and_refuses_bad_values() -> None:
    assert schedule_microbatches(32, 0, 4) == 32
    assert schedule_microbatches(32, 8, 4) == 8
    assert schedule_microbatches(32, 32, 4) == 32
    for bad in (-1, 5, 64, 2):  # negative, not dividing 32, above m, below pp
        with pytest.raises(ConfigError, match="pp_schedule_microbatches"):
            schedule_microbatches(32, bad, 4)
    with pytest.raises(ConfigError, match="pp_schedule_microbatches"):
        _ = _plan(16, 3).pp_call_microbatches


def test_stage_buffers_and_memory_follow_one_call() -> None:
    """16 micro-batches in calls of 4 hold what a 4-micro-batch step holds (torch sizes its
    receive buffers per call); the default (0) and a call of all 16 are the same plan."""
    calls, one = _plan(16, 4), _plan(4)
    assert calls.grad_accum == 16 and calls.pp_call_microbatches == 4
    for rank in range(LAYOUT.pp):
        first, last = rank == 0, rank == LAYOUT.pp - 1
        assert torch_stage_buffers(calls, AM, first, last, 1.0) == pytest.approx(
            torch_stage_buffers(one, AM, first, last, 1.0)
        )
        whole = recipe_rank_memory(_plan(16), AM, rank).total
        assert recipe_rank_memory(_plan(16, 16), AM, rank).total == pytest.approx(whole)
        assert recipe_rank_memory(calls, AM, rank).total < whole
        assert recipe_rank_memory(calls, AM, rank).total == pytest.approx(
            recipe_rank_memory(one, AM, rank).total
        )


def test_bubble_is_paid_once_per_call() -> None:
    whole, calls = estimate(_plan(16)).time, estimate(_plan(16, 4)).time
    assert whole.compute_s == pytest.approx(calls.compute_s)
    ratio = bubble_fraction("interleaved", 4, 4, 2) / bubble_fraction("interleaved", 4, 16, 2)
    assert ratio == pytest.approx(4.0)
    assert calls.bubble_s == pytest.approx(ratio * whole.bubble_s)


def test_published_row_field_parses_and_is_refused_by_name(tmp_path: Path) -> None:
    from scaletrain.planner.recipes.published import load_runs, plan_input

    row = """
[[runs]]
name = "t"
framework = "automodel"
source = "https://example.org/table 1"
gpu = "h100-sxm"
num_gpus = 8
seq_len = 128
model = { preset = "tiny-llama", layers = 8 }
layout = { dp = 2, pp = 4, micro_batch = 1, global_batch = 32, pp_schedule_microbatches = %d }
measured = { step_s = 1.0 }
"""
    p = tmp_path / "runs.toml"
    p.write_text(row % 8)
    (run,) = load_runs(p)
    assert plan_input(run, "automodel").pp_call_microbatches == 8
    assert plan_input(run, "scaletrain").pp_call_microbatches == 16
    for bad in (0, 3, 32):
        p.write_text(row % bad)
        with pytest.raises(ConfigError, match="pp_schedule_microbatches"):
            load_runs(p)


def test_automodel_dsv3_rows_state_one_call_per_local_batch() -> None:
    from scaletrain.planner.recipes.published import load_runs, plan_input

    runs = {r.name: r for r in load_runs()}
    for name, calls in (
        ("am-h100-dsv3-256g-pp4-vp8-ep64", 1),
        ("am-h100-dsv3-1024g-pp4-vp8-ep64", 4),
    ):
        p = plan_input(runs[name], "automodel")
        assert p.pp_call_microbatches == 8
        assert p.grad_accum == 8 * calls
