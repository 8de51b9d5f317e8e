"""Loss-spike guard: roll back to the last good checkpoint, skip the data, stop if hopeless."""

import json

import pytest

import scaletrain.models.transformer as transformer
from scaletrain.config import load_config
from scaletrain.trainer import train
from scaletrain.trainer.guard import TooManyRollbacks

pytestmark = pytest.mark.slow


def _job(tmp_path, *extra):
    return load_config(
        None,
        [
            "--model.name=tiny",
            "--batch.seq_len=32",
            "--batch.global_batch=4",
            "--batch.micro_batch=4",
            "--train.steps=30",
            "--train.eval_every=1000",
            "--train.sample_tokens=0",
            "--train.progress=false",
            "--train.tensorboard=false",
            "--data.num_tokens=60000",
            f"--data.cache_dir={tmp_path / 'cache'}",
            f"--train.run_dir={tmp_path / 'run'}",
            "--checkpoint.every=10",
            "--guard.window=10",
            "--guard.min_history=5",
            "--guard.skip_steps=7",
            *extra,
        ],
    )


def _inject(monkeypatch, bad_calls, factor):
    """Multiply the loss of the given forward calls (1-based) by `factor`."""
    real = transformer.linear_cross_entropy  # the model's fused head + loss (`head_loss`)
    calls = {"n": 0}

    def spiky(hidden, weight, targets, **kw):
        calls["n"] += 1
        loss = real(hidden, weight, targets, **kw)
        return loss * factor if calls["n"] in bad_calls else loss

    monkeypatch.setattr(transformer, "linear_cross_entropy", spiky)


def test_spike_rolls_back_and_skips_data(tmp_path, monkeypatch):
    _inject(monkeypatch, {25}, 10.0)  # the 25th training forward = step 25
    r = train(_job(tmp_path))
    assert r.steps == 30 and r.rollbacks == 1
    events = [json.loads(line) for line in (tmp_path / "run" / "guard.jsonl").open()]
    assert len(events) == 1
    e = events[0]
    assert e["spike_step"] == 25 and e["restored_step"] == 20
    assert e["skipped_data_steps"] == [20, 32]  # steps 20..24 redone on fresh data, +7 skipped
    assert max(r.losses) < 10  # the spiked loss never became an applied step
    assert len(r.losses) == 24 + 10  # 24 applied before the spike, 20 -> 30 after the rollback


def test_non_finite_loss_is_a_spike_even_without_history(tmp_path, monkeypatch):
    _inject(monkeypatch, {3}, float("nan"))
    r = train(_job(tmp_path, "--train.steps=12"))
    assert r.rollbacks == 1 and r.steps == 12
    assert all(x == x for x in r.losses)  # no NaN was ever applied


def test_too_many_rollbacks_stop_with_a_clear_message(tmp_path, monkeypatch):
    _inject(monkeypatch, set(range(3, 100)), float("inf"))
    with pytest.raises(TooManyRollbacks, match="guard.max_rollbacks"):
        train(_job(tmp_path, "--guard.max_rollbacks=2"))


def test_out_of_memory_writes_a_report_and_keeps_the_checkpoint(tmp_path, monkeypatch, capsys):
    from scaletrain.cli import main

    args = [
        "train",
        "--model.name=tiny",
        "--batch.seq_len=32",
        "--batch.global_batch=4",
        "--batch.micro_batch=4",
        "--train.steps=6",
        "--train.progress=false",
        "--train.sample_tokens=0",
        "--data.num_tokens=60000",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / 'run'}",
        "--checkpoint.every=2",
    ]
    real = transformer.linear_cross_entropy
    calls = {"n": 0}

    def hungry(hidden, weight, targets, **kw):
        calls["n"] += 1
        if calls["n"] == 4:
            raise MemoryError("simulated host OOM")
        return real(hidden, weight, targets, **kw)

    monkeypatch.setattr(transformer, "linear_cross_entropy", hungry)
    assert main(args) == 3
    err = capsys.readouterr().err
    assert "out of memory at step 4" in err and "checkpoint is untouched" in err
    report = json.loads((tmp_path / "run" / "oom_report_rank0.json").read_text())
    assert report["step"] == 4 and report["measured"]["params"] > 0 and report["advice"]
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts == ["step_00000002"]  # the last good checkpoint, untouched
