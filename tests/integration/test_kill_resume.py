"""SIGKILL, resume, compare bitwise: a cheap version of benchmarks/kill_resume.py.

Runs are forked from this process (see the benchmark's docstring); the kills are real SIGKILLs.
"""

import importlib.util
import random
import signal
import sys
from pathlib import Path

import pytest
import torch

import scaletrain.trainer.checkpointing as checkpointing

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load_benchmark():
    if str(BENCH) not in sys.path:  # for its `_common` import
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_kill_resume", BENCH / "kill_resume.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


kr = _load_benchmark()

pytestmark = pytest.mark.slow

STEPS, EVERY = 9, 3


def _trial(tmp_path, index, aims, ref_wall_s, *, async_save=False):
    return kr.run_trial(
        index,
        random.Random(index),
        tmp_path,
        tmp_path / "cache",
        steps=STEPS,
        every=EVERY,
        async_save=async_save,
        ref_wall_s=ref_wall_s,
        write_jitter_s=0.0,
        aims=aims,
    )


def _final(tmp_path, row):
    return kr._final_state(tmp_path / f"trial{row['trial']:02d}-{row['mode']}", STEPS, tmp_path)


def test_sigkill_during_writes_and_at_random_resumes_bitwise(tmp_path, monkeypatch):
    ref = kr.run_reference(tmp_path, tmp_path / "cache", steps=STEPS, every=EVERY)
    rows = [
        # killed the moment the second write starts: resumes from the first checkpoint
        _trial(tmp_path, 0, [{"kind": "write", "pick": 0.5, "jitter_s": 0.0}], ref["wall_s"]),
        # the same during an asynchronous write (training goes on while it is written)
        _trial(
            tmp_path,
            1,
            [{"kind": "write", "pick": 0.0, "jitter_s": 0.0}],
            ref["wall_s"],
            async_save=True,
        ),
        _trial(tmp_path, 2, [{"kind": "random", "delay_s": 0.5 * ref["wall_s"]}], ref["wall_s"]),
    ]
    # negative control: a resume that loses its data position must be caught as a difference
    real_restore = checkpointing.restore

    def restore_one_batch_late(run, path):
        out = real_restore(run, path)
        run.data.skip_steps(1)
        return out

    # inherited by forked runs
    monkeypatch.setattr(checkpointing, "restore", restore_one_batch_late)
    broken = _trial(tmp_path, 3, [{"kind": "write", "pick": 0.5, "jitter_s": 0.0}], ref["wall_s"])
    monkeypatch.undo()

    ref_state = kr._final_state(ref["run_dir"], STEPS, tmp_path)
    ref_losses = kr._step_losses(ref["run_dir"])
    for row in rows:
        assert row["finished"] and not row["error"], row
        # (a random-time kill can miss: the run may finish first on a loaded host)
        assert row["kills"] == row["resumes"] == (1 if row["kind"] else 0)
        assert kr.compare(ref_state, _final(tmp_path, row)) == ""
        run_dir = tmp_path / f"trial{row['trial']:02d}-{row['mode']}"
        assert kr._step_losses(run_dir) == ref_losses
    # the write-aimed kills left a half-written .tmp-step_* behind: they hit a write
    assert rows[0]["kills"] == rows[1]["kills"] == 1
    assert rows[0]["kills_during_write"] == 1 and rows[1]["kills_during_write"] == 1
    assert rows[0]["lost_steps"] >= 1
    assert broken["finished"] and broken["kills"] == 1
    assert "differs" in kr.compare(ref_state, _final(tmp_path, broken))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_signal_trial_resumes_from_the_signal_time_checkpoint_bitwise(tmp_path, sig):
    ref = kr.run_reference(tmp_path, tmp_path / "cache", steps=STEPS, every=EVERY)
    row = kr.run_signal_trial(0, sig, random.Random(1), tmp_path, tmp_path / "cache", steps=STEPS)
    assert row["finished"] and not row["error"], row
    # every = 0: the checkpoint it resumed from can only be the one the signal wrote
    assert row["resumed_from"] == row["stopped_at"] and 0 < row["stopped_at"] < STEPS
    assert row["lost_steps"] == 0
    assert kr.compare(kr._final_state(ref["run_dir"], STEPS, tmp_path), _final(tmp_path, row)) == ""
    assert kr._step_losses(tmp_path / f"trial00-{row['mode']}") == kr._step_losses(ref["run_dir"])


def test_restarted_worker_of_a_finished_run_resumes_to_done(tmp_path):
    """torchrun restarts a rank that died after the final checkpoint was published: the run
    is done, so nothing trains again (no second run directory) and its checkpoint stays."""
    ref = kr.run_reference(tmp_path, tmp_path / "cache", steps=3, every=3)
    final = ref["run_dir"] / "checkpoints" / "step_00000003"
    manifest = (final / "manifest.json").read_text()
    args = kr.job_args(ref["run_dir"], tmp_path / "cache", steps=3, every=3, async_save=False)
    assert kr._wait(kr.launch(args, tmp_path / "restart.log", restart=1)) == 0
    assert not (tmp_path / "reference-2").exists()
    assert (final / "manifest.json").read_text() == manifest
    assert "done: 3 steps" in (tmp_path / "restart.log").read_text()


def test_compare_names_the_first_difference():
    a = {"model": {"w": torch.ones(3)}, "optim": {"state": {"0": {"step": torch.tensor(2.0)}}}}
    b = {"model": {"w": torch.ones(3)}, "optim": {"state": {"0": {"step": torch.tensor(2.0)}}}}
    assert kr.compare(a, b) == ""
    b["model"]["w"][1] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))  # one ulp
    assert kr.compare(a, b) == "model.w differs"
