"""One training per run directory: live owners refuse, dead owners are stale, exit releases."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from scaletrain.config import ConfigError
from scaletrain.trainer import runlock

from ._cli import no_traceback, scaletrain, tiny_job


@pytest.fixture
def other_process():
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def _write_lock(run_dir, pid, host=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / runlock.LOCK_NAME).write_text(
        json.dumps({"pid": pid, "host": host or socket.gethostname()})
    )


def test_live_owner_refuses_with_one_line(tmp_path, other_process):
    _write_lock(tmp_path, other_process.pid)
    with pytest.raises(ConfigError, match=f"pid {other_process.pid}") as e:
        runlock.acquire(tmp_path)
    assert e.value.field == "train.run_dir" and "\n" not in str(e.value)


def test_other_host_refuses(tmp_path):
    _write_lock(tmp_path, 1, host="some-other-node")
    with pytest.raises(ConfigError, match="some-other-node"):
        runlock.acquire(tmp_path)


@pytest.mark.parametrize("content", ["dead", "garbage", "empty"])
def test_stale_or_unreadable_lock_is_taken_over_and_released(tmp_path, other_process, content):
    lock = tmp_path / runlock.LOCK_NAME
    if content == "dead":
        other_process.kill()
        other_process.wait()
        _write_lock(tmp_path, other_process.pid)
    else:
        lock.write_text("" if content == "empty" else "{not json")
    runlock.acquire(tmp_path)
    import os

    assert json.loads(lock.read_text())["pid"] == os.getpid()
    runlock.release_held()
    assert not lock.exists()


@pytest.mark.slow
def test_second_training_in_the_same_run_dir_refuses(tmp_path, other_process):
    _write_lock(tmp_path / "run", other_process.pid)
    p = scaletrain("train", *tiny_job(tmp_path, "run"))
    assert p.returncode == 2 and no_traceback(p), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "another training" in p.stderr
    other_process.kill()
    other_process.wait()  # now stale: the next run takes it over and releases it at exit
    p = scaletrain("train", *tiny_job(tmp_path, "run"))
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "run" / runlock.LOCK_NAME).exists()
