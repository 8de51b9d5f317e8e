"""The disk fills mid-run: one line naming the error and the file, exit 3; the last good
checkpoint is kept and the same command resumes once there is space again.

A real full filesystem: a small tmpfs mounted for the test (skipped where this process may
not mount, e.g. without root)."""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest

from ._cli import no_traceback, scaletrain, tiny_job

pytestmark = pytest.mark.fault("disk_full_readonly")


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    # 2.5 MiB: the run's small files and its first checkpoint (tiny-llama's weights and
    # AdamW states, ~1.5 MiB), not the second
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2560k", "tmpfs", str(mnt)], capture_output=True
    )
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.decode().strip()[:100]}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.slow
def test_disk_full_during_a_save_is_one_line_and_keeps_the_last_checkpoint(tmp_path, small_disk):
    run = small_disk / "run"
    args = tiny_job(tmp_path, "unused", "--train.steps=6", "--checkpoint.every=2")
    args = [a for a in args if not a.startswith("--train.run_dir")] + [f"--train.run_dir={run}"]
    p = scaletrain("train", *args, timeout=300)
    assert p.returncode == 3 and no_traceback(p), p.stderr[-3000:]
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0], err
    good = sorted((run / "checkpoints").glob("step_*"))
    assert good, "the checkpoint written before the disk filled is gone"
    # space again (the checkpoints moved to a roomy disk): the same command resumes
    roomy = tmp_path / "roomy"
    shutil.copytree(run, roomy, symlinks=True, ignore=shutil.ignore_patterns(".tmp-*"))
    args = [a for a in args if not a.startswith("--train.run_dir")] + [f"--train.run_dir={roomy}"]
    again = scaletrain("train", *args, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {roomy / 'checkpoints' / good[-1].name}" in again.stdout


@pytest.mark.slow
def test_checkpoints_turned_read_only_mid_run_is_one_line_and_keeps_them(tmp_path):
    """The checkpoint folder's filesystem turns read-only between two saves (a real tmpfs
    remounted ro: what a failing disk or an admin does): the next save is one line naming
    EROFS and the path, exit 3; every checkpoint published before is intact, and the same
    command resumes from the newest once the mount is writable again."""
    import sys
    import time

    from scaletrain.checkpoint import latest_good, verify_checkpoint

    from ._cli import digests, env, lost

    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    ckpts.mkdir(parents=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(ckpts)])
    if p.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        args = tiny_job(
            tmp_path, "run", "--train.steps=2000", "--checkpoint.every=3", "--train.log_every=1"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "scaletrain", "train", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        while not (ckpts / "step_00000003").is_dir() and proc.poll() is None:
            time.sleep(0.05)
        # a remount fails (busy) while a save holds a file open: retry between saves
        while proc.poll() is None:
            remount = subprocess.run(["mount", "-o", "remount,ro", str(ckpts)], capture_output=True)
            if remount.returncode == 0:
                break
            time.sleep(0.01)
        before = digests(ckpts)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 3 and no_traceback(
            subprocess.CompletedProcess(proc.args, 3, out, err)
        ), err[-3000:]
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Read-only file system" in lines[0], lines
        assert str(ckpts) in lines[0], lines
        assert lost(before, ckpts) == []
        newest = latest_good(ckpts, log=lambda _: None)
        assert newest is not None and verify_checkpoint(newest) is None
        subprocess.run(["mount", "-o", "remount,rw", str(ckpts)], check=True)
        again = scaletrain(
            "train", *tiny_job(tmp_path, "run", f"--train.steps={_step(newest) + 1}")
        )
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"resuming from {newest}" in again.stdout
    finally:
        subprocess.run(["umount", "-l", str(ckpts)], capture_output=True)


def _step(path) -> int:
    return int(path.name.split("_")[-1])
