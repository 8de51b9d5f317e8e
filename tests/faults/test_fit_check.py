"""A single-process run the planner says cannot fit is refused before allocating, naming the
estimate, the memory available and train.force; train.force=true trains anyway with a warning."""

from __future__ import annotations

import time

import pytest

from scaletrain.config import ConfigError, load_config
from scaletrain.orchestrate import available_memory, fit_check

from ._cli import no_traceback, scaletrain

GiB = 2.0**30


@pytest.mark.parametrize(
    ("args", "avail_gib"),
    [
        (["--model.name=llama2-7b"], 24.0),  # ~27 GB of fp32 weights alone
        (["--model.name=llama2-7b", "--memory.ac=full", "--batch.micro_batch=1"], 64.0),
        (["--model.name=gpt2-124m"], 0.5),
        (["--model.name=tiny-llama"], 1e-4),
    ],
)
def test_does_not_fit_is_refused_naming_train_force(args, avail_gib):
    job = load_config(None, args)
    with pytest.raises(ConfigError) as e:
        fit_check(job, (avail_gib * GiB, "host memory (test)"))
    msg = str(e.value)
    assert e.value.field == "train.force" and "\n" not in msg
    assert "short by" in msg and "planner" in msg and "train.force=true" in msg


@pytest.mark.parametrize("args", [["--model.name=llama2-7b"], ["--model.name=gpt2-124m"]])
def test_force_trains_anyway_with_a_warning(args):
    job = load_config(None, [*args, "--train.force=true"])
    line = fit_check(job, (0.25 * GiB, "host memory (test)"))
    assert line.startswith("warning: train.force=true") and "short by" in line


def test_a_fitting_run_reports_its_margin():
    job = load_config(None, ["--model.name=tiny-llama"])
    line = fit_check(job, (8 * GiB, "host memory (test)"))
    assert line.startswith("fit check:") and "margin" in line


def test_available_memory_is_positive():
    avail, where = available_memory("cpu")
    assert avail > 0 and where


@pytest.mark.slow
def _refused_line(tmp_path, *args: str) -> str:
    """`scaletrain train ARGS` refused before allocating: exit 2, one line naming train.force,
    within 100 s (not a rank killed minutes later), nothing written; that line."""
    t0 = time.monotonic()
    p = scaletrain(
        "train",
        *args,
        f"--train.run_dir={tmp_path / 'run'}",
        f"--data.cache_dir={tmp_path / 'c'}",
        timeout=120,
    )
    assert p.returncode == 2 and no_traceback(p), p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "train.force" in err[0] and "GiB" in err[0], err
    assert time.monotonic() - t0 < 100
    assert not (tmp_path / "run" / "checkpoints").exists()
    return err[0]


def test_cli_refuses_llama2_7b_before_allocating(tmp_path):
    _refused_line(tmp_path, "--model.name=llama2-7b", "--train.device=cpu")


def test_local_ranks_add_up_against_the_host():
    """Ranks on one CPU host share its memory: 4 local ranks need about 4 x one rank's peak,
    and the refusal does not suggest more local ranks (they would fail the same way)."""
    job = load_config(None, ["--model.name=gpt2-124m", "--parallel.dp=4", "--batch.micro_batch=4"])
    one = fit_check(job, (1e6 * GiB, "host memory (test)"), world_size=4, local_ranks=1)
    four = fit_check(job, (1e6 * GiB, "host memory (test)"), world_size=4, local_ranks=4)
    assert "4 of them on this host" in four and "4 of them" not in one
    per_rank = float(one.split("each of the 4 ranks at ")[1].split(" GiB")[0])
    summed = float(four.split("on this host: ")[1].split(" GiB")[0])
    assert summed == pytest.approx(4 * per_rank, rel=0.01)
    with pytest.raises(ConfigError) as e:
        fit_check(job, (1.5 * per_rank * GiB, "host memory (test)"), world_size=4, local_ranks=4)
    assert "--nproc" not in str(e.value) and "more hosts" in str(e.value)
    # each GPU is its own: the same job fits 4 GPUs holding one rank's peak each
    gpu = fit_check(job, (1.5 * per_rank * GiB, "GPU test (free)"), world_size=4, local_ranks=4)
    assert gpu.startswith("fit check:")


@pytest.mark.slow
def test_nproc_refused_before_spawning(tmp_path):
    """`--nproc 8` of llama3-8b on this host: one line with the summed figures, in seconds,
    not a rank killed by the kernel minutes later."""
    line = _refused_line(tmp_path, "--model.name=llama3-8b", "--nproc=8")
    assert "8 of them on this host" in line and "--nproc" not in line
