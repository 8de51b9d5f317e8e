"""Pipeline schedules: closed-form bubbles, in-flight micro-batches, action orders, a simulator.

Four schedules (docs/DESIGN.md §4 names): 'gpipe' (all forwards then all backwards, Huang et al.
2019), '1f1b' (PipeDream-flush, Narayanan et al. 2021), 'interleaved' (1F1B over v model chunks
per rank, Narayanan et al. 2021 §2.2) and 'zero-bubble' (backward split into B = grad w.r.t.
inputs and W = grad w.r.t. weights, W deferred into the idle slots; Qi et al. 2023, "Zero
Bubble Pipeline Parallelism").

`pipeline_order` produces, per rank, the action order that torch.distributed.pipelining 2.13
runs (Schedule1F1B / ScheduleGPipe / ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble),
without its lock-step no-op padding: the dry-run drives stages through this order, and
`simulate` times it with a discrete-event model (an action starts when its rank is free and its
inputs have arrived). The closed forms are tested against the simulator.

Conventions: p = pipeline ranks, m = micro-batches per step, v = model chunks (virtual stages)
per rank; "stage" in an action is the global chunk index (chunk c of rank r is stage c*p + r,
the interleaved assignment); tf / tb are one rank's forward / backward time for one micro-batch
through all of its v chunks. Bubble fraction = idle time / ideal busy time, the ratio the papers
quote ((p-1)/m for 1F1B), not idle / makespan.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from scaletrain.config import PP_SCHEDULES

__all__ = [
    "bubble_fraction",
    "inflight_microbatches",
    "inflight_per_rank",
    "Action",
    "pipeline_order",
    "Event",
    "PipelineTimeline",
    "simulate",
    "microbatches_per_round",
]

FORWARD, BACKWARD, WEIGHT = "F", "B", "W"
"""Action kinds: forward; backward (full backward, or input-gradient B under zero-bubble);
weight-gradient W (zero-bubble only)."""


def _check(schedule: str, p: int, m: int, v: int) -> None:
    if schedule not in PP_SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: use one of {', '.join(PP_SCHEDULES)}")
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"p={p}, m={m}, v={v}: all must be >= 1")
    if schedule in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"{schedule} runs one chunk per rank: v must be 1, got {v}")


def bubble_fraction(schedule: str, p: int, m: int, v: int = 1, *, zero_bubble: str = "h1") -> float:
    """Idle time / ideal compute time of one step (uniform stages, free communication).

    gpipe, 1f1b: (p-1)/m — each rank idles p-1 forward+backward slots while the pipeline fills
      and drains (Huang et al. 2019; Narayanan et al. 2021 §2.2.1). Exact in `simulate`.
    interleaved: (p-1)/(v*m) — fill and drain slots are chunk-sized, 1/v of a stage
      (Narayanan et al. 2021 §2.2.2). Assumes m is a multiple of p.
    zero-bubble: zero_bubble='h1' (default) -> (p-1)/(3vm): ZB-H1 of Qi et al. 2023, 1F1B's
      memory, bubble (p-1)(t_F + t_B - t_W) with equal thirds — what torch's
      ScheduleInterleavedZeroBubble (ZB1P) order, the one scaletrain's trainer runs, measures in
      `simulate`. zero_bubble='h2' -> 0: the idealised ZB-H2, which fills the warm-up and
      cool-down with deferred W passes when t_F = t_B = t_W and memory allows ~2p in-flight
      micro-batches; torch 2.13 has no such order, so it is an option for what-if studies only.
    Ignores: p2p latency, unequal stages (the head makes the last stage slower), optimizer step.
    """
    _check(schedule, p, m, v)
    if p == 1:
        return 0.0
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / m
    if schedule == "interleaved":
        return (p - 1) / (v * m)
    if zero_bubble == "h2":
        return 0.0
    if zero_bubble == "h1":
        return (p - 1) / (3 * v * m)
    raise ValueError(f"zero_bubble={zero_bubble!r}: use 'h1' or 'h2'")


def microbatches_per_round(p: int, m: int) -> int:
    """torch.distributed.pipelining's interleaved round size: m / max(1, m // p) (p if p | m)."""
    rounds = max(1, m // p)
    if m % rounds:
        raise ValueError(
            f"m={m} must be a multiple of the number of rounds {rounds} (max(1, m // p) with p={p})"
        )
    return m // rounds


def _interleaved_warmup(rank: int, p: int, m: int, v: int, factor: int) -> int:
    # torch `_get_warmup_ops`: the last rank warms up (v-1) rounds of chunk forwards; each hop
    # towards rank 0 adds `factor` (2 for interleaved 1F1B, 1 for zero-bubble); capped at m*v.
    warm = (v - 1) * microbatches_per_round(p, m) + factor * (p - 1 - rank)
    return min(warm, m * v)


def inflight_microbatches(schedule: str, p: int, m: int, stage: int, v: int = 1) -> float:
    """Micro-batches whose activations rank `stage` holds at its peak, in units of one
    micro-batch through all of the rank's chunks (v chunk-activations = 1).

    gpipe: m (every forward runs before any backward). 1f1b: min(m, p - stage) (p - stage
    forwards precede the first backward). interleaved: (min(m*v, w + 1)) / v chunk-activations,
    w = (v-1)*p + 2*(p-1-stage) warm-up chunk forwards of torch's order (Narayanan et al. 2021:
    stage 0 holds p*(1 + (p-1)/(p*v)) micro-batches). zero-bubble: micro-batches holding any
    activation (F done, W not yet): min(m, p) for v = 1 — ZB-H1 keeps 1F1B's stage-0 peak on
    every rank because a rank defers its W by as many slots as it saved in warm-up (Qi et al.
    2023 §3); after B only the W inputs remain, so this over-counts bytes slightly. For v > 1
    the count is read off `simulate` (no closed form is claimed).
    """
    _check(schedule, p, m, v)
    if not 0 <= stage < p:
        raise ValueError(f"stage={stage} must be in 0..{p - 1}")
    if p == 1:
        return 1.0
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(m, p - stage))
    if schedule == "interleaved":
        w = _interleaved_warmup(stage, p, m, v, 2)
        return min(m * v, w + 1) / v
    if v == 1:
        return float(min(m, p))
    return simulate("zero-bubble", p, m, v, 1.0, 2.0).peak_inflight[stage]


@functools.lru_cache(maxsize=4096)
def inflight_per_rank(schedule: str, p: int, m: int, v: int = 1) -> tuple[float, ...]:
    """`inflight_microbatches` of every rank 0..p-1 (cached: the planner asks per layout)."""
    return tuple(inflight_microbatches(schedule, p, m, r, v) for r in range(p))


# ---- action orders ----------------------------------------------------------------------------


class Action(NamedTuple):
    stage: int
    """Global chunk index (chunk c of rank r is stage c*p + r)."""
    kind: str
    """'F', 'B' or 'W'."""
    microbatch: int


def _gpipe(rank: int, m: int) -> list[Action]:
    return [Action(rank, FORWARD, i) for i in range(m)] + [
        Action(rank, BACKWARD, i) for i in range(m)
    ]


def _one_f_one_b(rank: int, p: int, m: int) -> list[Action]:
    # torch Schedule1F1B: min(m, p - rank) forwards, then (B, F) pairs, then the remaining Bs.
    # Equivalently: p-1-rank warm-up forwards, steady (F, B), cool-down backwards.
    warm = min(m, p - rank)
    out = [Action(rank, FORWARD, i) for i in range(warm)]
    f = warm
    for b in range(m):
        out.append(Action(rank, BACKWARD, b))
        if f < m:
            out.append(Action(rank, FORWARD, f))
            f += 1
    return out


def _looped(rank: int, p: int, m: int, v: int, zero_bubble: bool) -> list[Action]:
    """torch `_get_1f1b_rank_ops` for ScheduleInterleaved1F1B (zero_bubble=False) and
    ScheduleInterleavedZeroBubble (True), without the no-op padding."""
    mpr = microbatches_per_round(p, m)
    warm = _interleaved_warmup(rank, p, m, v, 1 if zero_bubble else 2)
    total = v * m
    fwd_idx = [0] * (v * p)
    bwd_idx = [0] * (v * p)
    w_idx = [0] * (v * p)

    def fstage(op: int) -> int:
        return ((op // mpr) % v) * p + rank

    def bstage(op: int) -> int:
        return (v - 1 - ((op - warm) // mpr) % v) * p + rank

    def take(counter: list[int], s: int) -> int:
        counter[s] += 1
        return counter[s] - 1

    out: list[Action] = []
    b_ops: list[int] = []
    n_w = 0
    delay_w = rank  # ZB1P: rank r runs r steady 1F1B iterations before its first W

    def maybe_w(op: int) -> None:
        nonlocal n_w
        if zero_bubble and op - warm >= delay_w:
            s = bstage(b_ops[n_w])
            out.append(Action(s, WEIGHT, take(w_idx, s)))
            n_w += 1

    for op in range(warm + (total - warm) + warm):
        if op < warm:
            s = fstage(op)
            out.append(Action(s, FORWARD, take(fwd_idx, s)))
            continue
        if op < total:
            s = fstage(op)
            out.append(Action(s, FORWARD, take(fwd_idx, s)))
        s = bstage(op)
        out.append(Action(s, BACKWARD, take(bwd_idx, s)))
        b_ops.append(op)
        maybe_w(op)
    while zero_bubble and n_w < len(b_ops):
        s = bstage(b_ops[n_w])
        out.append(Action(s, WEIGHT, take(w_idx, s)))
        n_w += 1
    return out


def pipeline_order(schedule: str, p: int, m: int, v: int = 1) -> dict[int, list[Action]]:
    """Per rank, the ordered actions of one step (torch.distributed.pipelining's order)."""
    return {r: list(rank_order(schedule, p, m, v, r)) for r in range(p)}


@functools.lru_cache(maxsize=4096)
def rank_order(schedule: str, p: int, m: int, v: int, rank: int) -> tuple[Action, ...]:
    """The ordered actions of pipeline rank `rank` alone (cached: the planner's memory model
    walks one rank's order per candidate layout, and search revisits the same ones)."""
    _check(schedule, p, m, v)
    if schedule == "gpipe":
        return tuple(_gpipe(rank, m))
    if schedule == "1f1b":
        return tuple(_one_f_one_b(rank, p, m))
    return tuple(_looped(rank, p, m, v, schedule == "zero-bubble"))


# ---- discrete-event simulator -----------------------------------------------------------------


class Event(NamedTuple):
    start: float
    end: float
    kind: str
    microbatch: int
    chunk: int
    """Local chunk index on the rank (0..v-1)."""


@dataclass
class PipelineTimeline:
    schedule: str
    p: int
    m: int
    v: int
    ranks: list[list[Event]]
    makespan: float
    busy: list[float]
    """Compute seconds per rank."""
    peak_inflight: list[float] = field(default_factory=list)
    """Per rank: max micro-batches holding activations (F started, last backward piece — B, or
    W under zero-bubble — not finished), in whole-rank units (v chunks = 1)."""

    @property
    def bubble_fraction(self) -> float:
        """Mean idle time over ranks / mean busy time (the closed forms' ratio)."""
        busy = sum(self.busy) / self.p
        return (self.makespan - busy) / busy if busy else 0.0

    @property
    def idle_fraction(self) -> float:
        """Mean idle time / makespan (the share of the step the GPUs wait)."""
        return 1 - sum(self.busy) / (self.p * self.makespan) if self.makespan else 0.0


def _per_rank(x: float | Sequence[float], p: int, name: str) -> list[float]:
    if isinstance(x, int | float):
        return [float(x)] * p
    vals = [float(t) for t in x]
    if len(vals) != p:
        raise ValueError(f"{name} has {len(vals)} entries; give one per rank ({p})")
    return vals


def simulate(
    schedule: str,
    p: int,
    m: int,
    v: int = 1,
    tf: float | Sequence[float] = 1.0,
    tb: float | Sequence[float] = 2.0,
    *,
    w_fraction: float = 0.5,
    p2p_latency: float = 0.0,
) -> PipelineTimeline:
    """Time one step of `pipeline_order(schedule, p, m, v)`.

    tf, tb: forward / backward seconds of one micro-batch through a rank's whole stage (a float,
    or one per rank); each chunk takes 1/v of it. Under zero-bubble the backward is split into
    B = (1 - w_fraction)*tb and W = w_fraction*tb (Qi et al. 2023 measure t_B ~ t_W). An action
    starts when its rank has finished the previous one and its input is ready: F(stage s) needs
    F(s-1) of the same micro-batch, B(s) needs B(s+1) (or F(s) on the last stage), W(s) needs
    B(s); crossing ranks adds `p2p_latency`. Ignores: compute/communication overlap limits,
    the optimizer step and the loss.
    """
    order = pipeline_order(schedule, p, m, v)
    tfs, tbs = _per_rank(tf, p, "tf"), _per_rank(tb, p, "tb")
    split = schedule == "zero-bubble"
    n_stages = p * v

    def duration(rank: int, kind: str) -> float:
        if kind == FORWARD:
            return tfs[rank] / v
        if not split:
            return tbs[rank] / v
        frac = w_fraction if kind == WEIGHT else 1 - w_fraction
        return tbs[rank] * frac / v

    done: dict[tuple[int, str, int], float] = {}
    free = [0.0] * p
    pos = [0] * p
    events: list[list[Event]] = [[] for _ in range(p)]
    remaining = sum(len(a) for a in order.values())
    while remaining:
        progressed = False
        for r in range(p):
            while pos[r] < len(order[r]):
                a = order[r][pos[r]]
                if a.kind == FORWARD:
                    dep = (a.stage - 1, FORWARD, a.microbatch) if a.stage else None
                elif a.kind == BACKWARD:
                    dep = (
                        (a.stage, FORWARD, a.microbatch)
                        if a.stage == n_stages - 1
                        else (a.stage + 1, BACKWARD, a.microbatch)
                    )
                else:
                    dep = (a.stage, BACKWARD, a.microbatch)
                ready = 0.0
                if dep is not None:
                    if dep not in done:
                        break
                    ready = done[dep] + (p2p_latency if dep[0] % p != r else 0.0)
                start = max(free[r], ready)
                end = start + duration(r, a.kind)
                done[(a.stage, a.kind, a.microbatch)] = end
                events[r].append(Event(start, end, a.kind, a.microbatch, a.stage // p))
                free[r] = end
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # an order whose dependencies form a cycle: a bug in pipeline_order
            raise RuntimeError(f"{schedule} order deadlocks at positions {pos}")
    makespan = max(free)
    busy = [sum(e.end - e.start for e in evs) for evs in events]
    return PipelineTimeline(
        schedule, p, m, v, events, makespan, busy, [_peak_inflight(evs, split, v) for evs in events]
    )


def _peak_inflight(events: list[Event], split: bool, v: int) -> float:
    # A chunk-activation is born at the start of its F and dies at the end of its last backward
    # piece (W under zero-bubble, else B). Sweep the births and deaths in time order.
    last = WEIGHT if split else BACKWARD
    marks: list[tuple[float, int]] = []
    for e in events:
        if e.kind == FORWARD:
            marks.append((e.start, 1))
        elif e.kind == last:
            marks.append((e.end, -1))
    marks.sort(key=lambda t: (t[0], t[1]))  # a death at t frees memory before a birth at t
    live = peak = 0
    for _, d in marks:
        live += d
        peak = max(peak, live)
    return peak / v
