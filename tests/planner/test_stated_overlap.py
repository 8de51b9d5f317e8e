"""Communication a run states it overlaps beyond its framework's defaults (`PlanInput.
comm_overlap`, a published row's `layout.comm_overlap`; `time.exposure.run_overlap`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from scaletrain.cli import main
from scaletrain.planner import estimate
from scaletrain.planner.output.explain import explain
from scaletrain.planner.recipes.published import load_runs, plan_input
from scaletrain.planner.recipes.registry import recipe_named
from scaletrain.planner.time.efficiency import COMM_OVERLAP, STATED_OVERLAPS
from scaletrain.planner.time.exposure import run_overlap

ROW = "megatron-h100-llama3-405b-1024g-tp8-pp8-cp2-vp8-fp8"


@pytest.fixture(scope="module")
def row():
    return next(r for r in load_runs() if r.name == ROW)


def test_the_row_states_tp_overlap_and_only_the_framework_recipe_reads_it(row) -> None:
    assert row.layout.comm_overlap == ("tp",)
    assert plan_input(row, "megatron").comm_overlap == ("tp",)
    assert plan_input(row, "scaletrain").comm_overlap == ()
    assert set(STATED_OVERLAPS) >= {"tp", "pp_p2p", "dp_param_gather"}


def test_run_overlap_adds_the_stated_families_to_the_recipes(row) -> None:
    p = dataclasses.replace(plan_input(row, "megatron"), comm_overlap=("tp", "dp_param_gather"))
    got = run_overlap(p, recipe_named("megatron"))
    assert got[: len(COMM_OVERLAP["megatron"])] == COMM_OVERLAP["megatron"]
    assert "tp" in got and got.count("dp_param_gather") == 1
    assert run_overlap(p, recipe_named("scaletrain")) == COMM_OVERLAP.get("scaletrain", ())
    assert run_overlap(p, None) == ()


def test_stated_tp_overlap_hides_the_tp_collectives(row) -> None:
    """Under the megatron recipe the 405B row's TP reduce-scatters / all-gathers (~3 s) are on
    the critical path; stated as overlapped (Transformer Engine userbuffers, NeMo's performance
    configuration) they hide behind the step's compute, as under the nemo recipe."""
    on = estimate(plan_input(row, "megatron"))
    off = estimate(dataclasses.replace(plan_input(row, "megatron"), comm_overlap=()))
    tp = off.time.comm_terms["tp"]
    assert tp > 1.0
    assert off.time.step_s - on.time.step_s == pytest.approx(tp, rel=1e-6)
    nemo = estimate(dataclasses.replace(plan_input(row, "nemo"), comm_overlap=()))
    assert on.time.step_s == pytest.approx(nemo.time.step_s, rel=1e-3)


def test_explain_names_the_stated_overlap(row) -> None:
    text = explain(estimate(plan_input(row, "megatron")))
    assert "as the run states: tp" in text


def test_cli_comm_overlap_plans_the_row_as_the_corpus_states_it(row, capsys) -> None:
    """`plan --recipe megatron --comm-overlap tp` on the row's layout gives the corpus's
    prediction; without it the TP collectives are exposed again."""
    argv = [
        "plan",
        "--model",
        "llama3-405b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "1024",
        "--seq-len",
        "8192",
        "--global-batch",
        "512",
        "--micro-batch",
        "1",
        "--dp",
        "8",
        "--tp",
        "8",
        "--pp",
        "8",
        "--pp-schedule",
        "interleaved",
        "--pp-virtual",
        "8",
        "--cp",
        "2",
        "--precision",
        "fp8",
        "--recipe",
        "megatron",
        "--json",
    ]

    assert main([*argv, "--comm-overlap", "tp"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    off = json.loads(capsys.readouterr().out)
    # the row also states NeMo's deferred head weight gradients, which the CLI has no flag for
    stated = dataclasses.replace(plan_input(row, "megatron"), head_wgrad_deferred=0)
    want = estimate(stated).time.step_s
    assert on["time"]["step_s"] == pytest.approx(want, rel=1e-6)
    assert off["time"]["step_s"] > on["time"]["step_s"] + 1.0
