"""Calibration end to end (issue #39 item 3): a real run of the default job, `verify --calibrate`
before and after `scaletrain profile`, and `plan --calibration` reproducing the run's step."""

from __future__ import annotations

import json

import pytest

from scaletrain.cli import main
from scaletrain.planner.time.calibration import read_calibration

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _plan_step(cal: str, capsys: pytest.CaptureFixture[str]) -> float:
    capsys.readouterr()
    assert main(["plan", "--dp", "1", "--calibration", cal, "--json"]) == 0
    return float(json.loads(capsys.readouterr().out)["time"]["step_s"])


def test_calibrate_a_run_then_plan_it(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    job = [
        "--train.steps=4",
        f"--train.run_dir={run}",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--train.sample_tokens=0",
        "--checkpoint.every=0",
        "--data.num_tokens=60000",
        f"--data.cache_dir={tmp_path / 'cache'}",
    ]
    assert main(["train", *job]) == 0
    one = str(tmp_path / "one.toml")
    assert main(["verify", str(run), "--calibrate", one]) == 0
    out = capsys.readouterr().out
    assert f"calibration written to {one} (step split, cpu clock)" in out
    cal = read_calibration(one)
    assert cal.split == "step" and cal.clock == "cpu"  # one thread: the CPU clock
    assert _plan_step(one, capsys) == pytest.approx(cal.measured_step_s, rel=1e-6)

    assert main(["profile", *job, "--steps", "1", "--warmup", "1"]) == 0
    split = str(tmp_path / "split.toml")
    assert main(["verify", str(run), "--calibrate", split]) == 0
    cal = read_calibration(split)
    assert cal.split == "profile"
    # gpt-mini's GEMMs: q, k, v, o (128 x 128), the MLP (128 x 512), the head (128 x 256)
    assert {k for k, _ in cal.matmul_by_shape} == {"128x128", "128x512", "128x256"}
    assert cal.attention > 0 and cal.non_gemm_s > 0 and cal.optimizer_bw > 0
    assert _plan_step(split, capsys) == pytest.approx(cal.measured_step_s, rel=1e-6)
