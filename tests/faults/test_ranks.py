"""An error inside `--nproc N` ranks reads as it does in one process: the first failing rank's
one line, once; its peers are stopped, not left waiting in a collective."""

from __future__ import annotations

import time

import pytest

from scaletrain.config import ConfigError
from scaletrain.parallel.launch import spawn

from . import _rank_fns
from ._cli import no_traceback, scaletrain, tiny_job


@pytest.mark.slow
def test_a_ranks_config_error_reaches_the_parent_as_itself():
    # rank 1 fails while rank 0 waits for it in a collective (rank 0 failing first: below)
    rank = 1
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        spawn(_rank_fns.config_error_on, 2, rank)
    assert e.value.field == "data.source" and "\n" not in str(e.value)
    assert f"rank {rank}" in str(e.value.__cause__)  # the rank's traceback, kept as the cause
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_the_first_failing_rank_is_reported():
    with pytest.raises(ConfigError, match="rank 0 says no"):
        spawn(_rank_fns.config_error_everywhere, 2)


@pytest.mark.slow
def test_cli_nproc_error_inside_the_ranks_is_one_line(tmp_path):
    # the resume target's contents are checked inside the ranks (after the group is joined)
    empty = tmp_path / "empty"
    empty.mkdir()
    p = scaletrain(
        "train",
        "--nproc",
        "2",
        *tiny_job(tmp_path, "run", f"--checkpoint.resume={empty}", "--batch.micro_batch=1"),
        timeout=180,
    )
    assert p.returncode != 0 and no_traceback(p), p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and str(empty) in err[0], err


@pytest.mark.slow
def test_an_error_that_cannot_travel_comes_back_as_its_traceback():
    with pytest.raises(RuntimeError, match="rank 1 broke in an odd way") as e:
        spawn(_rank_fns.unpicklable_error_on_rank1, 2)
    assert "on rank 1" in str(e.value)


@pytest.mark.slow
def test_a_rank_that_dies_silently_ends_the_run_not_hangs():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exit code 3"):
        spawn(_rank_fns.exit_on_rank1, 2)
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_nproc_finished_run_redirect_is_said_once_and_every_rank_follows_it(tmp_path):
    """Issue #41 item 6: running a finished `--nproc` run again printed its redirect
    (run -> run-2) once per rank. Rank 0 says it; every rank trains in the same sibling."""
    job = tiny_job(tmp_path, "run", "--batch.micro_batch=1")
    first = scaletrain("train", "--nproc", "2", *job, timeout=180)
    assert first.returncode == 0, first.stderr[-2000:]
    again = scaletrain("train", "--nproc", "2", *job, timeout=180)
    assert again.returncode == 0, again.stderr[-2000:]
    said = [x for x in (again.stdout + again.stderr).splitlines() if "holds a finished run" in x]
    assert len(said) == 1 and said[0].endswith(f"training again in {tmp_path / 'run'}-2"), said
    assert (tmp_path / "run-2" / "checkpoints").is_dir() and not (tmp_path / "run-3").exists()
