"""Save under one layout, resume under another: the run continues as if uninterrupted."""

import shutil

import pytest

from scaletrain.config import load_config
from scaletrain.parallel.launch import spawn
from scaletrain.trainer import train

from ._trainer_fns import train_losses, train_losses_partial

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _args(tmp_path, run, *extra):
    return [
        "--model.name=tiny-llama",
        "--batch.seq_len=32",
        "--batch.global_batch=8",
        "--batch.micro_batch=2",
        "--train.steps=6",
        "--train.eval_every=1000",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--data.num_tokens=60000",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / run}",
        "--optim.warmup_steps=0",
        "--model.tie_embeddings=false",
        "--guard.enabled=false",
        *extra,
    ]


def test_fsdp2_checkpoint_resumes_under_tp2_and_on_one_rank(tmp_path):
    straight = train(load_config(None, _args(tmp_path, "straight"))).losses
    # steps 1-3 under FSDP (zero3) on 2 ranks, then steps 4-6 under TP 2
    first = spawn(
        train_losses_partial, 2, _args(tmp_path, "a", "--parallel.dp=2", "--parallel.zero=3"), 3
    )[0]
    # the same FSDP checkpoint, kept aside for the single-process resume below
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    second = spawn(train_losses, 2, _args(tmp_path, "a", "--parallel.tp=2"))[0]
    assert first + second == pytest.approx(straight, abs=1e-5, rel=0)
    # resumed by a single process (4 ranks -> 1 is the same path)
    alone = train(load_config(None, _args(tmp_path, "b"))).losses
    assert alone == pytest.approx(straight[3:], abs=1e-5, rel=0)
