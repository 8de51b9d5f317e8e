"""`scaletrain verify RUN --calibrate` on synthetic run directories (issue #39 item 3): which
clock, which split, each constant by hand from the profile's shares, the calibrated plan
reproducing the measured step, and the one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaletrain.cli import main
from scaletrain.config import ConfigError, load_config
from scaletrain.measure.calibrate import calibrate_run, match_gemm
from scaletrain.measure.schema import Measurement
from scaletrain.planner import PlanInput, estimate
from scaletrain.planner.time.calibration import read_calibration
from scaletrain.planner.types import MemoryBreakdown, plan_input_from_job

PEAK = 333e9  # the cpu preset's fp32 peak


def _run(
    tmp: Path,
    *,
    world: int = 1,
    threads: int = 1,
    overrides: list[str] = (),
    local: int | None = None,
) -> Path:
    job = load_config(None, ["--batch.micro_batch=" + str(16 // world), *overrides])
    (tmp / "config.json").write_text(json.dumps(job.to_dict()))
    mem = MemoryBreakdown(params=1.0, total=1.0)
    Measurement(source="cpu", rank=0, world_size=world, memory=mem).write(tmp)
    rows = [  # step 1 is excluded (one-time costs); the wall clock twice the CPU's (load)
        {"step": s, "tokens_per_s": 2048 / w, "step_s": w, "step_cpu_s": c}
        for s, w, c in ((1, 2.0, 1.0), (2, 0.5, 0.2), (3, 0.5, 0.2))
    ]
    (tmp / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    info = {"device": "cpu", "threads": threads, "hardware": "cpu"}
    if local is not None:
        info["local_world_size"] = local
    (tmp / "run_info.json").write_text(json.dumps(info))
    return tmp


PHASES = {
    "data": 0.001,
    "forward": 0.06,
    "loss": 0.001,
    "backward": 0.12,
    "post": 0.002,
    "optimizer": 0.002,
    "other": 0.0,
}


def _profile(run: Path, *, layout: str = "dp1 z0 | mb16x1 seq128 fp32 attn=sdpa ac=none", **kw):
    ops = [  # shapes as the profiler records them (gpt-mini, 16 x 128 tokens)
        ("aten::mm", [[2048, 128], [128, 512]], 0.03),
        ("aten::addmm", [[128], [2048, 128], [128, 128], [], []], 0.04),
        ("aten::mm", [[2048, 128], [128, 256]], 0.01),
        ("aten::bmm", [[64, 128, 32], [64, 32, 128]], 0.005),  # no weight's shape
    ]
    prof = {
        "model": "gpt-mini",
        "layout": layout,
        "world_size": kw.get("world", 1),
        "phases_s": PHASES,
        "compute_op_classes_s": {"matmul": 0.1, "attention": 0.03, "elementwise/norm": 0.04},
        "comm_ops_s": kw.get("comm", {}),
        "ops": [
            {"name": n, "shapes": str(s), "class": "matmul", "compute_phase": True, "time_s": t}
            for n, s, t in ops
        ],
    }
    (run / "profile").mkdir()
    (run / "profile" / "profile.json").write_text(json.dumps(prof))


def test_one_rate_on_the_cpu_clock_reproduces_the_step(tmp_path: Path) -> None:
    res = calibrate_run(_run(tmp_path))
    c = res.calibration
    assert (c.split, c.clock, c.hardware, c.precision) == ("step", "cpu", "cpu", "fp32")
    assert c.measured_step_s == pytest.approx(0.2)  # the CPU seconds, step 1 excluded
    assert res.planned_s == pytest.approx(0.2, rel=1e-9)
    assert c.matmul_by_shape == () and c.attention == 0 and c.non_gemm_s == 0
    assert any("no RUN/profile/profile.json" in n for n in res.notes)


def test_the_ranks_sharing_the_host_are_recorded(tmp_path: Path) -> None:
    """run_info's local_world_size becomes the calibration's ranks_per_host (0 when a run
    written before it was recorded)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert calibrate_run(_run(tmp_path / "a", world=2, local=2)).calibration.ranks_per_host == 2
    assert calibrate_run(_run(tmp_path / "b")).calibration.ranks_per_host == 0


def test_two_threads_read_the_wall_clock(tmp_path: Path) -> None:
    res = calibrate_run(_run(tmp_path, threads=2))
    assert res.calibration.clock == "wall" and res.calibration.measured_step_s == pytest.approx(0.5)
    assert res.planned_s == pytest.approx(0.5, rel=1e-9)


def test_the_profile_split_by_hand(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _profile(run)
    res = calibrate_run(run)
    c = res.calibration
    scale = 0.2 / sum(PHASES.values())  # profiled shares x the run's step
    tok, L, h = 2048, 4, 128
    # matched matmul time 0.08 of 0.1: each class's share grows by 0.1 / 0.08
    t = {"128x512": 0.03 * 1.25, "128x128": 0.04 * 1.25, "128x256": 0.01 * 1.25}
    flops = {  # forward, backward (2x): q, k, v, o 2h^2; MLP 2 x 2hf; the head 2hV (last stage)
        "128x128": tok * L * 3 * 4 * 2 * h * h,
        "128x512": tok * L * 3 * 2 * 2 * h * 512,
        "128x256": tok * 3 * 2 * h * 256,
    }
    want = {k: flops[k] / (PEAK * t[k] * scale) for k in t}
    assert dict(c.matmul_by_shape) == pytest.approx(want, rel=1e-12)
    assert c.matmul == pytest.approx(sum(flops.values()) / (PEAK * 0.1 * scale), rel=1e-12)
    core = 4 * 128 * 4 * 32 / 2  # causal-halved QK^T + AV per token per block
    assert c.attention == pytest.approx(tok * L * 3 * core / (PEAK * 0.03 * scale), rel=1e-12)
    compute = (0.06 + 0.001 + 0.12) * scale
    non_gemm = compute - 0.1 * scale - 0.03 * scale
    assert c.non_gemm_s == pytest.approx(non_gemm / (tok * L * h), rel=1e-12)
    assert c.forward_share == pytest.approx(0.06 / 0.181, rel=1e-12)
    params = load_config(None).model.num_params()
    assert c.optimizer_bw == pytest.approx(28 * params / (0.002 * scale), rel=1e-9)
    assert c.collective == ()
    # what is left (data, post, other) is the overhead, and the step is reproduced
    assert c.step_overhead_s == pytest.approx((0.001 + 0.002) * scale, rel=1e-6)
    assert res.planned_s == pytest.approx(0.2, rel=1e-9)
    # the file says so, and plan reads it back
    out = tmp_path / "cal.toml"
    assert main(["verify", str(run), "--calibrate", str(out)]) == 0
    assert read_calibration(out) == c
    job = load_config(None, ["--batch.micro_batch=16"])
    plan = plan_input_from_job(job, job.layout(1))
    est = estimate(PlanInput(**{**plan.__dict__, "calibration": c}))
    assert est.time.step_s == pytest.approx(0.2, rel=1e-9)


def test_a_profiled_collective_becomes_its_factor(tmp_path: Path) -> None:
    run = _run(tmp_path, world=2)
    comm = {"c10d::allreduce_": 0.004, "gloo:all_reduce": 0.001, "c10d::barrier": 0.5}
    _profile(run, layout="dp2 z0 | mb8x1 seq128 fp32 attn=sdpa ac=none", world=2, comm=comm)
    res = calibrate_run(run)
    job = load_config(None, ["--batch.micro_batch=8"])
    planned = estimate(plan_input_from_job(job, job.layout(2))).time.comm_terms["dp_allreduce"]
    scale = 0.2 / sum(PHASES.values())
    assert dict(res.calibration.collective) == pytest.approx(
        {"all_reduce": 0.005 * scale / planned}, rel=1e-12
    )
    assert res.planned_s == pytest.approx(0.2, rel=1e-9)


def test_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").mkdir()
    run = _run(tmp_path / "a")
    _profile(run, layout="dp1 z0 | mb8x2 seq128 fp32 attn=sdpa ac=none")
    with pytest.raises(ConfigError, match="profile.json") as e:
        calibrate_run(run)
    assert "not this run's" in e.value.fix
    short = tmp_path / "b"
    short.mkdir()
    _run(short)
    (short / "metrics.jsonl").write_text(json.dumps({"step": 1, "tokens_per_s": 1, "step_s": 1}))
    with pytest.raises(ConfigError, match="fewer than two timed steps"):
        calibrate_run(short)
    assert main(["verify", str(run), "--calibrate", str(tmp_path / "no" / "cal.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err


def test_match_gemm_reads_the_profilers_shapes() -> None:
    keys = {"128x128", "128x512", "128x256"}
    cases = [
        ("aten::mm", [[2048, 128], [128, 512]], "128x512"),  # MLP up, forward
        ("aten::mm", [[2048, 512], [512, 128]], "128x512"),  # MLP up, input gradient
        ("aten::mm", [[512, 2048], [2048, 128]], "128x512"),  # weight gradient
        ("aten::addmm", [[128], [2048, 128], [128, 128], [], []], "128x128"),
        ("aten::addmm", [[256, 128], [256, 2048], [2048, 128], [], [], [256, 128]], "128x256"),
        ("aten::linear", [[16, 128, 128], [512, 128], [512]], "128x512"),
        ("aten::bmm", [[64, 128, 32], [64, 32, 128]], None),
        ("aten::mm", [[2048]], None),
    ]
    for name, dims, want in cases:
        assert match_gemm(name, dims, keys, 2048) == want, (name, dims)
