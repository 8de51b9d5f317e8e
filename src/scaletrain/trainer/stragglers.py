"""Straggler report: every k steps, every rank's mean step time and data-wait time, gathered.

Synchronous training makes every rank's *step* time nearly equal (the fast ranks wait for the
slow one inside the step's collectives), so a slow rank shows mostly in what it does alone:
its data wait (a slow disk, loader or node) is measured here exactly. Step time is compared too:
it separates ranks whenever their steps are not fully synchronized (pipeline stages, the steps
between gradient syncs). A rank that is slow in compute under fully synchronous data
parallelism is *not* singled out by these two numbers; its collectives' timings (flight
recorder, CUDA events) would be needed, and are not read here.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["StragglerReport", "StragglerTracker", "find_stragglers"]

NOISE_FRACTION = 0.05
"""Data waits below this fraction of the median step time are noise, whatever their ratio."""


@dataclass
class StragglerReport:
    step: int
    step_s: list[float]
    """Per rank (rank order): mean seconds per step over the window."""
    data_wait_s: list[float]
    """Per rank: mean seconds per step spent waiting for batches."""
    stragglers: list[int]
    reasons: dict[int, str]

    def record(self) -> dict[str, object]:
        """The fields added to this step's metrics.jsonl record."""
        return {
            "rank_step_s": [round(x, 6) for x in self.step_s],
            "rank_data_wait_s": [round(x, 6) for x in self.data_wait_s],
            "stragglers": self.stragglers,
        }

    def line(self) -> str:
        ranks = "; ".join(f"rank {r}: {why}" for r, why in self.reasons.items())
        return f"step {self.step}: STRAGGLER {ranks}"


def find_stragglers(
    *, step_s: list[float], data_wait_s: list[float], factor: float
) -> dict[int, str]:
    """Ranks slower than `factor` x the ranks' median in step time or data wait, and why."""
    med_step = statistics.median(step_s)
    med_wait = statistics.median(data_wait_s)
    out: dict[int, str] = {}
    for r, (s, w) in enumerate(zip(step_s, data_wait_s)):
        why = []
        if s > factor * med_step:
            why.append(f"step {s:.3f} s vs median {med_step:.3f} s")
        if w > factor * med_wait and w > NOISE_FRACTION * med_step:
            why.append(f"data wait {w:.3f} s vs median {med_wait:.3f} s")
        if why:
            out[r] = ", ".join(why)
    return out


class StragglerTracker:
    """Accumulates this rank's times; every `every` steps one all_gather compares the ranks."""

    def __init__(self, *, every: int, factor: float, device: torch.device):
        self.every, self.factor, self.device = every, factor, device
        self._steps, self._step_s, self._wait_s = 0, 0.0, 0.0

    def add(self, *, step_s: float, data_wait_s: float) -> None:
        self._steps += 1
        self._step_s += step_s
        self._wait_s += data_wait_s

    def maybe_report(self, step: int) -> StragglerReport | None:
        """Collective every `every` steps (every rank calls it after every step)."""
        if not self.every or step % self.every or not self._steps:
            return None
        mine = torch.tensor(
            [self._step_s / self._steps, self._wait_s / self._steps],
            dtype=torch.float64,
            device=self.device,
        )
        self._steps, self._step_s, self._wait_s = 0, 0.0, 0.0
        if dist.is_initialized() and dist.get_world_size() > 1:
            parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, mine)
        else:
            parts = [mine]
        step_s = [float(p[0]) for p in parts]
        wait_s = [float(p[1]) for p in parts]
        reasons = find_stragglers(step_s=step_s, data_wait_s=wait_s, factor=self.factor)
        return StragglerReport(
            step=step,
            step_s=step_s,
            data_wait_s=wait_s,
            stragglers=sorted(reasons),
            reasons=reasons,
        )
