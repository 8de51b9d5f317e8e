"""The ZeRO-2/3 moments of a pipeline rank (torch-free): FSDP2 under torch 2.13's pipeline
stage, as the trainer runs it (`parallel.pipeline`, `parallel.fsdp`).

What torch does (torch/distributed/pipelining/stage.py and schedules.py, fsdp/_fully_shard/):

- every backward of a stage (B, a split backward's I and W) runs with FSDP2's gradient sync,
  reshard-after-backward and last-backward flags off (`backward_maybe_with_nosync`); the
  stage's REDUCE_GRAD action, after its last B or W (`_add_reduce_grad`), turns them on and
  runs each unit's post-backward (`perform_reduce_grad`): the reduce-scatters of the step;
- so a unit gathered for a backward stays gathered until REDUCE_GRAD (ZeRO-2 keeps every
  unit gathered anyway; so does ZeRO-3 on a split-backward pipeline, whose units are not
  resharded after forward: `config.fsdp_reshard_after_forward`), and its unsharded
  gradients stay until then too: folded by the unit's post-backward hook into one gradient
  in the reduce dtype (fp32) as soon as a full backward made them, or, made by a split
  backward's W, waiting in the compute dtype for the stage's next I
  (`pipeline_ranks.ScheduleMoment.accumulated` / `pending`);
- REDUCE_GRAD walks the stage's units root first (FSDP2's `all_states`: the stage module,
  then its blocks in order), each resharded, then its gradients copied into an fp32
  reduce-scatter input with the output shard next to it (`foreach_reduce`), the previous
  unit's input freed first (`reduce_scatter_states`).

Measured with the dry-run: llama-1024-L4 dp2 pp2 (zero-bubble v1 and v2, 1F1B, interleaved
v2, DualPipeV), ZeRO-2 and ZeRO-3, bf16 and fp32, both pipeline ranks (benchmarks/
planner_accuracy.py, the ZeRO pipeline rows).

Units: bytes; every function answers for one pipeline rank (`RankView`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scaletrain.config import fsdp_reshard_after_forward, stage_ids, stage_layer_ranges

from ..types import PlanInput
from .moments import EmbeddingBackward, ZeroPipelineReduce, ZeroStageBackward
from .pipeline_ranks import ScheduleMoment

if TYPE_CHECKING:  # rank_moments and rank_terms import this module
    from scaletrain.config import ParamCounts

    from .rank_moments import RankView
    from .rank_terms import RankStates

__all__ = [
    "BlockWork",
    "FsdpRank",
    "FsdpStage",
    "FsdpWalk",
    "fsdp_rank",
    "fsdp_walk",
    "loss_gathered_bytes",
    "pipeline_embedding_moment",
    "pipeline_reduce_moment",
    "stage_backward_moment",
    "weight_pass_grads",
]

REDUCE_BYTES = 4
"""Bytes per element of the unsharded gradients FSDP2 accumulates and reduce-scatters: the
reduce dtype, fp32 (`precision.reduce_dtype`'s default; the trainer's `MixedPrecisionPolicy`).
A bf16 reduce dtype is not modelled."""


@dataclass(kw_only=True, slots=True, frozen=True)
class FsdpStage:
    """One pipeline stage of a rank, as its FSDP units see it."""

    stage: int
    """Global stage id."""
    blocks: int
    """Its transformer blocks."""
    bit: int
    """1 << stage: its bit in `ScheduleMoment`'s stage masks."""
    params: float
    """Parameters of the stage with gradients (its blocks', its root unit's)."""
    gathered: float
    """Bytes of the stage's units gathered (compute dtype; a LoRA base in its gathered form)."""
    first_unit: float
    """Parameters of the unit REDUCE_GRAD reduces first: the root (embedding, or final norm
    and head), or the stage's first block when the root holds none."""
    next_unit: float
    """Parameters of the unit reduced second (the first block after a root with parameters;
    0 when there is none)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class FsdpRank:
    """A ZeRO-2/3 pipeline rank's stages as FSDP2 holds them (`fsdp_rank`), built once per
    rank: what its moments' unsharded gradients and gathered units are made of."""

    stages: tuple[FsdpStage, ...]
    """The rank's stages, lowest id first."""
    compute_bytes: int
    """Bytes per element of the gathered units and of W's gradients (`PlanInput`'s)."""
    reshard_after_forward: bool
    """`config.fsdp_reshard_after_forward`: ZeRO-3 outside a split backward."""
    last_bit: int
    """The last stage's bit (0 when this rank does not hold it)."""
    all_gathered: float
    """Every unit of the rank gathered (the stages' `gathered` summed)."""
    walks: dict[int, FsdpWalk] = field(default_factory=dict, repr=False, compare=False)
    """This rank's `FsdpWalk` by micro-batches per step (`fsdp_walk`), kept once found."""

    def grad_bytes(self, sm: ScheduleMoment) -> float:
        """The unsharded gradients the rank holds at moment `sm`: per stage, its trained
        parameters in the reduce dtype once a post-backward folded them (`sm.accumulated`)
        and in the compute dtype while a W's wait for the next I (`sm.pending`), both at once
        under mixed precision; under fp32 compute they are one tensor (the reduce dtype is
        the compute dtype: `to_accumulated_grad_if_needed` keeps it). Source: torch 2.13
        `FSDPParam.to_accumulated_grad_if_needed` / `accumulate_unsharded_grad_if_needed`,
        run by `FSDPParamGroup.post_backward`; the dry-run, llama-1024-L4 dp2 pp2 zero-bubble
        z2 bf16, last rank: its loss backward of micro-batch 3 holds the fp32 gradients and
        W1's bf16 ones of all 55.3M parameters (planned 9.5% under with the fp32 ones only).
        Ignores: one unit's gradients being made (a full backward folds them unit by unit; W
        adds each weight's into the held one), a bf16 reduce dtype."""
        acc, pend = sm.accumulated, sm.pending
        total = 0.0
        if self.compute_bytes < REDUCE_BYTES:
            for st in self.stages:
                if acc & st.bit:
                    total += REDUCE_BYTES * st.params
                if pend & st.bit:
                    total += self.compute_bytes * st.params
            return total
        held = acc | pend
        for st in self.stages:
            if held & st.bit:
                total += REDUCE_BYTES * st.params
        return total

    def gathered_bytes(self, sm: ScheduleMoment) -> float:
        """The rank's units gathered at moment `sm`: every one under ZeRO-2 and under ZeRO-3
        on a split-backward pipeline (no reshard after forward), else those of the stages a
        backward gathered since their last forward resharded them (`ScheduleMoment.gathered`).
        Ignores: the units a forward or backward has gathered so far (at most the stage it is
        computing; the moments are taken between them)."""
        if not self.reshard_after_forward:
            return self.all_gathered
        total = 0.0
        for st in self.stages:
            if sm.gathered & st.bit:
                total += st.gathered
        return total

    def params_grad_bytes(self, sm: ScheduleMoment, stage: FsdpStage, params: float) -> float:
        """`grad_bytes` of `params` of `stage`'s parameters alone (a unit of it)."""
        acc, pend = sm.accumulated & stage.bit, sm.pending & stage.bit
        if self.compute_bytes < REDUCE_BYTES:
            return params * (REDUCE_BYTES * bool(acc) + self.compute_bytes * bool(pend))
        return REDUCE_BYTES * params if acc or pend else 0.0


def fsdp_rank(
    plan: PlanInput, *, rank: int, layers: int, counts: ParamCounts, states: RankStates
) -> FsdpRank | None:
    """A ZeRO-2/3 pipeline rank's stages (`config.stage_ids`; None without ZeRO-2/3 or
    pipelining) with their trained parameters: the blocks' (the rank's trained parameters less
    its root units', spread over its blocks by their count: `stage_layer_ranges`) and the
    root's (the token and position embeddings on stage 0, the final norm and head, or a tied
    head's copy, on the last; none under LoRA: frozen), and their gathered bytes (each block's
    unit as gathered, every parameter of the root in the compute dtype). Ignores: a stage's
    own mix of dense and MoE blocks (the rank's mean per block), the expert-parallel experts
    FSDP2 leaves alone (their fp32 gradients counted as the units')."""
    L, pc = plan.layout, counts
    if L.pp == 1 or L.zero < 2:
        return None
    n = L.pp * L.pp_virtual
    held = _stage_layers(plan.model.num_layers, L.pp, L.pp_virtual, L.pp_schedule, rank)
    embedding = pc.embedding / L.tp + pc.position
    head = pc.final_norm + (pc.head or pc.embedding) / L.tp
    all_roots = {s: (embedding if s == 0 else 0.0) + (head if s == n - 1 else 0.0) for s, _ in held}
    roots = {s: 0.0 if plan.lora_rank else r for s, r in all_roots.items()}
    per_block = (states.trainable - sum(roots.values())) / layers if layers else 0.0
    wc, unit = plan.compute_bytes, states.backward.unit_gathered
    out = []
    for s, count in held:
        blocks, root = count * per_block, roots[s]
        out.append(
            FsdpStage(
                stage=s,
                blocks=count,
                bit=1 << s,
                params=blocks + root,
                gathered=count * unit + wc * all_roots[s],
                first_unit=root if root else (per_block if blocks else 0.0),
                next_unit=per_block if root and blocks else 0.0,
            )
        )
    return FsdpRank(
        stages=tuple(out),
        compute_bytes=wc,
        reshard_after_forward=fsdp_reshard_after_forward(L),
        last_bit=(1 << (n - 1)) if any(s == n - 1 for s, _ in held) else 0,
        all_gathered=sum(st.gathered for st in out),
    )


@functools.lru_cache(maxsize=4096)
def _stage_layers(
    num_layers: int, pp: int, virtual: int, schedule: str, rank: int
) -> tuple[tuple[int, int], ...]:
    """(stage id, blocks) of each stage pipeline rank `rank` holds, lowest id first
    (`config.stage_ids`, `stage_layer_ranges`: the trainer's split)."""
    ranges = stage_layer_ranges(num_layers, pp * virtual)
    ids = sorted(stage_ids(rank, pp, virtual, schedule=schedule))
    return tuple((s, len(ranges[s])) for s in ids)


@dataclass(kw_only=True, slots=True, frozen=True)
class FsdpWalk:
    """What FSDP2 holds at each moment of a rank's schedule walk that no activation term of a
    plan enters (`fsdp_walk`): the moments' terms of `stage_backward_moment`,
    `pipeline_reduce_moment` and `rank_moments.loss_moment`, by moment of `schedule`."""

    schedule: tuple[ScheduleMoment, ...]
    """The walk (`pipeline_ranks.schedule_moments`) these terms are of."""
    grads: tuple[float, ...]
    """`FsdpRank.grad_bytes` of each moment."""
    gathered: tuple[float, ...]
    """The units gathered at each moment: every unit without a reshard after forward, at a
    loss backward `loss_gathered_bytes`, else `FsdpRank.gathered_bytes`."""
    regather: tuple[float, ...]
    """`_regather_bytes` of each moment."""
    stage: tuple[tuple[int, int, float, float, float], ...]
    """The moments `stage_backward_moment` compares (all but REDUCE_GRAD's), in order: (index
    in `schedule`, 1 as a full backward starts, 2 as an input-gradient pass starts, else 0,
    and the moment's `grads`, `gathered` and `regather`)."""
    reduces: tuple[tuple[int, float, float, float, float], ...]
    """Each REDUCE_GRAD unit's terms (`pipeline_reduce_moment`), in its order: (the moment's
    index in `schedule`, the units still gathered, the unsharded gradients still held, the
    trained parameters whose sharded gradients exist then, the unit's parameters)."""


def fsdp_walk(view: RankView, fr: FsdpRank) -> FsdpWalk:
    """`fr`'s `FsdpWalk` of `view.schedule`, kept in `fr.walks` by micro-batches per step: an
    `FsdpRank` is cached per search by the layout and states it reads
    (`rank_terms.fsdp_units`: tp, ZeRO stage, pipeline schedule, rank, blocks, trained and
    gathered bytes), which with the micro-batches fix the walk (found again if `view.schedule`
    is another walk). The 405B search builds a ZeRO-2/3 pipeline rank's moments some 35,000
    times for a few thousand walks: per moment these terms were a quarter of its warm
    instructions."""
    hit = fr.walks.get(view.microbatches)
    if hit is not None and hit.schedule is view.schedule:
        return hit
    pc, L = view.counts, view.plan.layout
    walk = _walk_terms(
        fr,
        view.schedule,
        root=fr.compute_bytes * (pc.final_norm + (pc.head or pc.embedding) / L.tp),
        block=view.rank_states.backward.unit_gathered,
        trained=view.rank_states.trainable,
    )
    fr.walks[view.microbatches] = walk
    return walk


@functools.lru_cache(maxsize=16384)
def _walk_terms(
    fr: FsdpRank,
    schedule: tuple[ScheduleMoment, ...],
    *,
    root: float,
    block: float,
    trained: float,
) -> FsdpWalk:
    """`fsdp_walk`'s terms, of values only (kept across searches, whose `FsdpRank`s are each
    search's own, `rank_terms.ModelTerms`): `fr`'s rank over `schedule`, its root unit's
    gathered bytes (final norm and head, `loss_gathered_bytes`), a block's unit gathered
    (block) and its trained parameters (trained)."""
    every = None if fr.reshard_after_forward else fr.all_gathered
    gathered = []
    for sm in schedule:
        if every is not None:
            gathered.append(every)
        elif sm.is_loss:
            gathered.append(_loss_gathered(fr, sm, root=root, block=block))
        else:
            gathered.append(fr.gathered_bytes(sm))
    grads = tuple([fr.grad_bytes(sm) for sm in schedule])
    regather = tuple([_regather_bytes(fr, sm) for sm in schedule])
    stage = tuple(
        [
            (
                i,
                1 if sm.backward_stage >= 0 else 2 if sm.input_stage >= 0 else 0,
                grads[i],
                gathered[i],
                regather[i],
            )
            for i, sm in enumerate(schedule)
            if sm.reduce_stage < 0
        ]
    )
    walk = FsdpWalk(
        schedule=schedule,
        grads=grads,
        gathered=tuple(gathered),
        regather=regather,
        stage=stage,
        reduces=_reduce_units(fr, schedule, trained),
    )
    return walk


def weight_pass_grads(fr: FsdpRank, sm: ScheduleMoment) -> tuple[float, bool]:
    """(gradients held, whether the head's weight gradient is a temporary on top) during the
    last stage's W (`sm` as the W starts). W's gradients of the stage (`weight.grad = dw`, or
    `+= dw` onto gradients W left before, torch `stage_backward_weight`) join `sm.pending`;
    the head's, made last (its parameter group comes after the blocks'), is then either the
    stage's new pending one (nothing held before it: counted in the stage's pending bytes) or
    a temporary added into the held one (`split_backward.head_weight_pass_bytes`)."""
    mixed = fr.compute_bytes < REDUCE_BYTES
    held = sm.pending if mixed else sm.pending | sm.accumulated
    after = sm._replace(pending=sm.pending | fr.last_bit)
    return fr.grad_bytes(after), bool(held & fr.last_bit)


def loss_gathered_bytes(view: RankView, fr: FsdpRank, sm: ScheduleMoment) -> float:
    """The units gathered at the last stage's loss backward (`sm`): `FsdpRank.gathered_bytes`,
    and under ZeRO-3 resharding after forward, when the last stage's forward resharded its
    units just before, the root unit (final norm and head) its pre-backward gathers again and
    the last block that hook prefetches (FSDP2's default backward prefetch, the reverse
    post-forward order: the root names no module to prefetch, `parallel.fsdp`), in the
    compute dtype (the fused loss runs inside the root's forward, so its backward comes after
    that hook). Source: torch 2.13 `FSDPState._pre_backward`, `FSDPParamGroup.pre_backward`
    / `_backward_prefetch`; the dry-run, llama-1024-L4 dp2 z3 pp2 1f1b, last rank: 808.1 MiB
    in bf16 and 971.3 MiB in fp32 at its loss backward (+2.8% / +4.4% with every unit
    gathered). Ignores: the prefetched block's all-gather output beside its copy (the copy-out
    happens at that block's own backward)."""
    pc, L = view.counts, view.plan.layout
    root = fr.compute_bytes * (pc.final_norm + (pc.head or pc.embedding) / L.tp)
    return _loss_gathered(fr, sm, root=root, block=view.rank_states.backward.unit_gathered)


def _loss_gathered(fr: FsdpRank, sm: ScheduleMoment, *, root: float, block: float) -> float:
    """`loss_gathered_bytes` from the root unit's gathered bytes (root) and a block's (block)."""
    gathered = fr.gathered_bytes(sm)
    if not fr.reshard_after_forward or not fr.last_bit or sm.gathered & fr.last_bit:
        return gathered
    last = next(st for st in fr.stages if st.bit == fr.last_bit)
    return gathered + root + (block if last.next_unit else 0.0)


def _resting(view: RankView) -> float:
    """The rank's states without their units in flight: sharded parameters and optimizer
    states (the sharded gradients of the last step were freed by `zero_grad`)."""
    st = view.rank_states.states
    return view.rank_states.fixed - st["params.in_flight"]


@dataclass(kw_only=True, slots=True, frozen=True)
class BlockWork:
    """What a block's backward holds first beyond the stored set, as a backward starts
    (`rank_moments.mlp_backward_work_bytes` of the plan)."""

    full: float
    """A full backward's: the block output's gradient, the MLP's first activation gradients
    and w2's weight gradient."""
    input_pass: float
    """A split backward's input-gradient pass (I): the same without the weight gradient."""


def stage_backward_moment(view: RankView, fr: FsdpRank, work: BlockWork) -> ZeroStageBackward:
    """A pipeline rank's backward under ZeRO-2/3 at the schedule's moment that holds the
    most units, activations and unsharded gradients together
    (`pipeline_ranks.schedule_moments`): its units gathered (`FsdpRank.gathered_bytes`, and at
    the first stage's backward start the units it gathers again: `_regather_bytes`), the
    gradients (`FsdpRank.grad_bytes`), the stored activations (`RankView.stored`), every
    buffer but FSDP's collectives (none runs before REDUCE_GRAD), and as a backward starts
    (`ScheduleMoment.backward_stage`, `input_stage`) what its first block's backward holds
    first (`BlockWork`; after the root's gather again, not beside it). Source: torch 2.13
    `PipelineStage.backward_maybe_with_nosync` (reshard-after-backward and gradient sync off);
    the dry-run, llama-1024-L4 dp2 z3 pp2 1f1b (-12% without the gathered units and
    gradients); at 512 wide (s256, 8,192-row head) the first rank of zero-bubble z2 bf16
    peaks inside its first block's backward, 4.7 MiB over the backward's start (-3.0%
    without `BlockWork`), with two virtual stages inside its block stage's I (-4.1%).
    Ignores: the rest of a block's backward (its compute-dtype weight gradients before its
    post-backward folds them, one at a time under W)."""
    held = view.acts.held_logits if view.last else 0.0
    best, best_total = (0.0, 0.0, 0.0), -1.0
    # per moment: the gradients, the units gathered (at a loss backward the root and a block
    # gathered again first, `loss_gathered_bytes`) and what a backward's start gathers again
    stored = view.stored
    full, input_pass = work.full, work.input_pass
    for index, kind, grads, gathered, regather in (view.fsdp_walk or fsdp_walk(view, fr)).stage:
        blocks, heads = stored[index]
        acts = blocks + heads
        if kind == 1:
            # a full backward starts: its root's gather again (ZeRO-3), then, once that is
            # copied out, its first block's backward
            acts += full if full >= regather else 0.0
            gathered += regather if regather > full else 0.0
        elif kind == 2:  # an input-gradient pass starts
            acts += input_pass
        if acts + grads + gathered > best_total:
            best, best_total = (gathered, grads, acts), acts + grads + gathered
    return ZeroStageBackward(
        states=view.rank_states.fixed,
        params_in_flight=view.rank_states.states["params.in_flight"],
        buffers=view.buffers,
        fsdp=view.fsdp,
        stage_gathered=best[0],
        grads=best[1],
        stored_acts=best[2],
        held_logits=held,
    )


def _regather_bytes(fr: FsdpRank, sm: ScheduleMoment) -> float:
    """Under ZeRO-3 resharding after forward, at the start of the first stage's full
    backward (B): its root unit (the embedding) gathered again by the root's pre-backward,
    with the last block that hook prefetches (FSDP2's default backward prefetch), each as its
    all-gather output and its unsharded copy at once (the copy-out fills the parameters from
    the output, freed after), in the compute dtype. Source: torch 2.13
    `FSDPState._pre_backward`, `FSDPParamGroup.pre_backward` / `wait_for_unshard`; the
    dry-run, llama-1024-L4 dp2 z3 pp2 1f1b fp32, first rank: 1028.0 MiB at the embedding's
    copy-out = states 316.5 + fp32 gradients 211.0 + two micro-batches' blocks 156.0 + 2 x
    (embedding 125.0 + block 43.0) + boundary and RoPE tensors (-7.6% without it; bf16 771.0
    MiB). Ignores: the other stages' first units (a middle stage's root holds no parameters;
    the last stage's loss backward is `loss_gathered_bytes`)."""
    if sm.backward_stage != 0 or not fr.reshard_after_forward or sm.gathered & 1:
        return 0.0
    first = fr.stages[0]  # (the rank's lowest stage: stage 0 if it holds it)
    if first.stage != 0 or not first.next_unit:
        return 0.0
    return 2.0 * fr.compute_bytes * (first.first_unit + first.next_unit)


def pipeline_reduce_moment(view: RankView, fr: FsdpRank) -> ZeroPipelineReduce | None:
    """The largest of the rank's stages' REDUCE_GRAD moments (`ScheduleMoment.reduce_stage`),
    each at the reduce-scatter of the stage's first unit and, after a root with parameters,
    of its first block:

    - states at rest, the buffers but FSDP's collectives (counted here as the unit's own);
    - the units still gathered: those of the stages not reduced yet, less the units of this
      stage resharded before their reduce-scatter (the unit's own, and the root before the
      first block's);
    - the unsharded gradients of the stages not reduced yet (`FsdpRank.grad_bytes`), the
      unit's among them (its list of gradients is alive through `foreach_reduce`; its
      compute-dtype ones, folded into the fp32 ones first, are not), less the root's once it
      is reduced, whose sharded gradients then exist (gradient bytes per parameter / shards),
      like those of the stages reduced before (the rank's sharded gradients in proportion);
    - the unit's fp32 reduce-scatter input (a copy of its gradients) and output shard;
    - the activations still stored (the rank's other stages, under v > 1).
    Source: torch 2.13 `_PipelineStageBase.perform_reduce_grad`, `FSDPParamGroup.post_backward`
    (reshard, then `foreach_reduce`), `FSDPState._lazy_init` (`all_states`: the root first);
    the dry-run, llama-1024-L4 dp2 pp2 zero-bubble z2 bf16, first rank: 760.1 MiB at the
    embedding's reduce-scatter = states 316.5 + blocks gathered 43.0 + fp32 gradients 211.0 +
    the embedding's fp32 input 125.0 and output 62.5 + RoPE tables 2.0 (planned 5.3% under
    with sharded gradients at the end of backward). Ignores: a third unit's reduce-scatter
    (blocks of one stage have one size: the first block's is the largest). None without a
    REDUCE_GRAD moment (no parameters to reduce)."""
    rs_factor = REDUCE_BYTES * (1.0 + 1.0 / max(1, view.plan.layout.zero_shards))
    st = view.rank_states.states
    trained = view.rank_states.trainable
    sharded_per_param = (st["grads"] - st["grads.in_flight"]) / max(1.0, trained)
    best: tuple[float, float, float, float, float] | None = None
    best_total = -1.0
    stored = view.stored
    for index, still, grads, params, unit in (view.fsdp_walk or fsdp_walk(view, fr)).reduces:
        blocks, heads = stored[index]
        terms = (still, grads, sharded_per_param * params, rs_factor * unit, blocks + heads)
        total = terms[0] + terms[1] + terms[2] + terms[3] + terms[4]
        if total > best_total:
            best, best_total = terms, total
    if best is None:
        return None
    return ZeroPipelineReduce(
        states=_resting(view)
        + view.buffers
        - view.fsdp
        + (view.acts.held_logits if view.last else 0.0),
        gathered=best[0],
        grads=best[1],
        sharded_grads=best[2],
        reduce_scatter=best[3],
        stored_acts=best[4],
    )


def _reduce_units(
    fr: FsdpRank, schedule: tuple[ScheduleMoment, ...], trained: float
) -> tuple[tuple[int, float, float, float, float], ...]:
    """`FsdpWalk.reduces`: per REDUCE_GRAD moment of `schedule` (`pipeline_reduce_moment`),
    its first unit's and, after a root with parameters, its first block's terms: (moment
    index, units still gathered, gradients still held, trained parameters whose sharded
    gradients exist, the unit's parameters); a unit without parameters is skipped."""
    wc = fr.compute_bytes
    out = []
    for index, sm in enumerate(schedule):
        if sm.reduce_stage < 0:
            continue
        s = fr.stages[0]
        if s.stage != sm.reduce_stage:
            s = next(x for x in fr.stages if x.stage == sm.reduce_stage)
        live = sm.accumulated | sm.pending | s.bit
        up = live & sm.gathered if fr.reshard_after_forward else live
        unreduced = gathered = 0.0
        for x in fr.stages:
            if live & x.bit:
                unreduced += x.params
            if up & x.bit:
                gathered += x.gathered
        grads = fr.grad_bytes(sm)
        # the unit's compute-dtype gradients, folded into the fp32 ones before the copy
        both = bool(sm.pending & sm.accumulated & s.bit) and wc < REDUCE_BYTES
        units = [(s.first_unit, 0.0, wc * s.first_unit if both else 0.0)]
        if s.next_unit:  # the first block, after the root's reduce-scatter
            root_grads = fr.params_grad_bytes(sm, s, s.first_unit)
            units.append((s.next_unit, s.first_unit, root_grads))
        for unit, before, freed in units:
            if not unit:
                continue
            still = gathered - wc * (before + unit)
            out.append(
                (
                    index,
                    still if still > 0.0 else 0.0,
                    grads - freed,
                    trained - unreduced + before,
                    unit,
                )
            )
    return tuple(out)


def pipeline_embedding_moment(view: RankView, fr: FsdpRank) -> EmbeddingBackward | None:
    """The first stage's embedding backward on a ZeRO-2/3 pipeline, at the end of each of
    stage 0's full backwards (`ScheduleMoment.embedding_backward`: B, or zero-bubble's W):
    its units gathered, the unsharded gradients (`FsdpRank.grad_bytes`: the stage's blocks'
    folded by then, the embedding's own accumulated from an earlier micro-batch), the
    embedding's compute-dtype gradient being made (`head.embedding_backward_bytes`; on the
    first micro-batch its fp32 copy, `to_accumulated_grad_if_needed`, stands where a later
    one's accumulated gradient stands), the other micro-batches' stored activations, the
    RoPE tables and stage-boundary tensors. Source: the dry-run, llama-1024-L4 dp2 pp2
    zero-bubble z2 fp32, first rank: 951.8 MiB = states 316.5 + units gathered 211.0 + fp32
    gradients 211.0 + the embedding's gradient 125.0 + one micro-batch's blocks 78.0 and the
    boundary and RoPE tensors (planned 5.2% under without this moment); bf16, v2 (stage 0
    holds the embedding alone): 783.8 MiB, with W1's bf16 block gradients of stage 2 pending.
    None without such a moment (no first stage on this rank)."""
    bufs = view.buffer_terms
    states = _resting(view)
    for name in ("rope_tables", "pp_p2p"):
        states += bufs.get(name, 0.0)
    held = view.acts.held_logits if view.last else 0.0
    temp, ctx = view.rank_states.backward.embedding_temp, view.runtime_context
    # each candidate's total summed in `EmbeddingBackward.total`'s order without building the
    # record (its cast_grads are 0.0 here); the first largest is built
    best, best_total = None, -1.0
    walk = view.fsdp_walk or fsdp_walk(view, fr)
    for sm, (blocks, heads), grads in zip(view.schedule, view.stored, walk.grads, strict=True):
        if not sm.embedding_backward:
            continue
        parts = (states + fr.gathered_bytes(sm), grads, blocks + heads)
        total = parts[0] + parts[1] + held + temp + ctx + parts[2] + 0.0
        if best is None or total > best_total:
            best, best_total = parts, total
    if best is None:
        return None
    return EmbeddingBackward(
        states=best[0],
        other_grads=best[1],
        held_logits=held,
        embedding_temp=temp,
        runtime_context=ctx,
        stored_acts=best[2],
    )
