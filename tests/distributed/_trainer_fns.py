from scaletrain.config import load_config
from scaletrain.trainer import train


def train_losses(overrides):
    r = train(load_config(None, overrides))
    return r.losses
