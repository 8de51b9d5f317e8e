"""The pipeline-schedule geometry of the per-rank memory model: which pipeline ranks can be
the worst (`rank_candidates`), walking a rank's action order, the backward moments of a
pipeline rank (`schedule_moments`), and a pipeline rank's buffers (`pipeline_buffers`). Used
by `rank.py`; kept apart from `time/pipeline.py` (bubble and in-flight counts of the time
model), which it reads.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal, NamedTuple

from scaletrain.config import Layout, fsdp_reshard_after_forward, stage_layer_ranges

from ..time.pipeline import (
    Action,
    inflight_per_rank,
    microbatches_per_round,
    rank_order,
    stage_rank,
)
from ..time.pipeline_comms import boundary_tensors, walked_microbatches
from ..types import PlanInput
from .buffers import pp_boundary_bytes
from .states import dense_layers_on_rank, stage_layer_counts

if TYPE_CHECKING:  # rank_terms imports rank_moments, which imports this module
    from .rank_terms import ActivationTerms

__all__ = [
    "FsdpState",
    "fsdp_state",
    "pipeline_buffers",
    "rank_candidates",
    "schedule_moments",
    "stored_at",
    "stored_parts",
    "walked_schedule",
    "ScheduleMoment",
]


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
    accumulated: int = 0
    """ZeRO-2/3 (FSDP2 under torch's stage, gradient sync off until REDUCE_GRAD): the stages
    (a bit per global stage id) whose unsharded gradients exist in the reduce dtype, folded
    there by a unit's post-backward hook after the stage's gradients were first made."""
    pending: int = 0
    """ZeRO-2/3: the stages whose weight pass (W) left its compute-dtype gradients that no
    input-gradient pass (I) of the stage has folded yet (`pipeline_fsdp.FsdpRank.grad_bytes`)."""
    embedding_backward: bool = False
    """Whether this moment ends stage 0's full backward, any micro-batch (its last op is the
    token embedding's gradient: the ZeRO-2/3 pipeline's embedding moment)."""
    gathered: int = 0
    """ZeRO-3 resharding after forward (`config.fsdp_reshard_after_forward`): the stages whose
    units a backward gathered and no forward has resharded since (reshard-after-backward is
    off until REDUCE_GRAD); under ZeRO-2 every unit stays gathered, whatever this says."""
    backward_stage: int = -1
    """The stage with blocks whose full backward starts at this moment (B; stage 0's I, which
    torch's W follows at once with stage 0's whole backward), 0 for any such stage when the
    moments carry only FSDP2's gradients (`FsdpState`); -1 at every other moment (ZeRO-2/3:
    the block backward's own tensors, and under ZeRO-3 resharding after forward the units it
    gathers again: `pipeline_fsdp.stage_backward_moment`)."""
    input_stage: int = -1
    """Likewise for an input-gradient pass (a split backward's I, but stage 0's)."""
    reduce_stage: int = -1
    """The stage whose REDUCE_GRAD this moment is (torch's `perform_reduce_grad` after the
    stage's last backward: its first FSDP unit's reduce-scatter); -1 at every other moment.
    `accumulated` / `pending` then hold only the stages not reduced before it."""


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


FsdpState = Literal["off", "grads", "grads_and_units"]
"""What FSDP2 state a rank's schedule moments carry (`schedule_moments`): none (ZeRO-0/1),
the unsharded gradients (`ScheduleMoment.accumulated` / `pending`, the embedding-backward and
REDUCE_GRAD and backward-start marks: ZeRO-2, and ZeRO-3 on a split-backward pipeline), or
those and the gathered units (`gathered`: ZeRO-3 resharding after forward). Moments that differ
only in state a rank does not read are one moment to it, so each rank walks no more than it
needs (the search's cost)."""


def fsdp_state(layout: Layout) -> FsdpState:
    """The FSDP2 state `layout`'s schedule moments need (`FsdpState`)."""
    if layout.pp == 1 or layout.zero < 2:
        return "off"
    return "grads_and_units" if fsdp_reshard_after_forward(layout) else "grads"


@functools.lru_cache(maxsize=8192)
def schedule_moments(
    schedule: str, p: int, m: int, v: int, rank: int, num_layers: int, fsdp: FsdpState = "off"
) -> tuple[ScheduleMoment, ...]:
    """The backward moments of pipeline rank `rank` (`_walk_moments`), walked over
    `time.pipeline_comms.walked_microbatches` micro-batches: past the warm-up the rounds
    repeat, so a longer step has no moment that three rounds do not (GPipe, whose stored
    activations grow with m, is walked whole). Equal to the whole walk on 30,120 cases (every
    schedule, p <= 16, every legal m up to 17 rounds, several layer counts, every rank) when
    written; tests/planner/test_pipeline_memory.py keeps a sample. It keeps the cost of a
    cold search flat in m (the 405B search on 16,384 GPUs walks m up to 2,048).
    Zero-bubble with v > 1 is walked one round more: FSDP2's gradient state
    (`ScheduleMoment.accumulated`) settles a round after what is stored there (a later
    chunk's W-pending gradients are first folded by an I of the next round). Without it
    324 zero-bubble v 2-4 cases of p <= 8 differed from the whole walk (no other schedule
    did); with it none of 5,638 (the test's sample, every schedule) nor of 5,808 more
    (zero-bubble v 2-4 and interleaved v2, p <= 16)."""
    walked = walked_microbatches(schedule, p, m)
    if schedule == "zero-bubble" and v > 1:
        walked = min(m, walked + microbatches_per_round(p, m))
    return _walk_moments(schedule, p, walked, v, rank, num_layers, fsdp)


@functools.lru_cache(maxsize=8192)
def _walk_moments(
    schedule: str, p: int, m: int, v: int, rank: int, num_layers: int, fsdp: FsdpState = "off"
) -> tuple[ScheduleMoment, ...]:
    """`_walk`'s moments with the FSDP2 state `fsdp` carries (`_kept_state`), less those
    another dominates (`_undominated`)."""
    walked = _walk(schedule, p, m, v, rank, num_layers)
    return _undominated({_kept_state(x, fsdp) for x in walked})


@functools.lru_cache(maxsize=4096)
def _walk(
    schedule: str, p: int, m: int, v: int, rank: int, num_layers: int
) -> frozenset[ScheduleMoment]:
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
    Every moment, with all of FSDP2's state (`_walk_moments` keeps what a rank reads)."""
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

    units = _FsdpGrads()

    def now(is_loss: bool, head_weight: bool = False) -> ScheduleMoment:
        return ScheduleMoment(
            stored_layers=stored[0],
            stored_heads=stored[1],
            grads_exist=grads,
            is_loss=is_loss,
            layers_after_input=stored[2],
            heads_after_input=stored[3],
            head_weight=head_weight,
            accumulated=units.accumulated,
            pending=units.pending,
            gathered=units.gathered,
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
        key, bit = (a.stage, a.microbatch), 1 << a.stage
        if a.kind == "F":
            first_forward.setdefault(a.stage, a.microbatch)
            free(key)
            units.gathered &= ~bit  # (ZeRO-3: each unit resharded after its forward)
            held = (layers[a.stage], 1 if a.stage == n - 1 else 0)
            live[key] = held
            stored[0] += held[0]
            stored[1] += held[1]
        elif a.kind in ("B", "I"):
            # a full backward starts: B, or stage 0's I, which torch's W follows at once and
            # runs as stage 0's whole backward
            start = now(a.stage == n - 1)
            if not layers[a.stage]:  # (only a block's backward holds more as it starts)
                out.add(start)
            elif a.kind == "B" or a.stage == 0:
                out.add(start._replace(backward_stage=a.stage))
            else:
                out.add(start._replace(input_stage=a.stage))
            if a.kind == "B":  # a full backward; an input-gradient pass (I) waits for its W
                free(key)
                grads = True
                units.full_backward(bit)
                out.add(_after_backward(now(False), a, first_forward, layers))
            elif a.stage > 0 and key in live and key not in past_input:
                # torch's first stage skips I and runs its whole backward at W; after I its
                # micro-batch holds what it recorded too
                past_input.add(key)
                stored[2] += live[key][0]
                stored[3] += live[key][1]
                units.input_pass(bit)
                out.add(now(False))
        else:  # W: the deferred weight gradients, then the micro-batch's graph is freed
            if a.stage == n - 1:
                out.add(now(False, head_weight=True))
            free(key)
            grads = True
            if a.stage == 0:  # torch defers stage 0's whole backward to its W: a full one
                units.full_backward(bit)
                out.add(_after_backward(now(False), a, first_forward, layers))
            else:
                units.weight_pass(bit)
                out.add(now(False))
        if a.kind in ("B", "W") and units.backward_done(a.stage, m):
            # torch's REDUCE_GRAD of the stage (`schedules._add_reduce_grad`: after its m-th
            # B or W): its reduce-scatters, the stage's unsharded gradients gone after them
            out.add(now(False)._replace(reduce_stage=a.stage))
            units.reduced(bit)
    return frozenset(out)


def _kept_state(moment: ScheduleMoment, fsdp: FsdpState) -> ScheduleMoment:
    """`moment` with the FSDP2 state `fsdp` does not carry cleared (`FsdpState`)."""
    if fsdp == "grads_and_units":
        return moment
    cleared = moment._replace(gathered=0)
    if fsdp == "grads":  # which stage starts its backward: only that one does (0)
        bwd, inp = moment.backward_stage, moment.input_stage
        return cleared._replace(backward_stage=min(bwd, 0), input_stage=min(inp, 0))
    return cleared._replace(
        accumulated=0,
        pending=0,
        embedding_backward=False,
        backward_stage=-1,
        input_stage=-1,
        reduce_stage=-1,
    )


class _FsdpGrads:
    """Which stages of a rank hold FSDP2's unsharded gradients, and in which dtype, through a
    walk of its actions (`ScheduleMoment.accumulated` / `pending`), as torch 2.13 runs FSDP2
    under a pipeline stage: every backward runs with gradient sync and reshard-after-backward
    off (`PipelineStage.backward_maybe_with_nosync`) until the stage's REDUCE_GRAD.

    A unit's post-backward hook (`FSDPParamGroup.post_backward`, fired by the autograd node
    FSDP2 puts on the unit's forward inputs) folds the unit's compute-dtype gradient into an
    unsharded one in the reduce dtype (`FSDPParam.to_accumulated_grad_if_needed` /
    `accumulate_unsharded_grad_if_needed`). A full backward (B, or stage 0's W) fires it right
    after the unit's gradients are made; a split backward's W (`stage_backward_weight`,
    autograd.grad to the weights) does not reach that node, so W's gradients wait in the
    compute dtype until the stage's next I passes the unit's inputs; the first stage's I does
    nothing (torch runs its whole backward at W).

    Under ZeRO-3 resharding after forward, `gathered` follows the units too: a forward
    reshards them (`FSDPParamGroup.post_forward`), a backward gathers them and keeps them
    (its pre-backward unshard, reshard-after-backward off)."""

    __slots__ = ("accumulated", "pending", "gathered", "done")

    def __init__(self) -> None:
        self.accumulated = 0
        self.pending = 0
        self.gathered = 0
        self.done: dict[int, int] = {}

    def full_backward(self, bit: int) -> None:
        self.accumulated |= bit
        self.pending &= ~bit
        self.gathered |= bit

    def input_pass(self, bit: int) -> None:
        self.gathered |= bit
        if self.pending & bit:
            self.full_backward(bit)

    def weight_pass(self, bit: int) -> None:
        self.pending |= bit
        self.gathered |= bit

    def backward_done(self, stage: int, m: int) -> bool:
        """Count a B or W of `stage`: whether it was the stage's last (`_add_reduce_grad`)."""
        self.done[stage] = self.done.get(stage, 0) + 1
        return self.done[stage] == m

    def reduced(self, bit: int) -> None:
        """After the stage's REDUCE_GRAD its gradients are sharded (none left unsharded) and
        its units resharded (the RESHARD after it)."""
        self.accumulated &= ~bit
        self.pending &= ~bit
        self.gathered &= ~bit


def _undominated(moments: set[ScheduleMoment]) -> tuple[ScheduleMoment, ...]:
    """The moments no other moment with the same flags dominates: one with at least as many
    stored layers, layers past I, heads before their I and heads past it, and the stages of
    `accumulated`, `pending` and `gathered` among its own, holds at least as many bytes
    whatever each costs (a layer past I costs its stored bytes plus what I recorded; every
    term, a stage's gradients and units among them, is non-negative)."""
    groups: dict[tuple[bool, bool, bool, int, bool, bool, int, int, int], list[tuple[int, ...]]]
    groups = {}
    for x in moments:
        heads_before = x.stored_heads - x.heads_after_input
        key = (
            x.stored_layers,
            x.layers_after_input,
            heads_before,
            x.heads_after_input,
            x.accumulated,
            x.pending,
            x.gathered,
        )
        flags = (
            x.grads_exist,
            x.is_loss,
            x.head_weight,
            x.deferred_layers,
            x.first_stage,
            x.embedding_backward,
            x.backward_stage,
            x.input_stage,
            x.reduce_stage,
        )
        groups.setdefault(flags, []).append(key)
    kept = []
    for (g, loss, hw, deferred, first, emb, bwd, inp, reduce), group in groups.items():
        for c in group:
            if any(o != c and _covers(o, c) for o in group):
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
                    accumulated=c[4],
                    pending=c[5],
                    gathered=c[6],
                    embedding_backward=emb,
                    backward_stage=bwd,
                    input_stage=inp,
                    reduce_stage=reduce,
                )
            )
    return tuple(sorted(kept))


def _covers(o: tuple[int, ...], c: tuple[int, ...]) -> bool:
    """Whether moment key `o` holds at least what `c` holds: no fewer of each count, and the
    stages of c's gradient and gathered masks among o's."""
    counts = all(a >= b for a, b in zip(o[:4], c[:4], strict=True))
    return counts and all(o[k] & c[k] == c[k] for k in (4, 5, 6))


def stored_parts(acts: ActivationTerms, sm: ScheduleMoment) -> tuple[float, float]:
    """(blocks, heads): the activations a pipeline moment holds, those past their
    input-gradient pass (split backward) with what I recorded for W (blocks) or only what W
    reads (heads: `split_backward`); `acts`: the rank's activation bytes per micro-batch."""
    past = sm.heads_after_input
    blocks = sm.stored_layers * acts.per_layer + sm.layers_after_input * acts.recorded_per_layer
    return blocks, (sm.stored_heads - past) * acts.head + past * acts.head_after_input


@functools.lru_cache(maxsize=1 << 16)
def walked_schedule(
    schedule: str,
    p: int,
    m: int,
    v: int,
    rank: int,
    num_layers: int,
    fsdp: FsdpState,
    stored_bytes: tuple[float, float, float, float],
) -> tuple[tuple[ScheduleMoment, ...], tuple[tuple[float, float], ...]]:
    """A pipeline rank's `schedule_moments` and `stored_parts` of each, in its order
    (`rank_moments.RankView.stored`), with the same arithmetic in one pass. stored_bytes: the
    rank's activation bytes per micro-batch that `stored_parts` reads (`ActivationTerms`'
    per_layer, recorded_per_layer, head, head_after_input). Kept by value across searches, so
    a warm search finds each rank's pair again (`rank.rank_memory`) rather than summing them
    anew: a rank of the 405B search has about six moments, and its warm search made this pass
    for 50,303 ranks (a call of `stored_parts` per moment was 3% of it before the one pass)."""
    per_layer, recorded, head, head_after = stored_bytes
    moments = schedule_moments(schedule, p, m, v, rank, num_layers, fsdp)
    return moments, tuple(
        [
            (
                sm.stored_layers * per_layer + sm.layers_after_input * recorded,
                (sm.stored_heads - sm.heads_after_input) * head + sm.heads_after_input * head_after,
            )
            for sm in moments
        ]
    )


def stored_at(acts: ActivationTerms, sm: ScheduleMoment) -> float:
    """`stored_parts`' sum."""
    blocks, heads = stored_parts(acts, sm)
    return blocks + heads


def _after_backward(
    moment: ScheduleMoment, a: Action, first_forward: dict[int, int], layers: list[int]
) -> ScheduleMoment:
    """The moment after stage `a.stage`'s full backward of `a.microbatch`, marked with the
    chunk's layers (`ScheduleMoment.deferred_layers`) when a micro-batch before it ran that
    chunk's forward first, and on stage 0 as an embedding backward (any micro-batch)."""
    moment = moment._replace(embedding_backward=a.stage == 0)
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
