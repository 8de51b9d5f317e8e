"""Where a process's wall time goes, by phase: one clock that every layer may time itself on.

`phase(name)` is a context that adds its wall time to `totals()[name]`. Phases are exclusive: a
phase opened inside another pauses the outer one, so the totals add up to the time covered by
any phase and nothing is counted twice (e.g. "data" inside "build"). What no phase covers is the
caller's to name: `benchmarks/vs_nanogpt.py` calls the rest of the process's life before the
first step "start-up (imports)" and after the run's files are written "exit".

The trainer writes the totals into run_info.json (`phases_s`) with the wall-clock time it wrote
them (`phases_written_unix`), so a caller that knows when the process started and ended can
account for the whole process. This module imports nothing heavy (it is imported by the CLI
before torch).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["phase", "enter", "leave", "switch", "totals", "reset"]

_totals: dict[str, float] = {}
_stack: list[tuple[str, float]] = []  # (name, start of its current stretch), innermost last


@contextmanager
def phase(name: str) -> Iterator[None]:
    enter(name)
    try:
        yield
    finally:
        leave()


def enter(name: str) -> None:
    """Open phase `name` (pausing the enclosing one) until the matching `leave()`; for code
    whose phase spans more than one block (`phase` is the context form)."""
    now = time.perf_counter()
    if _stack:
        _add(*_stack[-1], now)
    _stack.append((name, now))


def leave() -> None:
    """Close the innermost open phase and resume the one it paused."""
    now = time.perf_counter()
    _add(*_stack.pop(), now)
    if _stack:
        _stack[-1] = (_stack[-1][0], now)


def switch(name: str) -> None:
    """End the innermost phase's stretch and go on in phase `name` at the same depth."""
    leave()
    enter(name)


def _add(name: str, since: float, now: float) -> None:
    _totals[name] = _totals.get(name, 0.0) + now - since


def totals() -> dict[str, float]:
    """Seconds spent in each phase so far, by name (the running phase counted up to now)."""
    out = dict(_totals)
    if _stack:  # only the innermost phase runs; the others were paused when it opened
        name, since = _stack[-1]
        out[name] = out.get(name, 0.0) + time.perf_counter() - since
    return out


def reset() -> None:
    """Forget every total and open phase (tests)."""
    _totals.clear()
    _stack.clear()
