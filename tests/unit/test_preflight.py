"""Train-time `layout auto` preflight: the planner's choice dry-run in a fresh process."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import ConfigError, hardware_preset, load_config
from scaletrain.orchestrate import auto_layout, preflight

pytestmark = pytest.mark.slow


def _job():
    return load_config(
        None,
        {
            "model": {"name": "tiny"},
            "train": {"device": "cpu"},
            "batch": {"seq_len": 64, "micro_batch": 2, "global_batch": 8},
        },
    )


def test_preflight_measures_the_chosen_layout_in_a_child_process():
    from scaletrain.planner.search.layouts import search

    job = _job()
    hw = hardware_preset("cpu")
    best = search(
        job.model, hw, 2, seq_len=64, global_batch=8, precision="fp32", top_k=1, micro_batch=2
    ).best
    chosen = dataclasses.replace(job, parallel=type(job.parallel).from_layout(best.plan.layout))
    measured, line = preflight(chosen, 2, best)
    assert measured is not None and measured > 0, line
    # the planner is calibrated against this very dry-run: the two agree closely
    assert abs(best.memory.total - measured) / measured < 0.25, line
    assert line.startswith(f"preflight dry-run (rank {best.memory.rank} of 2)")


def test_auto_layout_refuses_a_layout_the_dry_run_says_does_not_fit(monkeypatch, capsys):
    import scaletrain.orchestrate as build

    hw = hardware_preset("cpu")
    monkeypatch.setattr(
        build, "preflight", lambda job, world, est: (2 * hw.memory_bytes, "preflight: stub")
    )
    with pytest.raises(ConfigError, match="parallel.layout") as e:
        auto_layout(_job(), 2, hw)
    assert "measured" in str(e.value) and "GiB" in str(e.value)
    assert "layout auto: planner chose" in capsys.readouterr().out


def test_auto_layout_trains_on_the_plan_when_the_dry_run_cannot_run(monkeypatch, capsys):
    import scaletrain.orchestrate as build

    monkeypatch.setattr(build, "preflight", lambda job, world, est: (None, "preflight: not run"))
    chosen = auto_layout(_job(), 2, hardware_preset("cpu"))
    assert chosen.parallel.names_degrees
    assert "preflight: not run" in capsys.readouterr().out
