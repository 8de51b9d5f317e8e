from scaletrain.config import load_config
from scaletrain.trainer import train


def train_losses(overrides):
    r = train(load_config(None, overrides))
    return r.losses


def train_losses_partial(overrides, steps):
    """Train `steps` steps and stop (saving a checkpoint), as if the job had been preempted."""
    return train(load_config(None, overrides), max_steps=steps).losses


def train_many(jobs):
    """Train each name -> overrides job in turn on the same process group (one spawn for
    many layouts: start-up dominates these tiny runs); per name, (per-step losses, final
    validation loss, end-of-run sample, saved-activation bytes measured for one micro-batch)."""
    out = {}
    for name, args in jobs.items():
        r = train(load_config(None, args))
        out[name] = (r.losses, r.val_loss, r.sample, r.measured.get("activations"))
    return out


def small_job(tmp_path, run, *extra):
    """Overrides of a 4-step tiny-llama job (seq 32, global batch 8 in micro-batches of 2)
    writing to tmp_path/run."""
    return [
        "--model.name=tiny-llama",
        "--batch.seq_len=32",
        "--batch.global_batch=8",
        "--batch.micro_batch=2",
        "--train.steps=4",
        "--train.eval_every=1000",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--data.num_tokens=60000",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / run}",
        "--optim.warmup_steps=0",
        "--guard.enabled=false",
        *extra,
    ]


def straight_and_resumed(tmp_path, extra, stop):
    """(losses of a straight `small_job` run, the same run stopped after `stop` steps and
    resumed from its checkpoint): every rank of the process group takes part."""
    import torch.distributed as dist

    straight = train_losses(small_job(tmp_path, "straight", *extra))
    first = train_losses_partial(small_job(tmp_path, "resumed", *extra), stop)
    dist.barrier()
    return straight, first + train_losses(small_job(tmp_path, "resumed", *extra))


def train_evals(jobs):
    """Train each name -> overrides job in turn on the same process group; per name, (final
    validation loss, final loss per data.eval_sources set)."""
    out = {}
    for name, args in jobs.items():
        r = train(load_config(None, args))
        out[name] = (r.val_loss, r.eval_losses)
    return out
