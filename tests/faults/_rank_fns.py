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


class _Unpicklable(RuntimeError):
    def __init__(self, msg: str):
        super().__init__(msg)
        self.hook = lambda: None  # a lambda cannot be pickled


def unpicklable_error_on_rank1() -> int:
    if dist.get_rank() == 1:
        raise _Unpicklable("rank 1 broke in an odd way")
    dist.barrier()
    return 0


def exit_on_rank1() -> int:
    """Rank 1 dies without a Python exception (as an os._exit or a crash would)."""
    import os

    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()
    return 0
