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
    many layouts: start-up dominates these tiny runs); per-step losses keyed by name."""
    return {name: train(load_config(None, args)).losses for name, args in jobs.items()}
