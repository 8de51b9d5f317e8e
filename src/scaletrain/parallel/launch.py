"""Spawn a function on N local gloo ranks and collect each rank's return value.

Used by parity tests, benchmarks and `scaletrain train --nproc N` on a laptop: the same code path
as torchrun (env:// rendezvous on loopback), without a separate launcher process.
"""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["free_port", "spawn"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, out_dir: str, fn: Callable[..., Any],
            args: tuple, threads: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size))
    torch.set_num_threads(threads)
    out = Path(out_dir) / f"rank{rank}.pt"
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        result = fn(*args)
        torch.save({"ok": True, "result": result}, out)
    except BaseException:  # report every failure to the parent, then re-raise
        torch.save({"ok": False, "error": traceback.format_exc()}, out)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, threads: int = 1) -> list[Any]:
    """Run `fn(*args)` on `world_size` gloo ranks; return the per-rank results (rank order).

    `fn` must be importable (module-level) and its results torch.save-able. A failure on any rank
    raises RuntimeError carrying that rank's traceback.
    """
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_worker, args=(world_size, free_port(), tmp, fn, args, threads),
                                 nprocs=world_size, join=False, start_method="spawn")
        try:
            while not ctx.join():
                pass
        except Exception as e:
            errors = []
            for r in range(world_size):
                p = Path(tmp) / f"rank{r}.pt"
                if p.exists():
                    rec = torch.load(p, weights_only=False)
                    if not rec["ok"]:
                        errors.append(f"rank {r}:\n{rec['error']}")
            raise RuntimeError("distributed run failed\n" + "\n".join(errors or [str(e)])) from e
        results = []
        for r in range(world_size):
            rec = torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False)
            results.append(rec["result"])
        return results
