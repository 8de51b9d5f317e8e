"""Every place a command writes to is checked before work: a run directory or cache that is a
file or lies under one, a name longer than the filesystem allows, a folder this user cannot
write, an --out that is the wrong kind. One line naming the field, exit 2, nothing built."""

from __future__ import annotations

import os

import pytest

from scaletrain.cli import main
from scaletrain.config import ConfigError
from scaletrain.config.user_files import check_output_dir, check_output_file

from ._cli import digests, lost, one_line, scaletrain, tiny_job

pytestmark = pytest.mark.fault("output_path")


def _one_line(capsys, field: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err
    return err


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "plain.txt"
    f.write_text("x")
    return f


@pytest.mark.parametrize(
    ("override", "field", "said"),
    [
        ("--train.run_dir={file}", "train.run_dir", "a file, not a directory"),
        ("--train.run_dir={file}/run", "train.run_dir", "would be under"),
        ("--data.cache_dir={file}/cache", "data.cache_dir", "would be under"),
        ("--train.run_dir={tmp}/" + "r" * 5000, "train.run_dir", "longer than this filesystem"),
    ],
)
def test_train_refuses_a_bad_output_folder_before_any_work(
    tmp_path, a_file, capsys, override, field, said
):
    arg = override.format(file=a_file, tmp=tmp_path)
    assert main(["train", *tiny_job(tmp_path, "run"), arg]) == 2
    assert said in _one_line(capsys, field)
    assert not (tmp_path / "cache").exists()  # no data was prepared


def test_nproc_checks_before_spawning(tmp_path, a_file, capsys):
    assert main(["train", *tiny_job(tmp_path), f"--train.run_dir={a_file}", "--nproc=2"]) == 2
    _one_line(capsys, "train.run_dir")


def test_a_folder_this_user_cannot_write_is_named(tmp_path, monkeypatch):
    """(as root, permission bits do not stop a write: os.access is what is asked, so it is the
    seam; a read-only mount answers the same way)"""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if str(p) == str(tmp_path) else real(p, m))
    with pytest.raises(ConfigError, match="is not writable"):
        check_output_dir(tmp_path / "new" / "run", "train.run_dir")


def test_report_and_profile_out_of_the_wrong_kind(tmp_path, a_file, capsys):
    assert main(["report", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "is a directory" in _one_line(capsys, "--out")
    assert main(["report", str(tmp_path), "--out", str(a_file / "page.html")]) == 2
    assert "a file, not a directory" in _one_line(capsys, "--out")  # its folder is a file
    assert main(["profile", "--out", str(a_file), "--model.name=tiny-llama"]) == 2
    assert "a file, not a directory" in _one_line(capsys, "--out")


def test_good_places_pass(tmp_path):
    check_output_dir(tmp_path / "deep" / "new" / "run", "train.run_dir")  # made later
    check_output_dir(tmp_path, "train.run_dir")
    check_output_file(tmp_path / "page.html", "--out")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("--data.cache_dir={file}/cache", "data.cache_dir"),
        ("--data.cache_dir={long}", "data.cache_dir"),
    ],
)
def test_a_bad_folder_on_resume_is_one_line_and_keeps_the_run(tmp_path, a_file, override, field):
    """Resuming a run with a cache folder that cannot be made: one line naming the field,
    exit 2, and every file the run wrote (checkpoints, metrics, config) unchanged."""
    first = scaletrain("train", *tiny_job(tmp_path, "run"))
    assert first.returncode == 0, first.stderr
    before = digests(tmp_path / "run")
    arg = override.format(file=a_file, long=tmp_path / ("c" * 5000))
    again = scaletrain("train", *tiny_job(tmp_path, "run", "--train.steps=4"), arg)
    assert again.returncode == 2, again.stderr[-3000:]
    one_line(again, field)
    assert lost(before, tmp_path / "run") == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("--train.run_dir=/proc/run", "train.run_dir"),
        ("--data.cache_dir=/proc", "data.cache_dir"),
    ],
)
def test_a_pseudo_filesystem_is_refused_before_any_work(tmp_path, capsys, override, field):
    """/proc says writable to os.access (as root) but takes no new folders: asked directly,
    one line naming the field (it was a FileNotFoundError traceback from mkdir)."""
    assert main(["train", *tiny_job(tmp_path, "run"), override]) == 2
    assert "does not take new folders" in _one_line(capsys, field)
    assert not (tmp_path / "cache").exists()


def test_a_read_only_mount_is_named_even_for_root(tmp_path):
    """A real read-only tmpfs (the monkeypatched case above, on a mount): root's permission
    bits allow everything, the mount does not, and the line says which."""
    import subprocess

    mnt = tmp_path / "ro"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)])
    if p.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(ConfigError, match="read-only filesystem") as e:
            check_output_dir(mnt / "run", "train.run_dir")
        assert e.value.field == "train.run_dir" and "\n" not in str(e.value)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
