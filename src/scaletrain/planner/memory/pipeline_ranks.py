"""The pipeline-schedule geometry of the per-rank memory model: which pipeline ranks can be
the worst (`rank_candidates`), walking a rank's action order, the backward moments of a
pipeline rank (`schedule_moments`), and a pipeline rank's buffers (`pipeline_buffers`). Used
by `rank.py`; kept apart from `time/pipeline.py` (bubble and in-flight counts of the time
model), which it reads.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from scaletrain.config import stage_layer_ranges

from ..time.pipeline import Action, inflight_per_rank, rank_order, stage_rank
from ..time.pipeline_comms import boundary_tensors, walked_microbatches
from ..types import PlanInput
from .buffers import pp_boundary_bytes
from .states import dense_layers_on_rank, stage_layer_counts

__all__ = ["pipeline_buffers", "rank_candidates", "schedule_moments", "ScheduleMoment"]


class ScheduleMoment(NamedTuple):
    """One backward moment of a pipeline rank (`schedule_moments`). A named tuple, not a
    dataclass: the moments are kept in a set, sorted and compared as tuples, and cached."""

    stored_layers: int
    """Blocks x micro-batches whose activations are stored (each chunk its own layer count)."""
    stored_heads: int
    """Micro-batches whose head activations are stored (last stage only)."""
    grads_exist: bool
    """Whether the rank's gradients have been allocated by then (its first backward / W)."""
    is_loss: bool
    """Whether this is a loss backward (the last stage's backward of a micro-batch)."""
    layers_after_input: int = 0
    """Of `stored_layers`, those whose input-gradient pass (I) has run: each holds, until its
    weight pass (W), the gradients I recorded for W too (`split_backward.block_recorded_bytes`)."""
    heads_after_input: int = 0
    """Of `stored_heads`, those whose I has run: they hold only what W reads
    (`split_backward.head_after_input_bytes`)."""
    head_weight: bool = False
    """Whether this is the last stage's W of a micro-batch, before it frees the micro-batch:
    the head weight's gradient is being made (`split_backward.head_weight_pass_bytes`)."""
    deferred_layers: int = 0
    """At the end of a chunk's full backward (B, or stage 0's W) of a micro-batch other than
    the first that chunk ran forward: the chunk's layers, whose autocast weight casts that
    first forward made (`rank_moments.cast_grads_per_block`: their gradients wait for the end
    of this backward); 0 at every other moment. stored_layers / stored_heads then count the
    other micro-batches' (this one's are freed)."""
    first_stage: bool = False
    """Whether this moment ends stage 0's full backward of a micro-batch after its first
    (that backward ends with the token embedding's; stage 0 may hold no block)."""


@functools.lru_cache(maxsize=8192)
def rank_candidates(
    num_layers: int, pp: int, virtual: int, schedule: str, m: int, dense_layers: int = 0
) -> tuple[tuple[int, int, float], ...]:
    """(pipeline rank, layers held, micro-batches in flight) of the ranks that can be the worst
    (see the module docstring); in-flight counts are `time.pipeline.inflight_microbatches`.
    dense_layers: an MoE model's dense first blocks (DeepSeek's `first_k_dense_replace`).

    The ranks holding the first or the last stage (rank 0 and pp - 1; rank 0 alone under
    dualpipev's V) are always evaluated; another rank is dropped when one more rank holds at
    least as many MoE blocks, as many dense blocks, micro-batches in flight and communication
    buffers (`time.pipeline_comms.boundary_tensors`: zero-bubble's grow towards the last rank
    while the in-flight count stays). The two kinds of block are compared apart: an MoE block
    holds all its experts' weights, a dense one its wider activations (DeepSeek-V3's 18,432
    MLP), so neither bounds the other (counting only blocks dropped V3's first MoE rank, 285
    GiB, behind its all-dense neighbour at pp 32)."""
    counts = stage_layer_counts(num_layers, pp, virtual, schedule)
    if pp == 1:
        return ((0, counts[0], 1.0),)
    inflight = inflight_per_rank(schedule, pp, m, virtual)
    ends = sorted({stage_rank(schedule, pp, 0), stage_rank(schedule, pp, pp * virtual - 1)})
    # per rank: (MoE blocks, dense blocks, micro-batches in flight, boundary buffers), and
    # under dualpipev the peaks of its walk (`_walk_peaks`)
    held: dict[int, tuple[float, ...]] = {}
    for r in range(pp):
        if r not in ends:
            dense = dense_layers_on_rank(num_layers, dense_layers, pp, virtual, r, schedule)
            buffers = boundary_tensors(schedule, pp, m, virtual, r)
            held[r] = (counts[r] - dense, dense, inflight[r], buffers)
            if schedule == "dualpipev":
                held[r] += _walk_peaks(schedule, pp, m, virtual, r, num_layers)
    kept: dict[tuple[float, ...], int] = {}  # one rank of each
    for r, k in held.items():
        if k in kept or any(
            o != k and all(a >= b for a, b in zip(o, k, strict=True)) for o in held.values()
        ):
            continue
        kept[k] = r
    middle = [
        (r, int(k[0] + k[1]), k[2]) for k, r in sorted(kept.items(), key=lambda x: (x[0], x[1]))
    ]
    first, *last = [(r, counts[r], inflight[r]) for r in ends]
    return (first, *middle, *last)


def _walk_peaks(
    schedule: str, p: int, m: int, v: int, rank: int, num_layers: int
) -> tuple[int, int, int]:
    """The most block activations a pipeline rank's walk (`schedule_moments`) stores at any
    moment, the most of them past their input-gradient pass, and the most layers whose
    deferred cast gradients it holds at once. Under dualpipev a rank's in-flight count is
    an average over its V's two chunks: two middle ranks with equal counts store 16 and 15
    blocks at their peaks (llama-1024, 8 blocks, pp 4, 8 micro-batches), and the pruning kept
    the one with more boundary buffers, 2.4% below the worst (93 of 960 cases of a
    brute-force check over every rank). Under the other schedules the walk's peaks follow the
    in-flight count (the same check: 0 of 4,032), so their ranks are not walked here (it cost
    the 405B search ~13% of its cold time)."""
    moments = schedule_moments(schedule, p, m, v, rank, num_layers)
    return (
        max((mo.stored_layers for mo in moments), default=0),
        max((mo.layers_after_input for mo in moments), default=0),
        max((mo.deferred_layers for mo in moments), default=0),
    )


@functools.lru_cache(maxsize=8192)
def schedule_moments(
    schedule: str, p: int, m: int, v: int, rank: int, num_layers: int
) -> tuple[ScheduleMoment, ...]:
    """The backward moments of pipeline rank `rank` (`_walk_moments`), walked over
    `time.pipeline_comms.walked_microbatches` micro-batches: past the warm-up the rounds
    repeat, so a longer step has no moment that three rounds do not (GPipe, whose stored
    activations grow with m, is walked whole). Equal to the whole walk on 30,120 cases (every
    schedule, p <= 16, every legal m up to 17 rounds, several layer counts, every rank) when
    written; tests/planner/test_pipeline_memory.py keeps a sample. It keeps the cost of a
    cold search flat in m (the 405B search on 16,384 GPUs walks m up to 2,048)."""
    return _walk_moments(schedule, p, walked_microbatches(schedule, p, m), v, rank, num_layers)


@functools.lru_cache(maxsize=8192)
def _walk_moments(
    schedule: str, p: int, m: int, v: int, rank: int, num_layers: int
) -> tuple[ScheduleMoment, ...]:
    """The backward moments of pipeline rank `rank`, walking its action order
    (`pipeline.pipeline_order`, torch's order): (layers x micro-batches whose activations are
    stored, micro-batches of the last stage stored (head and loss graph), whether the step's
    gradients exist yet, whether the moment is the last stage's loss backward, how many of
    those layers and heads are past their I, whether it is the last stage's W, and the
    deferred cast gradients' marks: `ScheduleMoment`).

    A micro-batch's activations of a stage are stored from its forward until its backward
    frees them; after a split backward's input-gradient pass (I: zero-bubble, part of
    DualPipeV's) until its weight pass (W), with what I recorded for W on top
    (`memory.split_backward`: torch keeps the graph for W): the blocks past I are counted
    apart (`layers_after_input`; not on the first stage, whose I does nothing), and so are the
    heads (`heads_after_input`: I frees the loss's graph above the head's matmul). Gradients
    are allocated by the rank's first full backward or W. DualPipeV's V holds the last stage
    on rank 0, so its loss moments are rank 0's. Per backward two moments: as it starts (its
    own activations still stored) and after it (freed, gradients allocated; after an I, its
    micro-batch still stored with what it recorded); the last stage's W has a third, before
    it frees its micro-batch (`head_weight`). Interleaved chunks are
    weighted by their own layer counts (`stage_layer_ranges`), not the average: with pp2 v2
    on 4 layers rank 1 holds a 2-layer chunk and a head-only one. GPipe: every forward
    precedes the first backward, whose moment has all m stored and no gradients; the second
    has m - 1 stored next to the gradients (the dry-run's peak, llama-1024-L4 pp2 gpipe).
    A chunk's full backward of a micro-batch other than the first it ran forward is marked
    in its moment after (`ScheduleMoment.deferred_layers`, `first_stage`): under autocast the
    step's cast cache gives every later micro-batch the first one's weight casts, whose
    backward nodes then run after the rest of this backward
    (`rank_moments.cast_grads_per_block`). Full backwards are B and stage 0's W (torch's
    stage 0 has no input gradient to compute: its I does nothing and its W runs the whole
    backward; dry-run, llama-1024-L4 pp2 zero-bubble rank 0 peaks as 1F1B's, to the byte);
    another stage's W is not marked (a weight-only pass: not measured).
    Dominated moments (same flags, no more of each count) are dropped."""
    n = p * v
    layers = [len(r) for r in stage_layer_ranges(num_layers, n)]
    live: dict[tuple[int, int], tuple[int, int]] = {}
    # the sums over `live` (kept as they change, not re-summed): layers, heads, and of them
    # those past their I
    stored = [0, 0, 0, 0]
    past_input: set[tuple[int, int]] = set()  # (stage, micro-batch) whose I has run
    grads = False
    out: set[ScheduleMoment] = set()
    first_forward: dict[int, int] = {}  # per stage, the micro-batch its casts were made in

    def now(is_loss: bool, head_weight: bool = False) -> ScheduleMoment:
        return ScheduleMoment(
            stored_layers=stored[0],
            stored_heads=stored[1],
            grads_exist=grads,
            is_loss=is_loss,
            layers_after_input=stored[2],
            heads_after_input=stored[3],
            head_weight=head_weight,
        )

    def free(key: tuple[int, int]) -> None:
        held = live.pop(key, None)
        if held is not None:
            stored[0] -= held[0]
            stored[1] -= held[1]
            if key in past_input:
                past_input.discard(key)
                stored[2] -= held[0]
                stored[3] -= held[1]

    for a in rank_order(schedule, p, m, v, rank):
        key = (a.stage, a.microbatch)
        if a.kind == "F":
            first_forward.setdefault(a.stage, a.microbatch)
            free(key)
            held = (layers[a.stage], 1 if a.stage == n - 1 else 0)
            live[key] = held
            stored[0] += held[0]
            stored[1] += held[1]
        elif a.kind in ("B", "I"):
            out.add(now(a.stage == n - 1))
            if a.kind == "B":  # a full backward; an input-gradient pass (I) waits for its W
                free(key)
                grads = True
                out.add(_after_backward(now(False), a, first_forward, layers))
            elif a.stage > 0 and key in live and key not in past_input:
                # torch's first stage skips I and runs its whole backward at W; after I its
                # micro-batch holds what it recorded too
                past_input.add(key)
                stored[2] += live[key][0]
                stored[3] += live[key][1]
                out.add(now(False))
        else:  # W: the deferred weight gradients, then the micro-batch's graph is freed
            if a.stage == n - 1:
                out.add(now(False, head_weight=True))
            free(key)
            grads = True
            if a.stage == 0:  # torch defers stage 0's whole backward to its W: a full one
                out.add(_after_backward(now(False), a, first_forward, layers))
            else:
                out.add(now(False))
    return _undominated(out)


def _undominated(moments: set[ScheduleMoment]) -> tuple[ScheduleMoment, ...]:
    """The moments no other moment with the same flags dominates: one with at least as many
    stored layers, layers past I, heads before their I and heads past it holds at least as
    many bytes whatever each costs (a layer past I costs its stored bytes plus what I
    recorded; every term is non-negative)."""
    groups: dict[tuple[bool, bool, bool, int, bool], list[tuple[int, int, int, int]]] = {}
    for x in moments:
        heads_before = x.stored_heads - x.heads_after_input
        key = (x.stored_layers, x.layers_after_input, heads_before, x.heads_after_input)
        flags = (x.grads_exist, x.is_loss, x.head_weight, x.deferred_layers, x.first_stage)
        groups.setdefault(flags, []).append(key)
    kept = []
    for (g, loss, hw, deferred, first), group in groups.items():
        for c in group:
            if any(o != c and all(a >= b for a, b in zip(o, c, strict=True)) for o in group):
                continue
            kept.append(
                ScheduleMoment(
                    stored_layers=c[0],
                    stored_heads=c[2] + c[3],
                    grads_exist=g,
                    is_loss=loss,
                    layers_after_input=c[1],
                    heads_after_input=c[3],
                    head_weight=hw,
                    deferred_layers=deferred,
                    first_stage=first,
                )
            )
    return tuple(sorted(kept))


def _after_backward(
    moment: ScheduleMoment, a: Action, first_forward: dict[int, int], layers: list[int]
) -> ScheduleMoment:
    """The moment after stage `a.stage`'s full backward of `a.microbatch`, marked with the
    chunk's layers (`ScheduleMoment.deferred_layers`) when a micro-batch before it ran that
    chunk's forward first."""
    if first_forward[a.stage] == a.microbatch:
        return moment
    return moment._replace(deferred_layers=layers[a.stage], first_stage=a.stage == 0)


def pipeline_buffers(
    plan: PlanInput, bufs: dict, buffers: float, rank: int, m: int
) -> tuple[dict, float]:
    """The buffers of a pipeline rank: what its sends and receives hold at most
    (`buffers.pp_boundary_bytes`), and each chunk's own rotary tables."""
    L = plan.layout
    recv = pp_boundary_bytes(plan, rank=rank)
    buffers += recv - bufs.get("pp_p2p", 0.0)
    bufs = dict(bufs, pp_p2p=recv)
    if "rope_tables" in bufs and L.pp_virtual > 1:
        # each chunk's stage module keeps its own cos/sin buffers (dry-run, interleaved
        # v2: 2 x 2.1 MB of module buffers on rank 1)
        buffers += (L.pp_virtual - 1) * bufs["rope_tables"]
        bufs["rope_tables"] *= L.pp_virtual
    return bufs, buffers
