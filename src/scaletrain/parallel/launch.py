"""Spawn a function on N local gloo ranks and collect each rank's return value.

Used by parity tests, benchmarks and `scaletrain train --nproc N` on a laptop: the same code path
as torchrun (env:// rendezvous on loopback), without a separate launcher process.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import os
import pickle
import signal
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import connection as mp_connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scaletrain.config import ConfigError
from scaletrain.config.launch_env import LAUNCH_FIX, LaunchEnv

__all__ = ["RankDied", "Stopped", "attempt_store", "free_port", "rendezvous_store", "spawn"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PRELOAD = ["torch", "torch.distributed", "scaletrain.trainer.loop"]
"""What the ranks' fork server imports once (`_start_method`): torch and the trainer, ~3.7 s
of imports on a 2-core host that every spawned rank would repeat."""


def _start_method(forward_signals: bool) -> str:
    """How `spawn` starts its ranks.

    'forkserver' (parity tests, benchmarks: many groups from one process), with `_PRELOAD`
    imported in the server: each rank is a fork of a process that has imported torch and the
    trainer but run nothing (no thread pool, no process group), so it starts in ~0.2 s where a
    spawned rank re-imports them (~3.5 s on 2 cores; the test suite starts hundreds of groups).
    What a spawned rank would inherit and the server does not, it is given: the working
    directory and sys.path (multiprocessing's preparation data, as for 'spawn') and the
    launcher's environment at this call (`_worker`'s `env`). The preload list is set before
    the server starts (once per launcher process; later calls reuse the server).

    'spawn' under `forward_signals` (`scaletrain train --nproc`, one group per process, so
    nothing to share): its ranks are the launcher's own children and their exit codes come
    from the kernel, where a fork server relays them and a signal sent to the launcher's
    process group (a scheduler's SIGTERM) would stop the server and lose them.
    """
    if forward_signals:
        return "spawn"
    mp.set_forkserver_preload(_PRELOAD)
    return "forkserver"


def _worker(
    rank: int,
    world_size: int,
    port: int,
    out_dir: str,
    fn: Callable[..., Any],
    args: tuple,
    threads: int,
    own_group: bool = False,
    env: dict[str, str] | None = None,
) -> None:
    if own_group:  # the launcher alone receives the terminal's signals and forwards them once
        os.setpgrp()
    if env is not None:  # the launcher's environment now, not the fork server's at its start
        os.environ.clear()
        os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    # this group hosts its own store on rank 0; a flag inherited from an enclosing torchrun
    # would make every rank a client of a store that nobody serves (a silent hang)
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    torch.set_num_threads(threads)
    out = Path(out_dir) / f"rank{rank}.pt"
    try:
        # the group meets in a file of this spawn's own directory, not on MASTER_PORT: a port
        # found free by the parent can be taken before rank 0 binds it (another process's
        # ephemeral port, or a peer's connect retry that lands on its own source port)
        store = dist.FileStore(str(Path(out_dir) / "store"), world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        result = fn(*args)
        torch.save({"ok": True, "result": result}, out)
    except BaseException as e:  # report every failure to the parent, then re-raise
        torch.save(
            {"ok": False, "error": traceback.format_exc(), "exc": _portable(e), "t": time.time()},
            out,
        )
        raise
    finally:
        if dist.is_initialized():
            # objects that still hold the group (a DDP reducer in a reference cycle, DTensor
            # meshes) must die before it does: a reducer destroyed after its group aborts the
            # process (SIGABRT at exit, seen once in CI)
            gc.collect()
            dist.destroy_process_group()


_GRACE_S = 3.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""After one rank fails, how long its peers get to exit by themselves, then after SIGTERM."""


def _portable(e: BaseException) -> bytes | None:
    """`e` pickled, when it survives the trip to the parent (None otherwise)."""
    try:
        data = pickle.dumps(e)
        pickle.loads(data)
    except Exception:  # noqa: BLE001 - an exception that cannot travel is reported as text
        return None
    return data


def _rank_failure(
    tmp: Path, world_size: int, e: Exception, exit_codes: list[int | None] | None = None
) -> BaseException:
    """What the parent raises when a rank failed: the exception of the rank that failed first
    (the others' failures follow from it: a peer gone mid-collective), itself when it is a
    `ConfigError` or a RuntimeError (a prepared one, e.g. CheckpointError, then reads as the same
    one line as in a single process), else a RuntimeError with that rank's traceback."""
    failed = []
    for r in range(world_size):
        p = tmp / f"rank{r}.pt"
        if p.exists():
            rec = torch.load(p, weights_only=False)
            if not rec["ok"]:
                failed.append((rec.get("t", 0.0), r, rec))
    recorded = {r for _, r, _ in failed}
    first = getattr(e, "error_index", None)  # the rank torch saw exit first
    silent = None
    if isinstance(e, mp.ProcessExitedException) and first not in recorded:
        how = f"signal {e.signal_name}" if e.signal_name else f"exit code {e.exit_code}"
        silent = (first, how)
    else:  # a rank that exited with a code of its own and no Python error (torch may have
        # listed a peer first whose gloo error followed from it)
        for r, code in enumerate(exit_codes or []):
            if r not in recorded and code is not None and code > 0:
                silent = (r, f"exit code {code}")
                break
    if silent is not None:
        # it died without a Python error (os._exit, a crash); the others' errors (a peer
        # gone mid-collective) follow from it
        return RankDied(
            f"distributed run failed: rank {silent[0]} ended with {silent[1]} "
            "without a Python error (killed, out of memory, or crashed); the other ranks "
            "were stopped: resume from the last checkpoint with the same command"
        )
    if not failed:
        return RuntimeError(f"distributed run failed: {e}")
    # every failed rank left a record: the earliest is the root (torch's order of exited
    # processes is that of its wait set, not of the failures)
    _, r, rec = min(failed, key=lambda f: (f[0], f[1]))
    remote = RankTraceback(f"rank {r}:\n{rec['error']}")
    if rec.get("exc") is not None:
        exc = pickle.loads(rec["exc"])
        if isinstance(exc, ConfigError | RuntimeError):
            exc.__cause__ = remote  # shown if the caller lets it through, like futures do
            return exc
    return RuntimeError(f"distributed run failed on rank {r}:\n{rec['error']}")


class RankDied(RuntimeError):
    """A rank ended without a Python error (a signal, the OOM killer, a crash): one line, said
    by the CLI as a prepared run-time failure (there is no traceback of it to show)."""


class RankTraceback(Exception):
    """The traceback text of a spawned rank's failure (the cause of what the parent raises)."""


class Stopped(Exception):
    """The launcher received SIGINT/SIGTERM, forwarded it to its ranks, and they have exited.

    `signum`: the signal; `saved`: the ranks stopped through the training loop's own stop (it
    finished the step, saved a checkpoint and said so in one line), not before it."""

    def __init__(self, signum: int, *, saved: bool) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum, self.saved = signum, saved


STOP_GRACE_S = 600.0
"""After a forwarded SIGINT/SIGTERM, how long the ranks get to finish the step and save before
they are killed (a second signal is forwarded at once and stops them, as in one process)."""


def _forwarding(ctx: Any, state: dict[str, Any]) -> Callable[[int, Any], None]:
    """A SIGINT/SIGTERM handler that records the first signal and sends each one to every live
    rank (the ranks run in their own process group, so nothing else reaches them)."""

    def handler(signum: int, frame: Any) -> None:
        if not state["signum"]:
            state["signum"], state["deadline"] = signum, time.monotonic() + STOP_GRACE_S
        for proc in ctx.processes:
            if proc.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signum)

    return handler


def _await_stop(ctx: Any, tmp: Path, state: dict[str, Any]) -> Stopped:
    """Wait (bounded by STOP_GRACE_S) for the ranks to stop after a forwarded signal; the
    `Stopped` to raise. Saved when rank 0 left through the loop's SystemExit(128 + signum)."""
    while any(p.is_alive() for p in ctx.processes) and time.monotonic() < state["deadline"]:
        mp_connection.wait([p.sentinel for p in ctx.processes if p.is_alive()], timeout=1.0)
    for proc in ctx.processes:
        if proc.is_alive():
            proc.kill()
        proc.join()
    saved = False
    rec_path = tmp / "rank0.pt"
    if rec_path.exists():
        rec = torch.load(rec_path, weights_only=False)
        exc = pickle.loads(rec["exc"]) if rec.get("exc") is not None else None
        saved = isinstance(exc, SystemExit) and exc.code == 128 + state["signum"]
    return Stopped(state["signum"], saved=saved)


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    threads: int = 1,
    forward_signals: bool = False,
) -> list[Any]:
    """Run `fn(*args)` on `world_size` gloo ranks; return the per-rank results (rank order).

    `fn` must be importable (module-level) and its results torch.save-able. A failure raises the
    first failing rank's own ConfigError or RuntimeError (so a user error stays one line; its
    `__cause__` holds the rank's traceback), or a RuntimeError carrying that rank's traceback.

    forward_signals (`scaletrain train --nproc`): the ranks run in their own process group and
    the launcher forwards each SIGINT/SIGTERM it receives (from the terminal's group or sent to
    it alone) to every rank exactly once, then waits for them to finish the step and save
    (bounded: STOP_GRACE_S) and raises `Stopped`, as one process and torchrun behave.
    """
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(
            _worker,
            args=(
                world_size,
                free_port(),
                tmp,
                fn,
                args,
                threads,
                forward_signals,
                dict(os.environ),
            ),
            nprocs=world_size,
            join=False,
            start_method=_start_method(forward_signals),
        )
        state: dict[str, Any] = {"signum": 0, "deadline": 0.0}
        previous = {}
        if forward_signals and threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, _forwarding(ctx, state)) for s in _STOP_SIGNALS}
        # torch logs a warning per peer it stops after the first failure: the failure itself is
        # what the user needs to read, once
        spawn_log = logging.getLogger("torch.multiprocessing.spawn")
        level = spawn_log.level
        spawn_log.setLevel(logging.ERROR)
        try:
            while True:
                if state["signum"]:
                    raise _await_stop(ctx, Path(tmp), state)
                # a rank's exit is looked at here first: after a signal, a rank leaving with
                # 128 + signum is the stop (its peers still saving), not a failure to clean up
                ready = mp_connection.wait(list(ctx.sentinels), timeout=1.0)
                if state["signum"]:
                    continue
                if ready and ctx.join(timeout=0, grace_period=_GRACE_S):
                    break
        except Stopped:
            raise
        except Exception as e:
            if state["signum"]:
                raise _await_stop(ctx, Path(tmp), state) from None
            codes = [proc.exitcode for proc in ctx.processes]
            raise _rank_failure(Path(tmp), world_size, e, codes)  # noqa: B904 - cause: the rank's
        finally:
            spawn_log.setLevel(level)
            for s, prev in previous.items():
                signal.signal(s, prev)
        results = []
        for r in range(world_size):
            rec = torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False)
            results.append(rec["result"])
        return results


# ---------------------------------------------------------------------------------------------
# torchrun restarts: one key namespace per attempt in the agent's long-lived store
# ---------------------------------------------------------------------------------------------
#
# Under torchrun's c10d rendezvous the agent hosts a TCPStore that it shares with its workers
# (TORCHELASTIC_USE_AGENT_STORE=True, MASTER_PORT points at it). In torch 2.13 that server is
# created once and reused by every restart, and init_process_group adds no per-attempt prefix,
# so a restarted worker finds the previous attempt's keys: gloo's connectFullMesh reads a dead
# peer's address and fails with "connection refused" (or, when the port has been reused, waits
# for a handshake that never comes). TORCHELASTIC_RESTART_COUNT is no fix: it is per agent, and
# an agent restarted for a peer's membership change keeps its count (pytorch issue #135712).
# So the ranks agree on a fresh attempt number through the store itself.

_ATTEMPT = "scaletrain/attempt"


def attempt_store(
    store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta, poll_s: float = 0.02
) -> dist.PrefixStore:
    """`store` seen through a key prefix that every rank of this launch agrees on and that no
    earlier launch against the same store used.

    Rank 0 opens attempt n+1 (an atomic counter) and waits until every other rank has joined
    it. Another rank joins the newest attempt it can see, but only if it has never joined that
    attempt before (a per-rank claim counter): an attempt left over from a finished launch was
    joined by every rank (so the claim fails), one left from a crashed launch never gets its
    "go" (its rank 0 is dead), and in both cases the rank waits for rank 0 to open a newer
    one. Every previous worker is dead when torchrun starts the next attempt, so the old keys
    no longer change. Raises `TimeoutError` after `timeout`.
    """
    deadline = time.monotonic() + timeout.total_seconds()

    def prefix(n: int) -> str:
        return f"{_ATTEMPT}/{n}"

    if rank == 0:
        n = store.add(_ATTEMPT, 1)
        joined = [f"{prefix(n)}/joined/{r}" for r in range(1, world_size)]
        while not store.check(joined):
            _wait_or_raise(deadline, poll_s, "waiting for every rank to join attempt", n)
        store.set(f"{prefix(n)}/go", "1")
        return dist.PrefixStore(prefix(n), store)
    while True:
        n = store.add(_ATTEMPT, 0)
        if n > 0 and store.add(f"{prefix(n)}/claim/{rank}", 1) == 1:
            store.set(f"{prefix(n)}/joined/{rank}", "1")
            while not store.check([f"{prefix(n)}/go"]) and store.add(_ATTEMPT, 0) == n:
                _wait_or_raise(deadline, poll_s, "waiting for rank 0 to start attempt", n)
            if store.check([f"{prefix(n)}/go"]):
                return dist.PrefixStore(prefix(n), store)
        while store.add(_ATTEMPT, 0) == n:  # stale (or superseded): wait for a newer one
            _wait_or_raise(deadline, poll_s, "waiting for rank 0 to open an attempt after", n)


def _wait_or_raise(deadline: float, poll_s: float, what: str, n: int) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(
            f"process-group bootstrap timed out {what} {n} (is every rank of this launch running?)"
        )
    time.sleep(poll_s)


def rendezvous_store(env: LaunchEnv, timeout: datetime.timedelta) -> dist.Store:
    """The store every rank of this launch builds its process group on, returned only once all
    `env.world_size` ranks have reached it; a `ConfigError` naming WORLD_SIZE (or MASTER_ADDR)
    after `timeout` instead of a wait with no end.

    Under torchrun's agent store: a fresh namespace of it (`attempt_store`). Otherwise rank 0
    hosts a TCPStore at MASTER_ADDR:MASTER_PORT (what env:// would do) and every rank counts
    itself in; a missing peer (`WORLD_SIZE=2` with one process started) or an unreachable rank 0
    is named after `timeout`.
    """
    where = f"{env.master_addr}:{env.master_port}"
    secs = f"{timeout.total_seconds():g} s (train.rendezvous_timeout_s)"
    if env.agent_store:
        try:
            return attempt_store(
                dist.TCPStore(
                    env.master_addr or "", env.master_port or 0, is_master=False, timeout=timeout
                ),
                env.rank,
                env.world_size,
                timeout,
            )
        except (TimeoutError, dist.DistError) as e:
            raise ConfigError(
                "WORLD_SIZE",
                str(env.world_size),
                f"rank {env.rank} found no complete launch at the torchrun store "
                f"{where} within {secs} ({_first_line(e)}); {LAUNCH_FIX}",
            ) from None
    deadline = time.monotonic() + timeout.total_seconds()
    if env.rank > 0 and not _reachable(env.master_addr or "", env.master_port or 0, deadline):
        # probed here: torch's client would log a C++ stack trace per retry before giving up
        raise ConfigError(
            "MASTER_ADDR",
            env.master_addr,
            f"rank {env.rank} reached no rank 0 at {where} within {secs}: start rank "
            f"0 there, or fix MASTER_ADDR/MASTER_PORT; {LAUNCH_FIX}",
        )
    try:
        store = dist.TCPStore(
            env.master_addr or "",
            env.master_port or 0,
            env.world_size,
            is_master=env.rank == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
    except (RuntimeError, dist.DistError) as e:
        if env.rank == 0:
            fix = (
                f"rank 0 could not serve the rendezvous at {where} ({_first_line(e)}): "
                "choose a free MASTER_PORT on this host"
            )
            raise ConfigError("MASTER_PORT", str(env.master_port), fix) from None
        raise ConfigError(
            "MASTER_ADDR",
            env.master_addr,
            f"rank {env.rank} reached no rank 0 at {where} within {secs}: start rank "
            f"0 there, or fix MASTER_ADDR/MASTER_PORT; {LAUNCH_FIX}",
        ) from None
    key = "scaletrain/rendezvous"
    joined = store.add(key, 1)
    while joined < env.world_size:
        if time.monotonic() > deadline:
            raise ConfigError(
                "WORLD_SIZE",
                str(env.world_size),
                f"only {joined} of {env.world_size} ranks reached the rendezvous at "
                f"{where} within {secs}; {LAUNCH_FIX}",
            )
        time.sleep(0.05)
        joined = store.add(key, 0)
    return store


def _reachable(addr: str, port: int, deadline: float) -> bool:
    """Whether a TCP connection to addr:port opens before `deadline` (retried every 0.2 s)."""
    while True:
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
