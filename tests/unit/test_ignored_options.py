"""Options a job sets that its layout never reads are named once at the start."""

from __future__ import annotations

import pytest

from scaletrain.config import load_config
from scaletrain.config.layout_options import ignored_options


@pytest.mark.parametrize(
    ("args", "world", "named"),
    [
        (["--parallel.sp=true"], 1, "parallel.sp"),
        (["--precision.fp8_all_gather=true"], 1, "precision.fp8_all_gather"),
        (["--precision.fp8_amax=delayed"], 1, "precision.fp8_amax"),
        (["--precision.grad_compression=powersgd"], 1, "precision.grad_compression"),
        (["--precision.reduce_dtype=bf16", "--parallel.dp=2"], 2, "precision.reduce_dtype"),
    ],
)
def test_an_option_that_does_nothing_is_named(args, world, named):
    job = load_config(None, [*args, "--batch.micro_batch=8"])
    notes = ignored_options(job, job.layout(world))
    assert len(notes) == 1 and notes[0].startswith(named) and "does nothing" in notes[0]


@pytest.mark.parametrize(
    ("args", "world"),
    [
        ([], 1),  # defaults name nothing
        (["--parallel.tp=2", "--parallel.sp=true"], 2),
        (["--precision.dtype=fp8", "--precision.fp8_amax=delayed"], 1),
        (["--precision.grad_compression=powersgd", "--parallel.dp=2"], 2),
        (
            ["--precision.dtype=bf16", "--precision.reduce_dtype=bf16"]
            + ["--parallel.dp=2", "--parallel.zero=3"],
            2,
        ),
    ],
)
def test_options_that_act_are_not_named(args, world):
    job = load_config(None, [*args, "--batch.micro_batch=8"])
    assert ignored_options(job, job.layout(world)) == []


def test_train_says_it_at_the_start(tmp_path, capsys):
    from scaletrain.cli import main

    from ..faults._cli import tiny_job

    main(["train", *tiny_job(tmp_path), "--parallel.sp=true"])
    out = capsys.readouterr().out
    assert sum("note: parallel.sp=true does nothing" in ln for ln in out.splitlines()) == 1
