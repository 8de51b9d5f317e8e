"""`scaletrain status RUN_DIR` on a finished run (trained here), and on running, crashed,
stopped and hung runs (their directories written as the loop and the watchdog write them)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from scaletrain.cli import main
from scaletrain.config import load_config
from scaletrain.report.status import format_status, run_status
from scaletrain.trainer import train

from ..distributed._trainer_fns import small_job

STEPS = 4


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("status")
    train(
        load_config(
            None,
            small_job(
                tmp,
                "run",
                "--checkpoint.resume=never",
                "--checkpoint.every=2",
                "--monitor.straggler_every=2",
            ),
        )
    )
    return tmp / "run"


def test_status_of_a_finished_run(finished, capsys):
    s = run_status(finished)
    assert (s.state, s.step, s.total_steps, s.checkpoint) == (
        "finished",
        STEPS,
        STEPS,
        f"step_{STEPS:08d}",
    )
    last = json.loads((finished / "metrics.jsonl").read_text().splitlines()[-1])
    assert s.loss == last["loss"] and s.eta_s is None and s.tokens_per_s > 0
    assert s.health == {"stragglers": {}, "rollbacks": 0, "skipped_steps": 0, "watchdog": None}
    assert main(["status", str(finished)]) == 0
    out = capsys.readouterr().out
    assert "finished: 4 of 4 steps" in out and "step_00000004" in out


def _fake_run(d, *, steps_done, total, pid, beat_age_s, state="running", host=None):
    """A run directory as the loop leaves it mid-run: config, metrics (1 s/step), heartbeat."""
    import socket

    d.mkdir(parents=True)
    (d / "config.json").write_text(
        json.dumps({"train": {"steps": total}, "monitor": {"watchdog_timeout_s": 0}})
    )
    with open(d / "metrics.jsonl", "w") as f:
        for s in range(1, steps_done + 1):
            evals = (
                {"val_loss": 4.0 + s / 10, "val_loss/wiki": 6.0 + s / 10, "ppl/wiki": 400.0}
                if s % 5 == 0
                else {}
            )
            f.write(
                json.dumps(
                    {
                        "step": s,
                        "loss": 5.0 - s / 100,
                        "step_s": 1.0,
                        "tokens_per_s": 1000.0,
                        "skipped": s == 3,
                        **evals,
                    }
                )
                + "\n"
            )
    (d / "guard.jsonl").write_text(json.dumps({"event": "rollback", "spike_step": 7}) + "\n")
    (d / "stragglers.jsonl").write_text(json.dumps({"step": 8, "stragglers": [3]}) + "\n")
    (d / "heartbeat").mkdir()
    (d / "heartbeat" / "rank0.json").write_text(
        json.dumps(
            {
                "rank": 0,
                "pid": pid,
                "host": host or socket.gethostname(),
                "step": steps_done,
                "time": time.time() - beat_age_s,
                "state": state,
            }
        )
    )


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_status_of_a_running_run(tmp_path):
    import os

    _fake_run(tmp_path / "r", steps_done=10, total=100, pid=os.getpid(), beat_age_s=2)
    s = run_status(tmp_path / "r")
    assert s.state == "running" and s.step == 10 and s.loss == pytest.approx(4.9)
    assert s.eta_s == pytest.approx(90 * 1.0)  # 90 steps left at the median 1 s/step
    assert s.health == {"stragglers": {3: 8}, "rollbacks": 1, "skipped_steps": 1, "watchdog": None}
    assert s.checkpoint is None
    assert s.val_loss == pytest.approx(5.0) and s.eval_losses == {"wiki": pytest.approx(7.0)}
    assert "(last val 5.0000; wiki 7.0000)" in format_status(s)


def test_status_of_a_crashed_run_and_a_stalled_one(tmp_path, capsys):
    _fake_run(tmp_path / "c", steps_done=10, total=100, pid=_dead_pid(), beat_age_s=3600)
    s = run_status(tmp_path / "c")
    assert s.state == "crashed" and s.eta_s is None
    assert main(["status", str(tmp_path / "c")]) == 1
    assert "crashed: no heartbeat for 3600 s" in capsys.readouterr().out
    # the same silence from a process on another host cannot be told from a stall
    _fake_run(
        tmp_path / "s",
        steps_done=10,
        total=100,
        pid=_dead_pid(),
        beat_age_s=3600,
        host="another-node",
    )
    assert run_status(tmp_path / "s").state == "stalled"


def test_status_of_a_stopped_run_and_a_hung_one(tmp_path):
    _fake_run(
        tmp_path / "p", steps_done=10, total=100, pid=_dead_pid(), beat_age_s=3600, state="exited"
    )
    assert run_status(tmp_path / "p").state == "stopped"
    _fake_run(tmp_path / "h", steps_done=10, total=100, pid=_dead_pid(), beat_age_s=60)
    line = "scaletrain watchdog: step 11 hung for 900 s ...: stuck rank(s) 1 (waiting for data)"
    (tmp_path / "h" / "watchdog").mkdir()
    (tmp_path / "h" / "watchdog" / "report.json").write_text(
        json.dumps({"time": time.time(), "line": line})
    )
    s = run_status(tmp_path / "h")
    assert (s.state, s.detail, s.health["watchdog"]) == ("hung", line, line)
