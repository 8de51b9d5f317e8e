"""Pipeline communication of one step: where a receive is posted, when a send may be let go,
and how many stage-boundary tensors a rank holds for them (torch-free).

The trainer's pipeline stages (`parallel/pipeline_stage.py`) allocate a receive buffer when the
receive is posted and drop it once the stage has consumed it, and let a send go as soon as its
receiver has provably received it (`send_releases`). What a rank then holds for communication is
bounded by the schedule's micro-batches in flight, not by their number. This module says, per
rank, where those moments fall in the step (`rank_events`) and how many (b, s_l, h) tensors
they hold at most (`boundary_tensors`); the planner's `pp_p2p` term is that count times one
tensor (`memory/buffers.py`), and the dry-run drives its stages through the same events.

Where the events come from:

- gpipe, 1f1b: torch's `ScheduleGPipe` / `Schedule1F1B._step_microbatches` post a receive just
  before the compute that consumes it. 1F1B waits a send at its next batched exchange: an
  activation before the next backward, a gradient before the next forward or, in the
  cool-down, after the next backward. GPipe waits its activation sends after the last forward
  and its gradient sends at the end of the step.
- interleaved, zero-bubble, dualpipev: torch's `_PipelineScheduleRuntime` runs the compute
  order lowered by `_add_unshard_reshard`, `_add_reduce_grad` and `_add_send_recv` (torch
  2.13 `schedules.py`), reproduced by `lowered_order` (tests/unit/test_pipeline_orders_torch.py
  compares them): a receive is posted on the receiving rank as soon as the sender has
  computed, in a lock-step walk of all ranks. Sends are let go by `send_releases`, what's
  left at the end of the step.

Counted (`boundary_tensors`), each one (b, s_l, h) tensor in the stream's dtype: receive
buffers posted and not yet consumed; a stage's output from its forward until its backward
(torch's `fwd_cache`, and the split backward's `backward_state` until W) or until its send is let
go, whichever is later; a received gradient from its post until the backward that reads it (W
after a split backward); a stage's input gradient from its backward until its send is let go.
Not counted: a received activation once its stage's forward ran (it is the first block's stored
input, counted by the activation model), and an output passed to the next stage on the same
rank (the V's turn) while that stage holds it as its input.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from .pipeline import (
    BACKWARD,
    FORWARD,
    INPUT,
    WEIGHT,
    microbatches_per_round,
    rank_groups,
    stage_rank,
)

__all__ = [
    "Op",
    "lowered_order",
    "send_releases",
    "rank_events",
    "boundary_tensors",
    "walked_microbatches",
    "with_releases",
    "SEND_F",
    "RECV_F",
    "SEND_B",
    "RECV_B",
    "RELEASE",
    "SINGLE_STAGE",
]

SEND_F, RECV_F, SEND_B, RECV_B = "SEND_F", "RECV_F", "SEND_B", "RECV_B"
UNSHARD, RESHARD, REDUCE_GRAD = "UNSHARD", "RESHARD", "REDUCE_GRAD"
RELEASE = "RELEASE"
"""An event of `rank_events`: the send of (stage, microbatch) named by `Op.detail` is let go."""

SINGLE_STAGE = ("gpipe", "1f1b")
_BACKWARDS = (BACKWARD, INPUT)


class Op(NamedTuple):
    stage: int
    kind: str
    """A compute kind of `pipeline.py` ('F', 'B', 'I', 'W'), a communication ('SEND_F',
    'RECV_F', 'SEND_B', 'RECV_B'), torch's 'UNSHARD' / 'RESHARD' / 'REDUCE_GRAD', or
    'RELEASE' (`rank_events`)."""
    microbatch: int = -1
    detail: str = ""
    """For 'RELEASE': the kind of the send let go ('SEND_F' or 'SEND_B')."""


Group = tuple[Op, ...]
"""One action of torch's runtime: a single op, or DualPipeV's overlapped F&B pair."""


def _stage_rank_fn(schedule: str, p: int, v: int) -> Callable[[int], int]:
    """`pipeline.stage_rank` of the schedule's p * v stages, as a table lookup."""
    return [stage_rank(schedule, p, s) for s in range(p * v)].__getitem__


def _groups(schedule: str, p: int, m: int, v: int, rank: int) -> list[Group]:
    """`pipeline.rank_groups` as `Op`s."""
    return [
        tuple(Op(a.stage, a.kind, a.microbatch) for a in g)
        for g in rank_groups(schedule, p, m, v, rank)
    ]


# ---- torch's lowering passes, reproduced ------------------------------------------------------


def _next_stages(groups: Sequence[Group], count: int) -> list[list[int]]:
    """For every position i, the stages `_add_unshard_reshard` prefetches there: the first
    `count` distinct stages computed from i on, a group's stages taken together. Positions
    with the same stages share one list (read only)."""
    out: list[list[int]] = [[] for _ in groups]
    ahead: list[tuple[int, int]] = []  # (stage, group index), distinct, in order of use
    taken: list[int] = []
    for i in range(len(groups) - 1, -1, -1):
        g = groups[i]
        if count >= 2 and len(g) == 1 and ahead and g[0].stage == ahead[0][0]:
            # the stage used next is used here again: the same stages are coming (the first
            # entry's group is compared only once `count` stages are taken)
            ahead[0] = (ahead[0][0], i)
            out[i] = taken
            continue
        mine: list[int] = []
        for a in g:
            if a.stage not in mine:
                mine.append(a.stage)
        ahead = [(s, i) for s in mine] + [x for x in ahead if x[0] not in mine]
        del ahead[count + 2 :]  # enough to cut at a group boundary
        taken = []
        last_group = -1
        for s, gi in ahead:
            if len(taken) >= count and gi != last_group:
                break
            taken.append(s)
            last_group = gi
        out[i] = taken
    return out


def _with_fsdp_and_reduce(groups: Sequence[Group], m: int, max_active: int = 3) -> list[Group]:
    """torch's `_add_unshard_reshard` (prefetch `max_active` stages: UNSHARD the ones coming
    that are not active, RESHARD the active ones not coming, in the set's order) then
    `_add_reduce_grad` (REDUCE_GRAD after a stage's m-th B or W)."""
    nxt = _next_stages(groups, max_active)
    active: set[int] = set()  # a set, as torch's: its iteration order decides RESHARD's order
    out: list[Group] = []
    done: dict[int, int] = {}
    previous: list[int] | None = None
    for i, g in enumerate(groups):
        coming = nxt[i]
        if coming is not previous:  # (the same list: the same stages, nothing to change)
            fetch = [s for s in coming if s not in active]
            for s in [s for s in active if s not in coming]:
                active.remove(s)
                out.append((Op(s, RESHARD),))
            for s in fetch:
                active.add(s)
                out.append((Op(s, UNSHARD),))
            previous = coming
        out.append(g)
        for a in g:
            if a.kind == BACKWARD or a.kind == WEIGHT:
                d = done[a.stage] = done.get(a.stage, 0) + 1
                if d == m:
                    out.append((Op(a.stage, REDUCE_GRAD),))
    for s in list(active):
        out.append((Op(s, RESHARD),))
    return out


@functools.lru_cache(maxsize=8)
def lowered_order(schedule: str, p: int, m: int, v: int) -> dict[int, tuple[Group, ...]]:
    """Per rank, the actions torch's `_PipelineScheduleRuntime` runs for a multi-stage schedule
    (interleaved, zero-bubble, dualpipev): the compute order with UNSHARD / RESHARD /
    REDUCE_GRAD, and the sends and receives `_add_send_recv` places by walking every rank in
    lock step (one action per rank and round, in rank order; an action waits until its input
    was received or computed on its rank; a crossing action's send follows it on its rank and
    the matching receive is appended to the receiver's actions at once).

    An input is on its rank exactly when the action producing it has been placed (a local
    producer is on the same rank; a remote one appends the receive as it is placed), so the
    walk keeps one flag per (stage, micro-batch) and direction instead of each rank's set of
    what it has seen: the same order, at a fraction of the cost (the planner lowers every
    schedule its search meets, `boundary_tensors`)."""
    return _lower(schedule, p, m, v)


def _lower(schedule: str, p: int, m: int, v: int) -> dict[int, tuple[Group, ...]]:
    """`lowered_order`, uncached."""
    if schedule in SINGLE_STAGE:
        raise ValueError(f"{schedule} is run by torch's single-stage loop, not lowered")
    n = p * v
    nm = n * m
    owner = [stage_rank(schedule, p, s) for s in range(n)]
    # done[s*m + k]: F of (stage s, micro-batch k) placed; done[nm + s*m + k]: its B or I
    done = bytearray(2 * nm)
    todo = [_with_fsdp_and_reduce(_groups(schedule, p, m, v, r), m) for r in range(p)]
    out: list[list[Group]] = [[] for _ in range(p)]
    head = [0] * p
    active = list(range(p))
    while active:
        progress = finished = False
        for r in active:
            g = todo[r][head[r]]
            for a in g:
                if not _ready(a, n, m, done):
                    break
            else:
                mine = out[r]
                mine.append(g)
                for s, kind, k, _ in g:
                    if kind == FORWARD:
                        done[s * m + k] = 1
                        if s < n - 1 and owner[s + 1] != r:
                            mine.append((Op(s, SEND_F, k),))
                            out[owner[s + 1]].append((Op(s + 1, RECV_F, k),))
                    elif kind in _BACKWARDS:
                        done[nm + s * m + k] = 1
                        if s > 0 and owner[s - 1] != r:
                            mine.append((Op(s, SEND_B, k),))
                            out[owner[s - 1]].append((Op(s - 1, RECV_B, k),))
                head[r] += 1
                progress = True
                finished = finished or head[r] == len(todo[r])
        if not progress:
            raise RuntimeError(f"{schedule} p={p} m={m} v={v}: no send/receive order exists")
        if finished:
            active = [r for r in active if head[r] < len(todo[r])]
    return {r: tuple(gs) for r, gs in enumerate(out)}


def _ready(a: Op, n: int, m: int, done: bytearray) -> bool:
    """Whether `a`'s input is on its rank (`lowered_order`'s flags): a forward's once the
    previous stage's forward was placed, a backward's once the next stage's backward was."""
    s, kind, k, _ = a
    if kind == FORWARD:
        return s == 0 or done[(s - 1) * m + k] == 1
    if kind in _BACKWARDS:
        return s == n - 1 or done[(n + s + 1) * m + k] == 1
    return True


# ---- when a send may be let go ----------------------------------------------------------------


def send_releases(
    orders: Mapping[int, Sequence[Op]], rank_of: Callable[[int], int], n: int
) -> dict[int, dict[int, list[Op]]]:
    """Per rank, {position: the sends that may be let go just before the op at that position}
    of `orders` (each rank's runtime actions in order, groups flattened).

    A send from rank r to rank q is complete once q has received it, and q receives it before
    its compute that consumes it (the receiving stage's F, or its backward). Rank r knows q got
    that far when r receives something q sent later in its own order: at r's compute waiting
    for a message from q whose send sits after that consumer in q's order. There r can wait
    the send without blocking (gloo, NCCL alike: on one pair of ranks torch's p2p runs on one
    stream, in order). Sends that no later receipt proves complete are waited at the end of
    the step."""
    # per rank, the position of each compute that consumes a message (its stage's F, or its
    # backward: 'back') and of each send
    where: dict[int, dict[tuple[int, str, int], int]] = {}
    for q, ops in orders.items():
        at: dict[tuple[int, str, int], int] = {}
        for i, a in enumerate(ops):
            kind = a[1]
            if kind in (FORWARD, SEND_F, SEND_B):
                at[(a[0], kind, a[2])] = i
            elif kind in _BACKWARDS:
                at[(a[0], "back", a[2])] = i
        where[q] = at
    out: dict[int, dict[int, list[Op]]] = {}
    for r, ops in orders.items():
        # per peer rank, the sends not yet let go, by their consumer's position on the peer
        pending: dict[int, list[tuple[int, int, Op]]] = {}
        mine: dict[int, list[Op]] = {}
        for i, a in enumerate(ops):
            s, kind, k = a[0], a[1], a[2]
            if kind == SEND_F:
                peer = rank_of(s + 1)
                heapq.heappush(
                    pending.setdefault(peer, []), (where[peer][(s + 1, FORWARD, k)], i, a)
                )
                continue
            if kind == SEND_B:
                peer = rank_of(s - 1)
                heapq.heappush(
                    pending.setdefault(peer, []), (where[peer][(s - 1, "back", k)], i, a)
                )
                continue
            if kind == FORWARD and s > 0 and rank_of(s - 1) != r:
                q, source = rank_of(s - 1), (s - 1, SEND_F, k)
            elif kind in _BACKWARDS and s < n - 1 and rank_of(s + 1) != r:
                q, source = rank_of(s + 1), (s + 1, SEND_B, k)
            else:
                continue
            heap = pending.get(q)
            if not heap:
                continue
            sent_at = where[q][source]
            done = []
            while heap and heap[0][0] < sent_at:
                done.append(heapq.heappop(heap)[1:])
            if done:
                mine[i] = [send for _, send in sorted(done)]  # in the order they were fired
        out[r] = mine
    return out


# ---- the events of one rank, and what they hold -----------------------------------------------


def _single_stage_events(schedule: str, p: int, m: int, rank: int) -> list[Op]:
    """gpipe / 1f1b: torch's single-stage loop (see the module docstring)."""
    last, first = rank == p - 1, rank == 0
    out: list[Op] = []
    held: list[Op] = []  # sends fired and not yet waited

    def release(kind: str) -> None:
        for s in [s for s in held if s.kind == kind]:
            out.append(Op(s.stage, RELEASE, s.microbatch, kind))
            held.remove(s)

    for a in [a for g in _groups(schedule, p, m, 1, rank) for a in g]:
        if a.kind == FORWARD:
            if schedule == "1f1b":
                release(SEND_B)  # fused with this forward's receive, waited before it
            if not first:
                out.append(Op(rank, RECV_F, a.microbatch))
            out.append(a)
            if not last:
                out.append(Op(rank, SEND_F, a.microbatch))
                held.append(Op(rank, SEND_F, a.microbatch))
            if schedule == "gpipe" and a.microbatch == m - 1:
                release(SEND_F)
        else:
            if schedule == "1f1b":
                release(SEND_F)  # fused with this backward's receive
            if not last:
                out.append(Op(rank, RECV_B, a.microbatch))
            out.append(a)
            if schedule == "1f1b":
                release(SEND_B)  # the cool-down waits the previous one after this backward
            if not first:
                out.append(Op(rank, SEND_B, a.microbatch))
                held.append(Op(rank, SEND_B, a.microbatch))
    for kind in (SEND_F, SEND_B):
        release(kind)
    return out


def rank_events(schedule: str, p: int, m: int, v: int, rank: int) -> tuple[Op, ...]:
    """Rank `rank`'s step as the trainer runs it: compute ops, receives posted, sends fired and
    let go ('RELEASE' events), in order (groups flattened; torch's UNSHARD / RESHARD /
    REDUCE_GRAD kept)."""
    if schedule in SINGLE_STAGE:
        return tuple(_single_stage_events(schedule, p, m, rank))
    return _multi_stage_events(schedule, p, m, v)[rank]


@functools.lru_cache(maxsize=8)
def _multi_stage_events(schedule: str, p: int, m: int, v: int) -> dict[int, tuple[Op, ...]]:
    return _events(schedule, p, m, v)


def _events(schedule: str, p: int, m: int, v: int) -> dict[int, tuple[Op, ...]]:
    """`rank_events` of every rank of a multi-stage schedule, uncached."""
    orders = {r: [a for g in gs for a in g] for r, gs in _lower(schedule, p, m, v).items()}
    events = with_releases(orders, _stage_rank_fn(schedule, p, v), p * v)
    return {r: tuple(ev) for r, ev in events.items()}


def with_releases(
    orders: dict[int, list[Op]], rank_of: Callable[[int], int], n: int
) -> dict[int, list[Op]]:
    """Every rank's `orders` with the RELEASE events of `send_releases` inserted (the rest at
    the end of the step): the events the trainer's multi-stage runtime and the dry-run
    follow."""
    releases = send_releases(orders, rank_of, n)
    out: dict[int, list[Op]] = {}
    for r, ops in orders.items():
        mine: list[Op] = []
        fired: dict[Op, None] = {}  # in the order fired
        for i, a in enumerate(ops):
            for s in releases[r].get(i, []):
                mine.append(Op(s.stage, RELEASE, s.microbatch, s.kind))
                del fired[s]
            mine.append(a)
            if a.kind in (SEND_F, SEND_B):
                fired[a] = None
        mine.extend(Op(s.stage, RELEASE, s.microbatch, s.kind) for s in fired)
        out[r] = mine
    return out


STEADY_ROUNDS = 3
"""Rounds of micro-batches `boundary_tensors` walks past the warm-up (see there)."""


def walked_microbatches(schedule: str, p: int, m: int) -> int:
    """The micro-batch count whose step holds at most what m's does: past the warm-up the
    rounds repeat, so `STEADY_ROUNDS` of them show every value a longer step shows
    (`boundary_tensors`, and the stored activations of `memory.pipeline_ranks.schedule_moments`);
    GPipe's grow with m."""
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(m, 2 * p)
    if schedule == "dualpipev":
        return min(m, (2 + STEADY_ROUNDS) * p)
    return min(m, STEADY_ROUNDS * microbatches_per_round(p, m))


@functools.lru_cache(maxsize=8192)
def boundary_tensors(schedule: str, p: int, m: int, v: int, rank: int) -> int:
    """The most (b, s_l, h) stage-boundary tensors rank `rank` holds at once for communication
    over one step (see the module docstring for what is counted), walking `rank_events`.

    Past the warm-up every round of micro-batches repeats the same actions on every rank
    (torch's orders are periodic in the steady state), so what a rank holds repeats too: the
    walk stops after `STEADY_ROUNDS` rounds (interleaved / zero-bubble: rounds of
    `microbatches_per_round`; dualpipev: 2p + 3p micro-batches; 1f1b: 2p; gpipe, whose holding
    grows with m, walks all of them). Equal to the whole walk on every legal m up to 16 rounds
    for p <= 8, v <= 4 when written (tests/planner/test_pipeline_memory.py keeps a sample); it
    keeps the search's cost flat in m (the 405B search on 16,384 GPUs evaluates m up to
    2048)."""
    if p == 1:
        return 0
    m = walked_microbatches(schedule, p, m)
    if schedule in SINGLE_STAGE:
        return _most_held_single_stage(schedule, p, m, rank)
    return _most_held_per_rank(schedule, p, m, v)[rank]


@functools.lru_cache(maxsize=8192)
def _most_held_single_stage(schedule: str, p: int, m: int, rank: int) -> int:
    return _most_held(rank_events(schedule, p, m, 1, rank), schedule, p, 1, rank)


@functools.lru_cache(maxsize=512)
def _most_held_per_rank(schedule: str, p: int, m: int, v: int) -> tuple[int, ...]:
    # (uncached: the search keeps only these counts, not the steps' ops, which the cyclic
    # garbage collector would traverse at every full collection)
    events = _events(schedule, p, m, v)
    return tuple(_most_held(events[r], schedule, p, v, r) for r in range(p))


# who holds a boundary tensor (`_most_held`), one bit each
_RECV, _ACT, _CACHE, _SEND = 1, 2, 4, 8
_COUNTED = tuple(1 if h and not h & _ACT else 0 for h in range(16))
"""Per set of holders: 1 if the tensor counts (held, and not as an activation)."""


def _most_held(events: Sequence[Op], schedule: str, p: int, v: int, rank: int) -> int:
    """The walk of `boundary_tensors` over one rank's events (`Op`s, or tuples laid out as
    they are: stage, kind, micro-batch[, detail])."""
    n = p * v
    owner = [stage_rank(schedule, p, s) for s in range(n)]
    # a tensor is alive while it has a holder; the count excludes tensors an activation holds
    holders: dict[tuple[str, int, int], int] = {}
    peak = held = 0

    def hold(t: tuple[str, int, int], who: int) -> None:
        nonlocal held
        h = holders.get(t, 0)
        holders[t] = h | who
        held += _COUNTED[h | who] - _COUNTED[h]

    def drop(t: tuple[str, int, int], who: int) -> None:
        nonlocal held
        h = holders.get(t)
        if h is not None:
            left = h & ~who
            held += _COUNTED[left] - _COUNTED[h]
            if left:
                holders[t] = left
            else:
                del holders[t]

    for a in events:
        s, kind, k = a[0], a[1], a[2]
        if kind == RECV_F:
            hold(("in", s, k), _RECV)
        elif kind == RECV_B:
            hold(("grad", s, k), _RECV)
        elif kind == FORWARD:
            if s > 0 and owner[s - 1] == rank:  # the V's turn: the previous stage's output
                hold(("out", s - 1, k), _ACT)
            else:
                drop(("in", s, k), _RECV)
            if s < n - 1:
                hold(("out", s, k), _CACHE)
        elif kind in _BACKWARDS:
            if s < n - 1 and owner[s + 1] == rank:  # the V's turn back: a local gradient
                drop(("igrad", s + 1, k), _CACHE)
                hold(("grad", s, k), _RECV)
            if s > 0:
                hold(("igrad", s, k), _CACHE)
            if kind == BACKWARD:
                _backward_done(s, k, s > 0 and owner[s - 1] == rank, drop)
        elif kind == WEIGHT:
            _backward_done(s, k, s > 0 and owner[s - 1] == rank, drop)
        elif kind == SEND_F:
            hold(("out", s, k), _SEND)
        elif kind == SEND_B:
            drop(("igrad", s, k), _CACHE)
            hold(("igrad", s, k), _SEND)
        elif kind == RELEASE:
            drop(("out" if a[3] == SEND_F else "igrad", s, k), _SEND)
        if held > peak:
            peak = held
    return peak


def _backward_done(
    s: int, k: int, v_turn: bool, drop: Callable[[tuple[str, int, int], int], None]
) -> None:
    """What a micro-batch's backward of stage s lets go of (its W after a split backward):
    its output, its received gradient, and, on the V's turn (the previous stage on the same
    rank), the previous stage's output held as this stage's input."""
    drop(("out", s, k), _CACHE)
    drop(("grad", s, k), _RECV)
    if v_turn:
        drop(("out", s - 1, k), _ACT)
