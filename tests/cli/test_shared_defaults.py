"""One flag set and one set of defaults for plan / explain / dryrun / train (cli/_job.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scaletrain.cli import dryrun as dryrun_cli
from scaletrain.cli import main
from scaletrain.cli import plan as plan_cli
from scaletrain.cli._fields_help import field_docs, fields_help
from scaletrain.cli._job import resolve_job
from scaletrain.cli._verdict import verdict_line
from scaletrain.config import BatchConfig, JobConfig, hardware_preset
from scaletrain.config.job import SECTIONS

ROOT = Path(__file__).resolve().parents[2]


def _flags(module, name: str) -> set[str]:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser, name)
    return {o for a in parser._actions for o in a.option_strings}


def test_plan_and_dryrun_share_the_job_flags() -> None:
    plan_only = {
        "--json",
        "--top",
        "--plot",
        "--tokens",
        "--preflight",
        "--verify",
        "--recipe",  # what a framework allocates: a planning question
        "--comm-overlap",  # what a framework's run overlaps (with --recipe)
        # price and energy inputs ([hardware]): they change no run
        "--usd-per-gpu-hour",
        "--efficiency",
        "--pue",
        "--grid-co2",
        "--host-watts",
        "--storage-gb-per-s",  # the input rate's margin (explain)
        # the seeds' textbook memory printed beside the plan
        "--convention",
        "--params",
        "--ckpt-every",
        # what-ifs of the device: one plan per value of a [hardware] figure
        "--sweep",
        # efficiency constants a run measured, for the planner's time model
        "--calibration",
    }
    job_flags = _flags(plan_cli, "plan") - plan_only
    assert job_flags <= _flags(dryrun_cli, "dryrun")


def test_plan_and_dryrun_resolve_the_same_job() -> None:
    argv = [
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--gpu",
        "h100-sxm",
        "--dp",
        "8",
        "--zero",
        "3",
        "--seq-len",
        "8192",
        "--global-batch",
        "64",
    ]
    parser = argparse.ArgumentParser()
    dryrun_cli.add_arguments(parser)
    job, world = dryrun_cli.job_from_args(parser.parse_args(argv))
    p = argparse.ArgumentParser()
    plan_cli.add_arguments(p, "explain")
    args = p.parse_args(argv)
    args.command = "explain"
    inp = plan_cli._inputs(args)
    assert world == inp["gpus"] == 8
    assert job.batch.micro_batch == inp["micro_batch"] == 8  # 64 / dp 8, no accumulation
    assert job.precision.dtype == inp["precision"] == "bf16"  # derived from the H100


def test_default_job_is_train_defaults_and_nothing_is_derived() -> None:
    res = resolve_job(None, [], world_size=1)
    assert res.job == JobConfig()
    assert res.notes() == []


def test_micro_batch_is_derived_from_world_size_and_said() -> None:
    res = resolve_job(None, [], world_size=2)
    assert res.job.batch.micro_batch == BatchConfig().global_batch // 2
    assert any(n.startswith("batch.micro_batch = 8 (derived") for n in res.notes())
    res.job.layout(2)  # legal for the world it was derived for


def test_global_batch_rises_to_a_multiple_of_dp() -> None:
    res = resolve_job(None, ["--parallel.dp=3"], world_size=3)
    assert res.job.batch.global_batch == 18 and res.job.batch.micro_batch == 6
    res.job.layout(3)


def test_pipeline_gets_enough_micro_batches() -> None:
    res = resolve_job(
        None, ["--model.name=tiny-llama", "--parallel.pp=2", "--parallel.dp=1"], world_size=2
    )
    assert res.job.batch.global_batch // res.job.batch.micro_batch >= 2
    res.job.layout(2)


def test_given_values_are_never_replaced() -> None:
    res = resolve_job(
        None,
        [
            "--batch.micro_batch=4",
            "--batch.global_batch=16",
            "--hardware.gpu=h100-sxm",
            "--precision.dtype=fp32",
        ],
        world_size=2,
    )
    assert res.job.batch.micro_batch == 4 and res.job.precision.dtype == "fp32"
    assert res.notes() == []


def test_vocab_size_follows_a_bpe_tokenizer() -> None:
    res = resolve_job(None, ["--data.tokenizer=bpe", "--data.bpe_vocab_size=512"], world_size=1)
    assert res.job.model.vocab_size == 512
    assert any("model.vocab_size = 512" in n for n in res.notes())
    pinned = resolve_job(None, ["--data.tokenizer=bpe", "--model.vocab_size=1024"], world_size=1)
    assert pinned.job.model.vocab_size == 1024


def test_world_size_comes_from_the_config_degrees() -> None:
    res = resolve_job(ROOT / "configs/llama3-8b-h100.toml", {})
    assert res.world_size == 8 and res.job.batch.micro_batch == 1


@pytest.mark.parametrize(
    "delta,word,margin",
    [
        (-10 * 2**30, "fits", "10.00 GiB to spare"),
        (10 * 2**30, "DOES NOT FIT", "10.00 GiB over"),
        (-5 * 2**20, "fits", "5.00 MiB to spare"),
    ],
)
def test_verdict_line_states_the_margin(delta: float, word: str, margin: str) -> None:
    hw = hardware_preset("h100-sxm")
    line = verdict_line(hw.memory_bytes + delta, hw, what="x")
    # binary units (config.units): 79.10 GiB is what CUDA reports on an H100 80GB
    assert line.startswith(f"verdict: {word} on h100-sxm (79.10 GiB): x ")
    assert line.endswith(margin)


def test_explain_ends_with_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "explain",
            "--model",
            "llama3-8b",
            "--gpus",
            "8",
            "--gpu",
            "h100-sxm",
            "--dp",
            "8",
            "--zero",
            "3",
            "--ac",
            "full",
            "--seq-len",
            "8192",
            "--global-batch",
            "64",
            "--micro-batch",
            "1",
        ]
    )
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("verdict: fits on h100-sxm") and "GiB to spare" in last


def test_train_help_lists_every_section_and_field(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for section, cls in SECTIONS.items():
        assert f"[{section}]" in out
        for name in cls.__dataclass_fields__:
            assert f"  {name} = " in out
    assert "  global_batch = 16" in out
    assert "Sequences per optimizer step" in out  # BatchConfig.global_batch's docstring


def test_field_docs_read_the_attribute_docstrings() -> None:
    docs = field_docs(BatchConfig)
    assert docs["micro_batch"].startswith("Sequences per forward/backward on one rank")
    assert all(len(line) <= 80 for line in fields_help().splitlines())
