"""Functions run on spawned ranks by test_ranks.py (importable by the children)."""

from __future__ import annotations

import time

import torch.distributed as dist

from scaletrain.config import ConfigError


def config_error_on(rank: int) -> int:
    """`rank` fails with a ConfigError; its peers wait in a collective (and are stopped)."""
    if dist.get_rank() == rank:
        raise ConfigError("data.source", "x.jsonl", "no such file")
    dist.barrier()
    return 0


def config_error_everywhere() -> int:
    """Every rank fails with the same ConfigError (a check every rank makes)."""
    time.sleep(0.05 * dist.get_rank())
    raise ConfigError("model.dim", 7, f"rank {dist.get_rank()} says no")
