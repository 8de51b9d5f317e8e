"""Asynchronous checkpoints resume exactly like synchronous ones (fp32 CPU, identical losses)."""

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import scaletrain.models.transformer as transformer
from scaletrain.checkpoint import list_checkpoints
from scaletrain.config import load_config
from scaletrain.parallel.launch import spawn
from scaletrain.trainer import train

pytestmark = pytest.mark.slow


def _job(tmp_path, name, *extra):
    return load_config(None, _job_args(tmp_path, name, *extra))


def _job_args(tmp_path, name, *extra):
    return [
        "--model.name=tiny",
        "--batch.seq_len=32",
        "--batch.global_batch=8",
        "--batch.micro_batch=8",
        "--train.steps=6",
        "--train.eval_every=1000",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--data.num_tokens=60000",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / name}",
        "--checkpoint.every=2",
        "--checkpoint.keep_last_n=3",
        *extra,
    ]


def test_async_save_resumes_to_the_synchronous_losses_and_weights(tmp_path):
    sync = train(_job(tmp_path, "sync"))
    # steps 1-3 with asynchronous saves at 2 (mid-run: step 3 trains while it is written) and 3
    first = train(_job(tmp_path, "async", "--checkpoint.async_save=true"), max_steps=3)
    ckpts = list_checkpoints(tmp_path / "async" / "checkpoints")
    assert [p.name for p in ckpts] == ["step_00000002", "step_00000003"]  # both published
    assert not list((tmp_path / "async" / "checkpoints").glob(".tmp-*"))
    # resume from the mid-run one: had step 3's update leaked into it, losses would differ
    shutil.rmtree(ckpts[-1])
    second = train(_job(tmp_path, "async", "--checkpoint.async_save=true"))
    assert first.losses[:2] + second.losses == sync.losses  # exact equality, not approx
    assert second.steps == 6
    for a, b in zip(sync.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert list_checkpoints(tmp_path / "async" / "checkpoints")[-1].name == "step_00000006"


def test_spike_right_after_an_async_save_rolls_back_to_it(tmp_path, monkeypatch):
    """The step after the step-8 save spikes while that save may still be in flight: the
    rollback waits for it, restores step 8, and the run matches the synchronous one exactly."""
    real, calls = transformer.linear_cross_entropy, {"n": 0}

    def spike_at_step_9(hidden, weight, targets, **kw):
        calls["n"] += 1
        loss = real(hidden, weight, targets, **kw)
        return loss * 10.0 if calls["n"] == 9 else loss

    # the model's fused head + loss (`Transformer.head_loss`, bound when the model is built)
    monkeypatch.setattr(transformer, "linear_cross_entropy", spike_at_step_9)
    guard = [
        "--train.steps=10",
        "--checkpoint.every=4",
        "--guard.window=6",
        "--guard.min_history=4",
        "--guard.skip_steps=2",
    ]
    sync = train(_job(tmp_path, "sync", *guard))
    calls["n"] = 0
    asyn = train(_job(tmp_path, "async", *guard, "--checkpoint.async_save=true"))
    assert sync.rollbacks == asyn.rollbacks == 1
    events = (tmp_path / "async" / "guard.jsonl").read_text()
    assert '"restored_step": 8' in events
    assert asyn.losses == sync.losses


def _sync_then_async_split(sync_args, async_args, ckpt_dir):
    """On every rank: straight synchronous run; asynchronous run stopped after 3 steps, its
    step-3 checkpoint dropped, resumed from the mid-run (step-2) one. Both loss lists."""
    straight = train(load_config(None, sync_args)).losses
    first = train(load_config(None, async_args), max_steps=3).losses
    if dist.get_rank() == 0:
        shutil.rmtree(Path(ckpt_dir) / "step_00000003")
    dist.barrier()
    second = train(load_config(None, async_args)).losses
    return straight, first[:2] + second


@pytest.mark.distributed
def test_async_save_under_fsdp2_on_two_ranks_resumes_exactly(tmp_path):
    """ZeRO-3 (FSDP2): DTensor shards staged and written by a background thread on its own
    gloo group, while the training step's collectives run on the default group."""
    layout = ["--parallel.dp=2", "--parallel.zero=3", "--batch.micro_batch=4", "--train.steps=4"]
    sync_args = _job_args(tmp_path, "sync", *layout)
    async_args = _job_args(tmp_path, "async", *layout, "--checkpoint.async_save=true")
    for straight, resumed in spawn(
        _sync_then_async_split, 2, sync_args, async_args, str(tmp_path / "async" / "checkpoints")
    ):
        assert resumed == straight  # exact, on every rank
