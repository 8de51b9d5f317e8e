"""The launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), read
and checked in one place before any process group is joined.

torchrun, `scaletrain train --nproc N` and a hand-written launch all describe a rank through
these variables. A wrong one used to reach `init_process_group`: `RANK >= WORLD_SIZE` or a
`WORLD_SIZE` with no peer waited forever, a missing `MASTER_ADDR` or a non-integer value ended
in a traceback. Each is a `ConfigError` naming the variable and the fix, raised here.
Pure Python (no torch), like the rest of `config/`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ._errors import ConfigError

__all__ = ["LaunchEnv", "launch_env", "LAUNCH_FIX"]

LAUNCH_FIX = (
    "launch every rank with torchrun --nproc-per-node=N or `scaletrain train --nproc N`, "
    "or unset WORLD_SIZE/RANK for a single process"
)


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None
    master_port: int | None
    agent_store: bool
    """torchrun shares its agent's store with the workers (TORCHELASTIC_USE_AGENT_STORE)."""


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int | None = None) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        v = int(raw.strip())
    except ValueError:
        raise ConfigError(name, raw, f"use an integer; {LAUNCH_FIX}") from None
    if v < lo or (hi is not None and v > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(name, raw, f"use {bound}; {LAUNCH_FIX}")
    return v


def launch_env(env: Mapping[str, str] | None = None) -> LaunchEnv:
    """This rank's place in the launch, checked; `env` defaults to `os.environ`.

    No WORLD_SIZE (or WORLD_SIZE=1) is a single process. With WORLD_SIZE > 1, RANK must be in
    0..WORLD_SIZE-1 and MASTER_ADDR/MASTER_PORT must name the rank-0 host (torchrun sets all of
    them)."""
    env = os.environ if env is None else env
    world = _int(env, "WORLD_SIZE", 1, 1)
    rank = _int(env, "RANK", 0, 0)
    if rank >= world:
        raise ConfigError(
            "RANK",
            env.get("RANK"),
            f"must be below WORLD_SIZE={world} (ranks are 0..{world - 1}); {LAUNCH_FIX}",
        )
    local_rank = _int(env, "LOCAL_RANK", 0, 0)
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    addr, port = env.get("MASTER_ADDR"), None
    if world > 1:
        if addr is None or not addr.strip():
            raise ConfigError(
                "MASTER_ADDR",
                addr,
                f"WORLD_SIZE={world} needs the rank-0 host in MASTER_ADDR and a port "
                f"in MASTER_PORT; {LAUNCH_FIX}",
            )
        if env.get("MASTER_PORT") is None:
            raise ConfigError(
                "MASTER_PORT",
                None,
                f"WORLD_SIZE={world} needs the rank-0 port in MASTER_PORT; {LAUNCH_FIX}",
            )
        port = _int(env, "MASTER_PORT", 0, 1, 65535)
    return LaunchEnv(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        master_addr=addr,
        master_port=port,
        agent_store=agent,
    )
