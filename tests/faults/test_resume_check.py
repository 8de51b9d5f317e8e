"""A resume compares the saved config with the new one before loading any tensor."""

from __future__ import annotations

import json

import pytest

from scaletrain.config import ConfigError, load_config
from scaletrain.trainer.resume_check import check_resume

from ._cli import digests, lost, no_traceback, scaletrain, tiny_job

BASE = [
    "--model.name=tiny-llama",
    "--batch.seq_len=16",
    "--batch.global_batch=4",
    "--batch.micro_batch=2",
]


def _fake_ckpt(tmp_path, args):
    job = load_config(None, args)
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000002"
    ckpt.mkdir(parents=True)
    (tmp_path / "run" / "config.json").write_text(json.dumps(job.to_dict()))
    (ckpt / "trainer_state.json").write_text(json.dumps({"model": job.model.to_dict()}))
    return ckpt


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (["--batch.seq_len=8"], "batch.seq_len: 16 -> 8"),
        (["--optim.name=sgd"], "optim.name: 'adamw' -> 'sgd'"),
        (["--model.num_layers=1"], "model.num_layers"),
        (["--model.dim=32", "--model.num_heads=2", "--model.num_kv_heads=2"], "model.dim"),
        (["--model.name=gpt-mini"], "model.position"),
        (["--model.rope_theta=500.0"], "model.rope_theta"),
    ],
)
def test_refused_changes_are_named(tmp_path, change, named):
    ckpt = _fake_ckpt(tmp_path, BASE)
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")) as e:
        check_resume(ckpt, load_config(None, [*BASE, *change]))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "change",
    [
        [],
        ["--parallel.tp=2"],
        ["--parallel.dp=2"],
        ["--batch.global_batch=8"],
        ["--optim.lr=1e-4"],
        ["--train.steps=50"],
        ["--train.seed=3"],
    ],
)
def test_allowed_changes_pass(tmp_path, change):
    ckpt = _fake_ckpt(tmp_path, BASE)
    check_resume(ckpt, load_config(None, [*BASE, *change]))


@pytest.mark.slow
def test_cli_resume_with_another_seq_len_is_one_line(tmp_path):
    assert scaletrain("train", *tiny_job(tmp_path, "run")).returncode == 0
    p = scaletrain("train", *tiny_job(tmp_path, "run", "--train.steps=4", "--batch.seq_len=8"))
    assert p.returncode == 2 and no_traceback(p), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "batch.seq_len: 16 -> 8" in p.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "field"),
    [("--batch.global_batch=4", "batch.global_batch"), ("--data.seed=7", "data.seed")],
)
@pytest.mark.fault("resume_data_change")
def test_resume_with_changed_data_settings_is_one_line_naming_the_field(tmp_path, change, field):
    """The saved data position means another stream under another global batch or seed: the
    resume is refused in one line naming the field (exit 2), the checkpoint untouched."""
    first = scaletrain("train", *tiny_job(tmp_path, "run"))
    assert first.returncode == 0, first.stderr
    before = digests(tmp_path / "run")
    again = scaletrain("train", *tiny_job(tmp_path, "run", "--train.steps=4", change))
    assert again.returncode == 2 and no_traceback(again), again.stderr
    err = again.stderr.strip().splitlines()
    assert len(err) == 1 and field in err[0] and "new run_dir" in err[0], err
    assert lost(before, tmp_path / "run") == []  # the checkpoint and logs, byte for byte


@pytest.mark.fault("resume_data_change")
def test_negative_data_seed_is_one_line():
    with pytest.raises(ConfigError, match="data.seed"):
        load_config(None, ["--data.seed=-1"])


def _metric_losses(run_dir) -> dict[int, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


RESHARD_JOB = [
    "--batch.seq_len=32",
    "--batch.global_batch=8",
    "--batch.micro_batch=2",
    "--data.num_tokens=60000",
    "--optim.schedule=constant",  # the same lr at step 4 whether the run ends at 3 or 6
    "--model.tie_embeddings=false",
    "--train.log_every=1",
]


@pytest.fixture(scope="module")
def straight_losses(tmp_path_factory) -> dict[int, float]:
    """The uninterrupted single-process run both reshard directions continue (one CLI run)."""
    tmp = tmp_path_factory.mktemp("straight")
    p = scaletrain("train", *tiny_job(tmp, "straight", *RESHARD_JOB, "--train.steps=6"))
    assert p.returncode == 0, p.stderr[-2000:]
    return _metric_losses(tmp / "straight")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    ("before", "after"),
    [("--parallel.dp=2", "--parallel.tp=2"), ("--parallel.tp=2", "--parallel.dp=2")],
    ids=["tp1-to-tp2", "tp2-to-tp1"],
)
@pytest.mark.fault("layout_resume")
def test_nproc_resume_under_another_tp_degree_continues_the_losses(
    tmp_path, straight_losses, before, after
):
    """A checkpoint saved under --nproc 2 at one TP degree resumes at the other (DCP reshards
    the saved tensors to the new placements): no refusal, and steps 4-6 match an uninterrupted
    single-process run. Tolerance 1e-5 absolute, as the in-process reshard test
    (tests/distributed/test_reshard_resume.py): fp32 losses near 5 whose layouts reduce in
    other orders (one ulp 5e-7) over 6 AdamW steps."""
    first = scaletrain(
        "train", *tiny_job(tmp_path, "run", *RESHARD_JOB, "--train.steps=3", before), "--nproc=2"
    )
    assert first.returncode == 0, first.stderr[-2000:]
    again = scaletrain(
        "train", *tiny_job(tmp_path, "run", *RESHARD_JOB, "--train.steps=6", after), "--nproc=2"
    )
    assert again.returncode == 0 and no_traceback(again), again.stderr[-2000:]
    assert "resuming from" in again.stdout and "step_00000003" in again.stdout, again.stdout[-2000:]
    want, got = straight_losses, _metric_losses(tmp_path / "run")
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    for step in (4, 5, 6):
        assert got[step] == pytest.approx(want[step], abs=1e-5, rel=0), (step, got, want)
