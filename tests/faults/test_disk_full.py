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
