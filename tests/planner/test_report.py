"""Report table, explain walk-through and plots."""

from __future__ import annotations

import pytest

from scaletrain.config import GiB, Layout, hardware_preset, resolve_model
from scaletrain.planner.output.plot import plot_memory, plot_pipeline
from scaletrain.planner.output.report import (
    estimate_rows,
    memory_unit,
    render_estimates,
    to_json,
)
from scaletrain.planner.time.pipeline import simulate
from scaletrain.planner.types import PlanInput, layout_label

est_mod = pytest.importorskip("scaletrain.planner.estimate")


def _estimate(**layout: object):
    plan = PlanInput(
        resolve_model("llama3-8b"), hardware_preset("h100-sxm"), 16, Layout(**layout), 4096, 64, 1
    )  # type: ignore[arg-type]
    return est_mod.estimate(plan)


def test_rows_and_table_show_memory_per_category() -> None:
    e = _estimate(dp=4, zero=3, tp=2, sp=True, pp=2)
    row = estimate_rows([e])[0]
    assert row[0] == layout_label(e) == "dp4 z3 tp2+sp pp2(1f1b) mb1x16"
    # one binary unit per table (config.units), its largest figure's: GiB for an 8B model
    assert memory_unit([e]) == ("GiB", GiB)
    assert row[1] == f"{e.memory.params / GiB:.1f}" and row[6] == f"{e.memory.total / GiB:.1f}"
    text = render_estimates([e])
    assert "dp4 z3 tp2+sp" in text and "reserved" in text
    assert "(memory in GiB per GPU, capacity 79.10 GiB)" in text and " GB" not in text
    assert to_json([e])[0]["plan"]["pp"] == 2


def test_explain_fills_in_the_numbers() -> None:
    from scaletrain.planner.output.explain import explain

    e = _estimate(dp=8, zero=1, tp=2)
    text = explain(e, tokens=1e12)
    assert f"{e.time.step_s:.3f} s" in text
    assert f"{int(e.flops_per_token):,}" in text
    assert "dp_allreduce" not in text or "zero" in text
    assert "embedding V*h = 128256*4096 = 525,336,576" in text
    assert "ZeRO-1" in text and "days" in text


def test_plots_write_pngs(tmp_path) -> None:
    a = plot_memory([_estimate(dp=16), _estimate(dp=8, tp=2, zero=3)], tmp_path / "m.png")
    b = plot_pipeline(simulate("zero-bubble", 4, 8, 1, 1.0, 2.0), tmp_path / "p.png")
    for path in (a, b):
        assert path.read_bytes()[:4] == b"\x89PNG"
