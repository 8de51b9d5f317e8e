from scaletrain.config import load_config
from scaletrain.trainer import train


def train_losses(overrides):
    r = train(load_config(None, overrides))
    return r.losses


def train_losses_partial(overrides, steps):
    """Train `steps` steps and stop (saving a checkpoint), as if the job had been preempted."""
    return train(load_config(None, overrides), max_steps=steps).losses
