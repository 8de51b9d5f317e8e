"""Rank functions for the operations tests (module-level, so `spawn` can import them)."""

from __future__ import annotations

import torch.distributed as dist

from scaletrain.config import load_config
from scaletrain.trainer import train


def train_with_rank_overrides(overrides: list[str], per_rank: dict[int, list[str]]) -> int:
    """Train one job where some ranks add their own overrides (a slow data source on one
    rank: `--data.delay_s`, a per-rank setting that changes no numerics); returns steps."""
    extra = per_rank.get(dist.get_rank(), [])
    return train(load_config(None, [*overrides, *extra])).steps
