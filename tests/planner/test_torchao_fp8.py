"""fp8 on torchao's Float8Linear in the planner (`planner.memory.torchao_fp8`): the backend
read from the trainer's rule (`config.fp8_backend_for`), torchao's saved set and eager casts
against dry-run figures recorded here (benchmarks/planner_accuracy.py's torchao rows, torchao
0.18.0, torch 2.13), and `explain` naming the backend it plans.

The recorded figures are the dry-run's allocated peak (bytes, rank 0, warm second step) of the
trainer's own step with `precision.fp8_backend='torchao'` on a GPU target; the planner is held
to them within planner_accuracy's 3%, and the planner as it was (our Float8Linear's terms for
a torchao run) is more than 3% under each.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from scaletrain.cli import main
from scaletrain.config import PrecisionConfig, fp8_backend_for
from scaletrain.config.precision import torchao_installed
from scaletrain.planner import estimate
from scaletrain.planner.memory.torchao_fp8 import (
    torchao_cast_bytes,
    torchao_linear_backward_bytes,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import planner_accuracy  # noqa: E402

TOL = planner_accuracy.TOLERANCE["total"]

# planner_accuracy label -> the dry-run's allocated peak, bytes (torchao 0.18.0, torch 2.13)
MEASURED = {
    "llama3-70b-L4 w256 dp32 z3 tp8+sp ac=full fp8 torchao b16x1 s8192": 25_797_719_236,
    "llama-256-L2 w8 dp2 z3 tp4+sp ac=full fp8 torchao b4x1 s512": 19_606_140,
    "llama-256-L2 w2 dp2 z3 ac=none fp8 torchao b4x1 s512": 82_356_864,
    "llama-256-L2 w2 dp2 z3 ac=none fp8 torchao-ag b4x1 s512": 80_358_124,
}


def _planned(case: tuple, backend: str | None = None) -> float:
    """The planner's total without its CUDA context (as planner_accuracy compares), for the
    case's job; `backend` replaces the resolved fp8 backend (the old planner: 'scaletrain')."""
    job, world = planner_accuracy.job_for(case)
    plan = planner_accuracy.dryrun_plan(job, job.layout(world))
    if backend is not None:
        plan = dataclasses.replace(plan, fp8_backend=backend)
    mem = estimate(plan).memory
    return mem.total - mem.buffer_terms.get("runtime_context", 0.0)


@pytest.mark.parametrize("case", planner_accuracy.FP8_TORCHAO, ids=planner_accuracy.label)
def test_torchao_rows_match_the_recorded_dry_run(case):
    measured = MEASURED[planner_accuracy.label(case)]
    job, world = planner_accuracy.job_for(case)
    plan = planner_accuracy.dryrun_plan(job, job.layout(world))
    assert plan.fp8_backend == "torchao" and plan.saved_precision == "bf16"
    got = _planned(case)
    assert abs(got - measured) / measured <= TOL, (got, measured)
    # the planner of our Float8Linear (what a torchao run was planned with before)
    old = _planned(case, backend="scaletrain")
    assert (measured - old) / measured > TOL, (old, measured)


def test_one_linear_backward_matches_memtracker():
    """One bf16 torchao Float8Linear, M = 4096 tokens, measured with torch's MemTracker on CPU
    tensors (peak of backward less its output gradient, per token): (K, N) = (256, 1024)
    10,816 B, (1024, 256) 11,840 B. The formula ignores the weight's casts, N*K/M = 64 B."""
    weights = 1024 * 256 / 4096
    for (k_in, n_out), measured in (((256, 1024), 10_816), ((1024, 256), 11_840)):
        got = torchao_linear_backward_bytes(n_out, k_in, compile=False)
        assert measured - weights <= got <= measured, (k_in, n_out, got)
    # compiled: no fp32 copy, far less
    assert torchao_linear_backward_bytes(1024, 256, compile=True) < 10_816 / 2


def test_cast_term_is_the_row_parallel_backward():
    """Llama-3-70B tp8: w2's backward casting its gathered (tok, h) gradient twice beside its
    (tok, f/t) input gradient, 10h + 2f/t per token; under full AC the recompute's w2 input
    cast (9 f/t) is below it."""
    case = next(c for c in planner_accuracy.FP8_TORCHAO if c[0] == "llama3-70b-L4")
    job, world = planner_accuracy.job_for(case)
    plan = planner_accuracy.dryrun_plan(job, job.layout(world))
    tok, h, f = 16 * 8192, 8192, 28672 / 8
    assert torchao_cast_bytes(plan) == tok * (10 * h + 2 * f)


def test_backend_rule_is_the_trainers():
    """'auto' resolves by the target device and recipe; the explicit ones are taken."""
    recipe = {"scaling": "tensorwise", "amax": "current", "matmul": "auto"}
    gpu = "torchao" if torchao_installed() else "scaletrain"
    assert fp8_backend_for("auto", device_type="cuda", **recipe) == gpu
    assert fp8_backend_for("auto", device_type="cpu", **recipe) == "scaletrain"
    tiles = {**recipe, "scaling": "tilewise"}
    assert fp8_backend_for("auto", device_type="cuda", **tiles) == "scaletrain"
    for b in ("scaletrain", "torchao"):
        assert fp8_backend_for(b, device_type="cpu", **recipe) == b
    assert PrecisionConfig(dtype="fp8").fp8_backend_on("cuda") == gpu


_EXPLAIN = ["explain", "--model", "llama3-8b", "--gpus", "8", "--dp", "8", "--zero", "3"]
_EXPLAIN += ["--tp", "1", "--pp", "1", "--cp", "1", "--seq-len", "4096", "--micro-batch", "1"]
_EXPLAIN += ["--precision", "fp8"]


@pytest.mark.skipif(not torchao_installed(), reason="'auto' picks torchao only where installed")
def test_plan_on_h100_with_auto_plans_torchao(capsys):
    assert main([*_EXPLAIN, "--gpu", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "fp8 linears planned: torchao's Float8Linear" in out
    assert main([*_EXPLAIN, "--gpu", "h100-sxm", "--precision.fp8_backend=scaletrain"]) == 0
    assert "fp8 linears planned: scaletrain's Float8Linear" in capsys.readouterr().out


def test_torchao_fp8_all_gather_keeps_one_byte_weights_in_flight():
    """torchao's fp8 all-gather hands the Linear a float8 weight (fsdp_utils.py
    `fsdp_post_all_gather`): ZeRO-3's two gathered units hold their converted weights at 1 B,
    not bf16's 2 (`PlanInput.gathers_fp8`); ours dequantizes to bf16, so it saves nothing."""
    from scaletrain.planner.memory.states import fp8_linear_params

    plain, ag = (c for c in planner_accuracy.FP8_TORCHAO if c[0] == "llama-256-L2" and c[5] == 1)
    plans = []
    for case in (plain, ag):
        job, world = planner_accuracy.job_for(case)
        plans.append(planner_accuracy.dryrun_plan(job, job.layout(world)))
    assert not plans[0].gathers_fp8 and plans[1].gathers_fp8
    ours = dataclasses.replace(plans[1], fp8_backend="scaletrain")
    assert not ours.gathers_fp8
    in_flight = [estimate(p).memory.detail["params.in_flight"] for p in (*plans, ours)]
    block_fp8 = fp8_linear_params(plans[0].model, 1)
    assert in_flight[0] - in_flight[1] == 2 * block_fp8  # two units, 1 B less each
    assert in_flight[2] == in_flight[0]
