"""The one definition of a run's measured tokens/s, shared by `scaletrain verify` and `report`.

tokens/s = tokens of the timed optimizer steps / their summed step time, the first logged step
excluded (it pays allocation and lazy initialisation). This is a ratio of sums, as the trainer's
run_info figure: the mean of per-step rates would overweight fast steps (on a shared host one
slow step in ten moves it by 2-3x). Evaluation, sampling and checkpoint time are outside
`step_s`, so they are not counted. MFU scales with tokens/s, so it follows the same ratio.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Throughput", "step_throughput", "timed_steps"]


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: float
    step_s: float
    """Mean step time of the timed steps."""
    mfu: float | None
    steps: int
    cpu_step_s: float | None = None
    """Mean process CPU seconds of the timed steps (`step_cpu_s`, all the rank's threads);
    None when a row lacks it (a run from before it was logged)."""


def timed_steps(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The metrics.jsonl rows of the timed steps: the first logged step excluded, and a row
    counts when its tokens/s and step time are positive finite numbers (a damaged or
    hand-edited metrics.jsonl may hold strings, inf or nan: such rows are skipped)."""
    from .run_files import finite

    return [
        r
        for r in rows
        if isinstance(r, dict)
        and (finite(r.get("tokens_per_s")) or 0) > 0
        and (finite(r.get("step_s")) or 0) > 0
    ][1:]


def step_throughput(rows: Iterable[dict[str, Any]]) -> Throughput | None:
    """The throughput of metrics.jsonl rows (None: fewer than two timed steps logged)."""
    from .run_files import finite

    timed = timed_steps(rows)
    if not timed:
        return None
    seconds = sum(float(r["step_s"]) for r in timed)
    tokens = sum(float(r["tokens_per_s"]) * float(r["step_s"]) for r in timed)
    tok_s = tokens / seconds
    mfu = None
    if all(finite(r.get("mfu")) is not None for r in timed):
        mfu = tok_s * float(timed[0]["mfu"]) / float(timed[0]["tokens_per_s"])
    cpu = [finite(r.get("step_cpu_s")) for r in timed]
    cpu_step = sum(c for c in cpu if c is not None) / len(timed) if None not in cpu else None
    return Throughput(
        tokens_per_s=tok_s,
        step_s=seconds / len(timed),
        mfu=mfu,
        steps=len(timed),
        cpu_step_s=cpu_step,
    )
