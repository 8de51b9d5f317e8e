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
    validation loss, end-of-run sample)."""
    out = {}
    for name, args in jobs.items():
        r = train(load_config(None, args))
        out[name] = (r.losses, r.val_loss, r.sample)
    return out
