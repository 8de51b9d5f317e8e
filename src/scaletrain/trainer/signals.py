"""SIGINT / SIGTERM: finish the step, save, exit with one line (130 / 143).

The handlers only set a flag (a signal can arrive in the middle of a collective or a write,
where stopping would tear state); the loop asks `stop_requested()` after each step, saves a
checkpoint there, and calls `exit_after_save`, which prints one line and raises SystemExit
with the shell convention 128 + signal number (no traceback). Distributed, a signal may reach
ranks at different steps, so the flag is all-reduced (max) every step: every rank stops after
the same step and takes part in the same save. After the first signal the default handlers
are back, so a second Ctrl-C stops at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["install", "uninstall", "stop_requested", "exit_after_save"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_state: dict[str, Any] = {"signum": 0, "previous": {}}


def _handler(signum: int, frame: Any) -> None:
    _state["signum"] = signum
    for s, prev in _state["previous"].items():  # a second signal acts at once
        signal.signal(s, prev)


def install() -> None:
    """Route SIGINT/SIGTERM to the flag (main thread only; elsewhere signals keep defaults)."""
    _state["signum"] = 0
    if threading.current_thread() is not threading.main_thread() or _state["previous"]:
        return
    _state["previous"] = {s: signal.getsignal(s) for s in _SIGNALS}
    for s in _SIGNALS:
        signal.signal(s, _handler)


def uninstall() -> None:
    for s, prev in _state["previous"].items():
        signal.signal(s, prev)
    _state["previous"] = {}


def stop_requested() -> int:
    """The signal number that asks this job to stop (any rank's), or 0."""
    signum = int(_state["signum"])
    if dist.is_initialized():
        t = torch.tensor([signum], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        signum = int(t.item())
    return signum


def exit_after_save(signum: int, *, step: int, log: Callable[[str], Any]) -> None:
    """One line, then SystemExit(128 + signum)."""
    name = signal.Signals(signum).name
    log(
        f"{name} received: stopped after step {step} and saved a checkpoint; the same "
        "command resumes from it"
    )
    raise SystemExit(128 + signum)
