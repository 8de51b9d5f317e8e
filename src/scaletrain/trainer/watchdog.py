"""Heartbeat and hang watchdog: find the rank a hung job is waiting for.

Every rank rewrites run_dir/heartbeat/rank{r}.json after each step. A daemon thread per rank
watches the step in flight; when it runs past max(timeout, factor x median step time) the thread
writes this rank's evidence to run_dir/watchdog/ -- every thread's Python stack (faulthandler),
the last collectives from torch's flight recorder, where the main thread is (data wait, inside a
c10d call, elsewhere) -- waits briefly for the other ranks' evidence, names the stuck rank(s) in
run_dir/watchdog/report.json and one line on stderr, and ends the process with `EXIT_CODE`
(torchrun then stops the job, or restarts it from the last checkpoint with --max-restarts).

Who is stuck, first rule that names anyone: ranks that wrote no evidence (frozen or dead);
ranks behind their peers in a process group's collective sequence (flight recorder: the peers
wait in a collective these ranks have not reached); ranks waiting for data; ranks whose main
thread is in no c10d call (busy in their own code). If no rule names a rank, every rank waits
in a collective (a mismatched collective) and all are named.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["EXIT_CODE", "Heartbeat", "RankEvidence", "Watchdog", "step_limit", "stuck_ranks"]

EXIT_CODE = 124
"""The process exit status after a detected hang (timeout(1)'s convention)."""


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    """Atomic: a reader (status, a peer's watchdog) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


class Heartbeat:
    """run_dir/heartbeat/rank{r}.json: this rank's last finished step and when."""

    MIN_INTERVAL_S = 5.0

    def __init__(self, run_dir: Path, *, rank: int, enabled: bool):
        self.path = run_dir / "heartbeat" / f"rank{rank}.json"
        self.rank, self.enabled = rank, enabled
        self._base = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname()}
        self._state, self._last = "", 0.0

    def beat(self, *, step: int, state: str, **extra: Any) -> None:
        """Rewrite the file; while running, at most every `MIN_INTERVAL_S` (thousands of
        ranks rewriting a file every fast step would load a shared filesystem for nothing)."""
        now = time.time()
        if not self.enabled or (
            state == self._state == "running" and now - self._last < self.MIN_INTERVAL_S
        ):
            return
        self._state, self._last = state, now
        _write_json(self.path, {**self._base, "step": step, "time": now, "state": state, **extra})


def step_limit(*, timeout_s: float, factor: float, step_times: list[float]) -> float:
    """Seconds a step may run before it counts as hung: max(timeout, factor x median of the
    steps seen so far); only the timeout before any step has finished."""
    median = statistics.median(step_times) if step_times else 0.0
    return max(timeout_s, factor * median)


@dataclass
class RankEvidence:
    rank: int
    step: int
    elapsed_s: float
    """Seconds this rank had been in its step when its watchdog fired."""
    where: str
    """Main thread at that moment: 'data' (waiting for a batch), 'collective' (inside a
    c10d call) or 'compute' (anywhere else)."""
    collective_seq: dict[str, int] = field(default_factory=dict)
    """Flight recorder: the highest collective sequence number issued, per process group."""
    time: float = 0.0


def stuck_ranks(evidence: dict[int, RankEvidence], world_size: int) -> tuple[list[int], str]:
    """The stuck ranks and why (see the module docstring for the rules, in order)."""
    missing = [r for r in range(world_size) if r not in evidence]
    if missing:
        return missing, "wrote no watchdog evidence (process frozen or dead)"
    behind: set[int] = set()
    groups = {g for e in evidence.values() for g in e.collective_seq}
    for g in groups:
        # every rank is in the default group (pg id 0): one that recorded none of its
        # collectives has issued none; other groups' members are unknown here (gloo's
        # recorder leaves its group table empty), so only the ranks that report them count
        world = g.startswith("0/")
        seqs = {
            r: e.collective_seq.get(g, 0)
            for r, e in evidence.items()
            if world or g in e.collective_seq
        }
        if len(seqs) > 1:
            top = max(seqs.values())
            behind |= {r for r, s in seqs.items() if s < top}
    if behind:
        return sorted(behind), "behind its peers' collectives (flight recorder)"
    for where, why in (("data", "waiting for data"), ("compute", "busy outside collectives")):
        named = sorted(r for r, e in evidence.items() if e.where == where)
        if named:
            return named, why
    return sorted(evidence), "every rank waits in a collective (mismatched collectives?)"


def _collectives(backend: str | None) -> tuple[dict[str, Any] | None, str]:
    """torch's flight recorder dump (None if it recorded nothing) and a note for the report."""
    try:
        import torch._C._distributed_c10d as c10d

        # private and absent from torch's stubs: looked up by name (the NCCL dump where this
        # build has it, else the generic flight recorder's; a missing one raises below)
        nccl = backend == "nccl" and hasattr(c10d, "_dump_nccl_trace_json")
        dump = getattr(c10d, "_dump_nccl_trace_json" if nccl else "_dump_fr_trace_json")
        data = json.loads(dump())
    except Exception as e:  # a build without the recorder: the stacks still say a lot
        return None, f"flight recorder unavailable ({type(e).__name__}: {e})"
    if not data.get("entries"):
        return None, (
            "flight recorder recorded nothing: is TORCH_FR_BUFFER_SIZE 0? (NCCL: "
            "export TORCH_NCCL_TRACE_BUFFER_SIZE=2000 before the job starts)"
        )
    return data, f"flight recorder: last {len(data['entries'])} collectives ({backend})"


def _max_seq(data: dict[str, Any] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in (data or {}).get("entries", []):
        if e.get("is_p2p"):
            continue
        name = "/".join(map(str, e.get("process_group", [e.get("pg_id")])))
        out[name] = max(out.get(name, 0), int(e.get("collective_seq_id", 0)))
    return out


class Watchdog:
    """The watching thread of one rank; `begin`/`end` bracket every step (from the loop)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        rank: int,
        world_size: int,
        timeout_s: float,
        factor: float,
        backend: str | None = None,
        poll_s: float = 0.2,
    ):
        self.dir = run_dir / "watchdog"
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.timeout_s, self.factor, self.poll_s = timeout_s, factor, poll_s
        self.step_times: list[float] = []
        self.in_data = False
        """Set by the loop's batch iterator while this rank waits for a batch."""
        self._step, self._t0 = 0, None  # type: int, float | None
        self._loop_frame: FrameType | None = None
        self._main = threading.get_ident()  # the training thread: the one whose stack matters
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="scaletrain-watchdog", daemon=True)
        self._thread.start()

    def begin(self, step: int, *, loop_frame: FrameType | None = None) -> None:
        """A step starts. `loop_frame`: the training loop's frame; once it is gone from the
        training thread's stack (the loop raised), the watchdog stands down instead of timing
        the dead step (a process that outlives its run, e.g. a test session, must not be
        killed by it)."""
        self._loop_frame = loop_frame
        self._step, self._t0 = step, time.monotonic()

    def end(self) -> None:
        if self._t0 is not None:
            self.step_times.append(time.monotonic() - self._t0)
            del self.step_times[:-1000]  # the recent median is what "normal" means
        self._t0 = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if not self._loop_alive():
                return
            t0 = self._t0
            limit = step_limit(
                timeout_s=self.timeout_s, factor=self.factor, step_times=list(self.step_times)
            )
            if t0 is not None and time.monotonic() - t0 > limit:
                self._fire(time.monotonic() - t0, limit)
                return

    def _loop_alive(self) -> bool:
        if self._loop_frame is None:
            return True
        frame = sys._current_frames().get(self._main)
        while frame is not None:
            if frame is self._loop_frame:
                return True
            frame = frame.f_back
        self._loop_frame = None  # let the frame (and the model it holds) go
        return False

    def _where(self) -> str:
        if self.in_data:
            return "data"
        frame = sys._current_frames().get(self._main)
        while frame is not None:
            name = frame.f_code.co_filename
            if name.endswith("distributed_c10d.py") or "_functional_collectives" in name:
                return "collective"
            frame = frame.f_back
        return "compute"

    def _fire(self, elapsed: float, limit: float) -> None:
        """Write this rank's evidence, gather the others', report, and end the process."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / f"rank{self.rank}_stacks.txt", "w") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
        trace, note = _collectives(self.backend)
        if trace is not None:
            (self.dir / f"rank{self.rank}_collectives.json").write_text(json.dumps(trace))
        mine = RankEvidence(
            rank=self.rank,
            step=self._step + 1,
            elapsed_s=round(elapsed, 2),
            where=self._where(),
            collective_seq=_max_seq(trace),
            time=time.time(),
        )
        _write_json(self.dir / f"rank{self.rank}.json", {**asdict(mine), "note": note})
        # peers in the same step fire within about one poll of each other
        grace = min(max(5.0, 0.25 * limit), 60.0)
        evidence = self._gather(since=mine.time - limit, grace=grace)
        ranks, why = stuck_ranks(evidence, self.world_size)
        reporter = min(evidence)
        line = (
            f"scaletrain watchdog: step {mine.step} hung for {elapsed:.0f} s (limit "
            f"{limit:.0f} s): stuck rank(s) {', '.join(map(str, ranks))} ({why}); "
            f"stacks and collectives in {self.dir}"
        )
        if self.rank == reporter:
            _write_json(
                self.dir / "report.json",
                {
                    "step": mine.step,
                    "stuck_ranks": ranks,
                    "reason": why,
                    "limit_s": limit,
                    "detected_after_s": round(elapsed, 2),
                    "line": line,
                    "time": time.time(),
                    "collectives": note,
                    "evidence": {r: asdict(e) for r, e in evidence.items()},
                },
            )
            print(line, file=sys.stderr, flush=True)
        else:  # stay until the report is written: a launcher kills the job at the first exit
            deadline = time.monotonic() + grace
            while not (self.dir / "report.json").exists() and time.monotonic() < deadline:
                time.sleep(self.poll_s)
        os._exit(EXIT_CODE)

    def _gather(self, *, since: float, grace: float) -> dict[int, RankEvidence]:
        deadline = time.monotonic() + grace
        while True:
            found: dict[int, RankEvidence] = {}
            for r in range(self.world_size):
                try:
                    raw = json.loads((self.dir / f"rank{r}.json").read_text())
                except (OSError, ValueError):
                    continue
                raw.pop("note", None)
                if raw["time"] >= since:  # not a leftover of an earlier attempt
                    found[r] = RankEvidence(**raw)
            if len(found) == self.world_size or time.monotonic() > deadline:
                return found
            time.sleep(self.poll_s)
