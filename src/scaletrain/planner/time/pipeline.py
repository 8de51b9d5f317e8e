"""Pipeline schedules: closed-form bubbles, in-flight micro-batches, action orders, a simulator.

Five schedules (docs/DESIGN.md §4 names): 'gpipe' (all forwards then all backwards, Huang et al.
2019), '1f1b' (PipeDream-flush, Narayanan et al. 2021), 'interleaved' (1F1B over v model chunks
per rank, Narayanan et al. 2021 §2.2), 'zero-bubble' (backward split into I = grad w.r.t.
inputs and W = grad w.r.t. weights, W deferred into the idle slots; Qi et al. 2023, "Zero
Bubble Pipeline Parallelism") and 'dualpipev' (DeepSeek-V3's DualPipe cut in half: two chunks
per rank in a V, rank r holding stages r and 2p-1-r; DeepSeek-AI 2024, arXiv 2412.19437 §3.2.1,
and github.com/deepseek-ai/DualPipe's README).

`pipeline_order` produces, per rank, the action order that torch.distributed.pipelining 2.13
runs (Schedule1F1B / ScheduleGPipe / ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble /
ScheduleDualPipeV), without its lock-step no-op padding: the dry-run drives stages through this
order, and `simulate` times it with a discrete-event model (an action starts when its rank is
free and its inputs have arrived). The closed forms are tested against the simulator, the
orders against torch's (tests/unit/test_pipeline_orders_torch.py).

Conventions: p = pipeline ranks, m = micro-batches per step, v = model chunks (virtual stages)
per rank; "stage" in an action is the global chunk index (`stage_rank` maps it to its rank:
stage s on rank s mod p when looped, the V under 'dualpipev'); tf / tb are one rank's forward /
backward time for one micro-batch through all of its v chunks. Bubble fraction = idle time /
ideal busy time, the ratio the papers quote ((p-1)/m for 1F1B), not idle / makespan.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from scaletrain.config import PP_SCHEDULES, ConfigError, Layout

__all__ = [
    "bubble_fraction",
    "stage_rank",
    "last_stage_rank",
    "rank_groups",
    "inflight_microbatches",
    "inflight_per_rank",
    "Action",
    "pipeline_order",
    "Event",
    "PipelineTimeline",
    "simulate",
    "microbatches_per_round",
    "schedule_microbatches",
]

FORWARD, BACKWARD, INPUT, WEIGHT = "F", "B", "I", "W"
"""Action kinds: forward; full backward (torch's FULL_BACKWARD); the input-gradient half of a
split backward (BACKWARD_INPUT), whose weight-gradient half W (BACKWARD_WEIGHT) comes later
(zero-bubble always; DualPipeV for part of its micro-batches)."""


def _check(schedule: str, p: int, m: int, v: int) -> None:
    if schedule not in PP_SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: use one of {', '.join(PP_SCHEDULES)}")
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"p={p}, m={m}, v={v}: all must be >= 1")
    if schedule in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"{schedule} runs one chunk per rank: v must be 1, got {v}")
    if schedule == "dualpipev" and (v != 2 or m < 2 * p):
        raise ValueError(f"dualpipev runs v=2 chunks in a V and m >= 2p: got v={v}, m={m}, p={p}")


def last_stage_rank(layout: Layout) -> int:
    """The pipeline rank holding the last stage (the head and the loss) of `layout`: pp - 1,
    or 0 under dualpipev's V."""
    if layout.pp == 1:
        return 0
    return stage_rank(layout.pp_schedule, layout.pp, layout.pp * layout.pp_virtual - 1)


def stage_rank(schedule: str, p: int, stage: int) -> int:
    """The pipeline rank holding global stage `stage`: stage mod p (looped), or the V of
    'dualpipev' (stage s < p on rank s, stage s >= p on rank 2p-1-s;
    `scaletrain.config.stage_ids`, torch's `generate_stage_to_rank_mapping(style="v")`)."""
    if schedule == "dualpipev" and stage >= p:
        return 2 * p - 1 - stage
    return stage % p


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
    dualpipev: (p-1)/(6m). DeepSeek-V3's report (Table 2) and the DualPipe README give
      DualPipe's and DualPipeV's bubble as (PP/2 - 1)(F&B + B - 3W) for PP = 2p stages, with
      per-chunk forward F, full backward B, weight half W and F&B an overlapped pair. With
      the equal thirds used above (per chunk F = I = W, B = I + W = 2F) that is (p-1)F if the
      pair costs B (its forward hidden) and 2(p-1)F if it costs F + B. torch runs the pair's
      halves one after the other, yet its order idles exactly (p-1)F per rank in `simulate`
      (every m >= 2p: tests/planner/test_pipeline.py), the first figure: (p-1)F over the busy
      m x 2(F + B) = 6mF.
    Ignores: p2p latency, unequal stages (the head makes the last stage slower), optimizer step.
    """
    _check(schedule, p, m, v)
    if p == 1:
        return 0.0
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / m
    if schedule == "interleaved":
        return (p - 1) / (v * m)
    if schedule == "dualpipev":
        return (p - 1) / (6 * m)
    if zero_bubble == "h2":
        return 0.0
    if zero_bubble == "h1":
        return (p - 1) / (3 * v * m)
    raise ValueError(f"zero_bubble={zero_bubble!r}: use 'h1' or 'h2'")


def schedule_microbatches(m: int, per_call: int, p: int) -> int:
    """Micro-batches one pipeline schedule call runs, of the step's m: `per_call` (a run's
    `pp_schedule_microbatches`), or m where it is 0 (one call per optimizer step, as
    scaletrain's trainer and Megatron-Core run it).

    torch.distributed.pipelining runs `n_microbatches` per `step()` call
    (torch/distributed/pipelining/schedules.py: `PipelineScheduleSingle.step` splits its
    whole-batch input into `self._n_microbatches` chunks and `_initialize_stage` sizes the
    stage's per-micro-batch receive buffers for that many; the schedule fills and drains within
    the call). NeMo AutoModel builds its schedule with n_microbatches = local_batch_size /
    pp_microbatch_size and calls it once per local batch, accumulating the step's local batches
    (NVIDIA-NeMo/Automodel 36044ad, nemo_automodel/recipes/llm/train_ft.py: pp_batch_size =
    step_scheduler.local_batch_size, `for i, batch in enumerate(batches)` ->
    `_forward_backward_step` -> `schedule.step`; components/distributed/pipelining/
    functional.py: n_microbatches = local_batch_size // microbatch_size). So a step of m
    micro-batches is m / per_call calls, each paying its own fill and drain. Raises ConfigError
    unless 0, or 1 <= per_call <= m dividing m and >= p (Automodel asserts
    pp_batch_size // pp_microbatch_size >= pp_size)."""
    if per_call == 0:
        return m
    fix = f"give micro-batches per schedule call dividing the step's {m}, at least pp = {p}"
    if per_call < 0 or per_call > m or m % per_call or per_call < p:
        raise ConfigError("pp_schedule_microbatches", per_call, fix)
    return per_call


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
    the count is read off `simulate` (no closed form is claimed). dualpipev: p + 1/2 on every
    rank: 2p + 1 chunk-activations, the DualPipe README's "PP + 1" per device for PP = 2p
    stages (equal to `simulate` of torch's order for every m >= 2p, tested).
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
    if schedule == "dualpipev":
        return p + 0.5
    if schedule == "zero-bubble" and v == 1:
        return float(min(m, p))
    return simulate(schedule, p, m, v, 1.0, 2.0).peak_inflight[stage]


@functools.lru_cache(maxsize=4096)
def inflight_per_rank(schedule: str, p: int, m: int, v: int = 1) -> tuple[float, ...]:
    """`inflight_microbatches` of every rank 0..p-1 (cached: the planner asks per layout)."""
    return tuple(inflight_microbatches(schedule, p, m, r, v) for r in range(p))


# ---- action orders ----------------------------------------------------------------------------


class Action(NamedTuple):
    stage: int
    """Global chunk index (`stage_rank` names its rank)."""
    kind: str
    """'F', 'B', 'I' or 'W'."""
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

    back = INPUT if zero_bubble else BACKWARD

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
        out.append(Action(s, back, take(bwd_idx, s)))
        b_ops.append(op)
        maybe_w(op)
    while zero_bubble and n_w < len(b_ops):
        s = bstage(b_ops[n_w])
        out.append(Action(s, WEIGHT, take(w_idx, s)))
        n_w += 1
    return out


def _dualpipev(rank: int, p: int, m: int) -> list[tuple[Action, ...]]:
    """torch `ScheduleDualPipeV._calculate_single_rank_operations` of `rank`, as groups: a
    group of two is one overlapped F&B action (OVERLAP_F_B, run one after the other).

    Stages a = rank (the V's way down) and b = 2p-1-rank (its way back). In order: 2(p-1-r)
    forwards of a; r+1 pairs F(a) F(b); p-1-r times I(b), a pending W, F(b); the steady
    m-2p+r+1 rounds of F(a)&B(b) then F(b)&B(a) (the last rank runs its first F(a), B(b)
    apart); p-1-r times B(b) then F(b)&B(a); r+1 rounds of backwards of b then a, split into
    I + W from the middle one on; p-1-r times a pending W then a backward of a; the pending
    Ws. DeepSeek-AI 2024 (DualPipe) and the DualPipe repository's dualpipev.py describe the
    same phases."""
    a, b = rank, 2 * p - 1 - rank
    nxt: dict[tuple[int, str], int] = {}
    pending_w: list[tuple[int, int]] = []
    out: list[tuple[Action, ...]] = []

    def act(stage: int, kind: str) -> Action:
        key = (stage, FORWARD if kind == FORWARD else INPUT)  # B and I share a counter
        k = nxt.get(key, 0)
        nxt[key] = k + 1
        if kind == INPUT:
            pending_w.append((stage, k))
        return Action(stage, kind, k)

    def one(stage: int, kind: str) -> None:
        out.append((act(stage, kind),))

    def pair(fwd: int, bwd: int) -> None:
        out.append((act(fwd, FORWARD), act(bwd, BACKWARD)))

    def pop_w() -> None:
        if pending_w:
            stage, k = pending_w.pop(0)
            out.append((Action(stage, WEIGHT, k),))

    for _ in range(2 * (p - 1 - rank)):
        one(a, FORWARD)
    for _ in range(rank + 1):
        one(a, FORWARD)
        one(b, FORWARD)
    for _ in range(p - 1 - rank):
        one(b, INPUT)
        pop_w()
        one(b, FORWARD)
    for i in range(m - 2 * p + rank + 1):
        if i == 0 and rank == p - 1:
            one(a, FORWARD)
            one(b, BACKWARD)
        else:
            pair(a, b)
        pair(b, a)
    for _ in range(p - 1 - rank):
        one(b, BACKWARD)
        pair(b, a)
    split = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        one(b, INPUT if split else BACKWARD)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        one(a, INPUT if split else BACKWARD)
    for _ in range(p - 1 - rank):
        pop_w()
        one(a, INPUT if split else BACKWARD)
    for _ in range(rank + 1):
        pop_w()
    return out


@functools.lru_cache(maxsize=64)
def rank_groups(schedule: str, p: int, m: int, v: int, rank: int) -> tuple[tuple[Action, ...], ...]:
    """`rank_order` as torch schedules it: one group per schedule action, two actions in a
    group for DualPipeV's overlapped F&B (torch runs them one after the other), else one."""
    _check(schedule, p, m, v)
    if schedule == "dualpipev":
        return tuple(_dualpipev(rank, p, m))
    return tuple((a,) for a in rank_order(schedule, p, m, v, rank))


def pipeline_order(schedule: str, p: int, m: int, v: int = 1) -> dict[int, list[Action]]:
    """Per rank, the ordered actions of one step (torch.distributed.pipelining's order)."""
    return {r: list(rank_order(schedule, p, m, v, r)) for r in range(p)}


@functools.lru_cache(maxsize=128)
def rank_order(schedule: str, p: int, m: int, v: int, rank: int) -> tuple[Action, ...]:
    """The ordered actions of pipeline rank `rank` alone (cached for the ranks of the last
    schedules asked: a search walks them for the stored activations and the lowering, then
    keeps only what it counted; a larger cache kept ~190k `Action`s alive in the 405B search,
    and CPython's cyclic collector traverses every one of them at each full collection, ~1 s
    of its cold CPU time)."""
    _check(schedule, p, m, v)
    if schedule == "dualpipev":
        return tuple(a for g in _dualpipev(rank, p, m) for a in g)
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
    W after a split backward — not finished), in whole-rank units (v chunks = 1)."""

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
    or one per rank); each chunk takes 1/v of it. A split backward's halves take
    I = (1 - w_fraction)*tb and W = w_fraction*tb (Qi et al. 2023 measure t_B ~ t_W). An
    action starts when its rank has finished the previous one and its input is ready: F(stage
    s) needs F(s-1) of the same micro-batch, a backward (B or I) of s needs the backward of s+1
    (or F(s) on the last stage), W(s) needs I(s); crossing ranks (`stage_rank`) adds
    `p2p_latency`. DualPipeV's overlapped F&B pairs run one after the other (torch's runtime
    does). Ignores: compute/communication overlap limits, the optimizer step and the loss.
    """
    order = pipeline_order(schedule, p, m, v)
    tfs, tbs = _per_rank(tf, p, "tf"), _per_rank(tb, p, "tb")
    n_stages = p * v
    share = {FORWARD: 1.0, BACKWARD: 1.0, INPUT: 1 - w_fraction, WEIGHT: w_fraction}

    def duration(rank: int, kind: str) -> float:
        return (tfs[rank] if kind == FORWARD else tbs[rank]) * share[kind] / v

    def produces(a: Action) -> tuple[int, str, int]:
        # what later actions wait for: a forward's output, a backward's input gradient (B or
        # I), a weight pass's completion
        return (a.stage, "G" if a.kind in (BACKWARD, INPUT) else a.kind, a.microbatch)

    def needs(a: Action) -> tuple[int, str, int] | None:
        if a.kind == FORWARD:
            return (a.stage - 1, FORWARD, a.microbatch) if a.stage else None
        if a.kind == WEIGHT:
            return (a.stage, "G", a.microbatch)
        if a.stage == n_stages - 1:
            return (a.stage, FORWARD, a.microbatch)
        return (a.stage + 1, "G", a.microbatch)

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
                dep = needs(a)
                ready = 0.0
                if dep is not None:
                    if dep not in done:
                        break
                    far = stage_rank(schedule, p, dep[0]) != r
                    ready = done[dep] + (p2p_latency if far else 0.0)
                start = max(free[r], ready)
                end = start + duration(r, a.kind)
                done[produces(a)] = end
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
        schedule, p, m, v, events, makespan, busy, [_peak_inflight(evs, v) for evs in events]
    )


def _peak_inflight(events: list[Event], v: int) -> float:
    # A chunk-activation is born at the start of its F and dies at the end of its last backward
    # piece (W after a split backward, else B). Sweep the births and deaths in time order.
    marks: list[tuple[float, int]] = []
    for e in events:
        if e.kind == FORWARD:
            marks.append((e.start, 1))
        elif e.kind in (BACKWARD, WEIGHT):
            marks.append((e.end, -1))
    marks.sort(key=lambda t: (t[0], t[1]))  # a death at t frees memory before a birth at t
    live = peak = 0
    for _, d in marks:
        live += d
        peak = max(peak, live)
    return peak / v
