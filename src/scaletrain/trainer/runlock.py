"""One training per run directory: a lock file holding the owner's pid and host.

Two trainings writing one run directory delete each other's in-flight checkpoints (each save
clears `.tmp-*` leftovers it takes for a dead writer's) and interleave metrics. The lock is
`RUN/.lock` created with O_EXCL; a lock whose pid is dead on this host is stale (the process
was killed, or torchrun restarted the worker) and is taken over. A lock from another host
cannot be checked from here, so it refuses and says which file to delete. Rank 0 holds the
lock for the whole job; `release_held` runs when `train` returns (and at interpreter exit).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
from pathlib import Path

from scaletrain.config import ConfigError
from scaletrain.data.stale_writes import pid_alive

__all__ = ["acquire", "release_held", "LOCK_NAME"]

LOCK_NAME = ".lock"
_held: list[Path] = []


def _owner(lock: Path) -> dict | None:
    try:
        rec = json.loads(lock.read_text())
        return rec if isinstance(rec.get("pid"), int) and isinstance(rec.get("host"), str) else None
    except (OSError, ValueError, AttributeError):
        return None  # half-written by a process that died while creating it


def acquire(run_dir: str | Path, *, enabled: bool = True) -> None:
    """Take `run_dir`'s lock (creating the directory) or raise a one-line ConfigError."""
    if not enabled:
        return
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock, me = run_dir / LOCK_NAME, {"pid": os.getpid(), "host": socket.gethostname()}
    for _ in range(3):  # a stale lock removed here may be raced by another starter
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = _owner(lock)
            stale = owner is None or (
                owner["host"] == me["host"]
                and (owner["pid"] == me["pid"] or not pid_alive(owner["pid"]))
            )
            if not stale:
                assert owner is not None
                raise ConfigError(
                    "train.run_dir",
                    str(run_dir),
                    f"another training (pid {owner['pid']} on {owner['host']}) "
                    "is using it; wait for it, choose another train.run_dir, or "
                    f"delete {lock} if that process is gone",
                ) from None
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        _held.append(lock)
        return
    raise ConfigError(
        "train.run_dir",
        str(run_dir),
        f"could not take {lock}: another "
        "training keeps starting there; choose another train.run_dir",
    )


def release_held() -> None:
    """Remove the locks this process holds (those still naming this pid)."""
    while _held:
        lock = _held.pop()
        owner = _owner(lock)
        if owner is not None and owner["pid"] == os.getpid():
            lock.unlink(missing_ok=True)


atexit.register(release_held)
