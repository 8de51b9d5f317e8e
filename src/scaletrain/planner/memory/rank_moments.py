"""The named moments of one pipeline rank's memory (`moments.py`'s dataclasses), built from
its cached terms: the ZeRO-2/3 backward moments (`zero_moments`), the last stage's loss
backward (`loss_moment`), the first stage's embedding backward (`embedding_moment`), and the
pieces they share (stored activations, the root unit through a ZeRO-3 backward, the autocast
cast gradients a pipelined backward defers: `cast_grads_per_block`).
`rank.rank_memory` takes the largest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

from scaletrain.config import (
    ParamCounts,
    expert_split,
    expert_tp,
    fsdp_reshard_after_forward,
    fused_head_loss,
)

from ..types import PlanInput
from . import pipeline_fsdp
from .activations import mlp_backward_work_bytes
from .head import MicroBatchShape, head_grad_bytes, loss_backward_bytes
from .moments import (
    EmbeddingBackward,
    HeadWeightPass,
    LossBackward,
    Moment,
    ZeroBlockBackward,
    ZeroEndOfBackward,
    ZeroForward,
    ZeroStageBackward,
)
from .pipeline_ranks import ScheduleMoment
from .split_backward import head_weight_pass_bytes

if TYPE_CHECKING:  # rank_terms imports this module (root_in_backward)
    from .rank_terms import ActivationTerms, ModelTerms, RankStates

__all__ = [
    "RankView",
    "root_in_backward",
    "cast_grads_per_block",
    "embedding_moment",
    "stored_activations",
    "zero_moments",
    "pipeline_block_work",
    "pipeline_stage_moment",
    "loss_moment",
    "head_weight_moment",
    "moment_total",
]


@dataclass(kw_only=True, slots=True)
class RankView:
    """What the moments of one pipeline rank read, built once per rank by `rank.rank_memory`:
    the plan, the rank's place in the pipeline, its states, buffers and activation terms."""

    plan: PlanInput
    terms: ModelTerms
    """The model's cached terms (`rank_terms.ModelTerms`)."""
    counts: ParamCounts
    """The model's parameter counts (`ModelConfig.param_counts`)."""
    rank: int
    """Pipeline rank (0 holds the embedding, `last_stage_rank` the head)."""
    layers: int
    """Blocks this rank holds."""
    microbatches: int
    """Micro-batches per step (gradient accumulation, at least 1)."""
    rank_states: RankStates
    """The rank's model states and the parameters they count (`rank_terms.rank_states`)."""
    buffer_terms: dict[str, float]
    """Named buffers (`rank_terms.rank_buffers`; a pipeline rank's receive buffers added)."""
    buffers: float
    """Their sum."""
    fsdp: float
    """The FSDP collectives' buffers (the fsdp_* terms)."""
    fp8_quantize: float
    """fp8's quantization temporary (alive only inside a converted linear)."""
    runtime_context: float
    """The CUDA context term (outside every moment's tensors)."""
    acts: ActivationTerms
    """Activation bytes per micro-batch (`rank_terms.activation_terms`)."""
    schedule: tuple[ScheduleMoment, ...]
    """The pipeline schedule's backward moments of this rank (empty when pp = 1)."""
    last: bool
    """Whether this rank holds the last stage (`time.pipeline.last_stage_rank`: pp - 1, 0
    under dualpipev's V)."""
    stored: Sequence[tuple[float, float]] = ()
    """What each of `schedule`'s moments stores, (blocks, heads) (`pipeline_ranks.stored_parts`
    of `acts`), computed once per rank."""
    fsdp_units: pipeline_fsdp.FsdpRank | None = None
    """ZeRO-2/3 on a pipeline: the rank's stages as FSDP2 holds them (`pipeline_fsdp`)."""
    fsdp_walk: pipeline_fsdp.FsdpWalk | None = None
    """And what they hold at each moment of `schedule` (`pipeline_fsdp.fsdp_walk`), set by
    `rank.rank_memory` once the view is built."""


def root_in_backward(
    plan: PlanInput, pc: ParamCounts, first: bool, last: bool, wc: int
) -> tuple[float, float]:
    """(root unit's unsharded parameters, head gradient held) through a ZeRO-3 backward.

    The root unit holds what is not a block on this stage (embedding + positions on the
    first, final norm + head on the last); FSDP2 gathers it again for the head's backward and
    reshards it only after its post-backward, the last of the step. Until then the head's
    gradient waits unsharded (untied head: a root parameter's grad) or, tied, as the head's
    contribution autograd holds until the embedding's arrives. Both in the compute dtype."""
    L = plan.layout
    root = 0.0
    if first:
        root += pc.embedding / L.tp + pc.position
    if last:
        root += pc.final_norm + (pc.head or (pc.embedding if L.pp > 1 else 0)) / L.tp
    head = 0.0
    if last:
        head = (pc.head or pc.embedding) / L.tp
    return wc * root, wc * head


def cast_grads_per_block(view: RankView) -> float:
    """Bytes of the autocast weight-cast gradients one block of this rank holds from its
    backward to the end of the micro-batch's backward, in a pipelined ZeRO-0/1 step under
    autocast (16-bit compute over fp32 parameters); 0 elsewhere.

    Why they wait: the pipelined step runs its whole schedule inside one autocast context
    (`trainer.step.forward_backward`), so autocast's cast cache hands every later micro-batch
    the 16-bit weight casts the first forward made (`states._in_flight`: one set per step).
    Those casts' backward nodes (ToCopyBackward0) carry that first forward's sequence numbers,
    and torch's autograd engine runs the ready node with the highest sequence number first
    (torch/csrc/autograd/engine.cpp, `CompareNodeTaskTime`): in a later micro-batch's backward
    every cast's node waits until the rest of that backward has run, the first stage's
    embedding backward included, holding the gradient of the cast, which has the cast's shape
    and 16-bit dtype. So at the end of a chunk's backward every block's cast gradients exist
    at once: `params.in_flight` / blocks per block. (Seen on real CPU tensors too: a second
    micro-batch's backward under one autocast context accumulates the embedding's gradient
    before any linear's.) The unpipelined step enters autocast per micro-batch, so each
    forward makes fresh casts, whose nodes run in order: nothing waits (dry-run, a z1
    llama-1024 x 12 blocks, 2 micro-batches: no rise through the second backward).
    A split backward's last stage also casts its plain head Linear (`fused_head_loss` is off):
    not a block's, left out of the per-block share.
    Source: the dry-run of llama3-8b dp2 z1 pp4 1f1b, full AC, bf16, s2048: in every
    steady-state backward each block adds 0.406 GiB (2 B x a block's 218M linear
    parameters) until the backward ends, on ranks 0, 2 and 6 (-9.0% / -10.7% / -1.2% before
    this term); llama-1024-L4 z0 pp2 rank 0 under 1F1B, GPipe, interleaved and zero-bubble
    (-9.8% to -10.5% before, -0.2% to +0.5% with it).
    Ignores: a split backward's weight-only pass (W of a stage but the first: not measured),
    LoRA (frozen weights' casts have no gradient, the adapters' are small), the dense and MoE
    blocks' different cast sizes (the rank's mean), the non-cached expert casts (made per
    micro-batch: their nodes run in order).
    """
    plan, layers = view.plan, view.layers
    L = plan.layout
    if L.pp == 1 or L.zero >= 2 or plan.lora_rank or not layers:
        return 0.0
    casts = view.rank_states.states["params.in_flight"]
    if view.last and not fused_head_loss(L):
        # a split backward's last stage casts its plain head Linear (`states._in_flight`);
        # the fused loss casts the head itself, for its forward and backward only
        casts -= 2.0 * (view.counts.head or view.counts.embedding) / L.tp
    return max(0.0, casts) / layers


def embedding_moment(view: RankView) -> EmbeddingBackward:
    """Memory of the first stage when the token embedding's gradient is computed: the
    largest of the last micro-batch's (`_last_embedding_moment`) and, on a ZeRO-0/1
    pipeline, a later micro-batch's in the steady state (`_steady_embedding_moment`)."""
    last = _last_embedding_moment(view)
    if view.fsdp_units is not None:
        piped = pipeline_fsdp.pipeline_embedding_moment(view, view.fsdp_units)
        return piped if piped is not None and piped.total > last.total else last
    if view.plan.layout.zero >= 2 or view.plan.layout.pp == 1:
        return last
    steady = _steady_embedding_moment(view)
    return steady if steady is not None and steady.total > last.total else last


def _steady_embedding_moment(view: RankView) -> EmbeddingBackward | None:
    """The first stage's embedding backward of a micro-batch after the first, ZeRO-0/1
    pipelines (None with one micro-batch).

    Unlike the last micro-batch of an unpipelined step (`_last_embedding_moment`), every
    gradient exists by then (the embedding's own, accumulated since the first backward), the
    weight casts are alive (autocast's cache holds them for the whole step), every block of
    the stage holds its cast gradients (`cast_grads_per_block`: their backward runs after the
    embedding's), and the other micro-batches in flight keep their stored activations (the
    schedule's moment after this backward: `ScheduleMoment.deferred_layers`, first stage) and
    the stage-boundary tensors their sends and receives hold (`pp_p2p`). The embedding's
    gradient temporary (`memory.head.embedding_backward_bytes`) is added to the existing
    gradient after it is complete. Source: the dry-run of llama3-8b dp2 z1 pp4 1f1b, full
    AC, bf16, s2048, rank 0: 31.43 GiB = states with the gradients 22.92 + casts 2.84 + their
    gradients 2.84 + three micro-batches' 7 block inputs 0.66 + boundary tensors 0.16 + the
    embedding's fp32 gradient 1.96 (-9.0% with the last micro-batch's moment); llama-1024-L4
    z0 pp2 interleaved v2 rank 0, whose stage 0 holds no block (the casts' gradients are
    those of its other chunk, whose backward has ended): +0.5%; the same layout under 1F1B in
    fp32 (no casts: the other terms alone), -0.2% (-0.2% in bf16).
    Ignores: the stage output's gradient received for this micro-batch (one (tokens x h)
    tensor, counted in `pp_p2p` only while its buffer is held)."""
    bufs, st = view.buffer_terms, view.rank_states.states
    cast = cast_grads_per_block(view)
    stored, layers = -1.0, 0
    for sm, (blocks, heads) in zip(view.schedule, view.stored, strict=True):
        if sm.first_stage:
            held = blocks + heads
            if held > stored:
                stored, layers = held, sm.deferred_layers
    if stored < 0:
        return None
    states = view.rank_states.fixed
    for name in ("ddp_buckets", "rope_tables", "pp_p2p"):
        states += bufs.get(name, 0.0)
    return EmbeddingBackward(
        states=states,
        other_grads=st["grads"] - st["grads.in_flight"],
        held_logits=view.acts.held_logits if view.last else 0.0,
        embedding_temp=view.rank_states.backward.embedding_temp,
        runtime_context=view.runtime_context,
        stored_acts=stored,
        cast_grads=layers * cast,
    )


def _last_embedding_moment(view: RankView) -> EmbeddingBackward:
    """Memory of the first stage when the token embedding's gradient of the step's last
    micro-batch is computed (of its only one, unpipelined).

    It is the last gradient backward computes: every other gradient is complete, every
    activation is freed except the logits the loop still holds (last stage), and
    `memory.head.embedding_backward_bytes` is alive. ZeRO-2/3: only the root unit (embedding, and
    with pp = 1 the final norm and head) is still unsharded, with the untied head's unsharded
    gradient, and the last block's fp32 reduce-scatter input is still held (FSDP2 frees it when
    the next unit's reduce-scatter is issued); DDP's buckets persist. Source: measured with the
    dry-run, gpt2-124m-L2 dp2 z0 fp32 (-10.8% before this moment was modelled), gpt2-350m-L2
    dp4 z3 tp4 fp32 (-32%) and llama2-7b-L1 dp4 z3 tp2+sp (+12% with the old ZeRO-3 moment).
    """
    plan, pc, bufs = view.plan, view.counts, view.buffer_terms
    st, count, fixed = view.rank_states.states, view.rank_states.params, view.rank_states.fixed
    bwd_terms = view.rank_states.backward
    L, model = plan.layout, plan.model
    root_live, head_held = bwd_terms.root_unit, bwd_terms.head_grad_held
    blk, tmp = bwd_terms.block_params, bwd_terms.embedding_temp
    grads_rest = st["grads"] - st["grads.in_flight"]
    states = fixed - st["params.in_flight"]
    if L.zero >= 2:
        # the root unit's gradients are reduce-scattered after this moment: none of the
        # root's sharded grads exist yet
        wc = plan.compute_bytes
        other = 1.0 - root_live / wc / count if count else 0.0
        if model.tie_embeddings and L.pp == 1:
            head_held = 0.0  # the head's contribution is in `tmp`
        states += root_live + head_held + 4.0 * blk
    else:
        other = 1.0 - pc.embedding / L.tp / count if count else 0.0
        states += bufs.get("ddp_buckets", 0.0)
    states += bufs.get("rope_tables", 0.0)
    # + ctx: the runtime context is outside every moment's tensors
    return EmbeddingBackward(
        states=states,
        other_grads=grads_rest * max(0.0, other),
        held_logits=view.acts.held_logits if view.last else 0.0,
        embedding_temp=tmp,
        runtime_context=view.runtime_context,
    )


def stored_activations(
    view: RankView, *, in_flight: float, late_grads: float = 0.0, acts_only: bool = False
) -> tuple[float, float, float]:
    """(largest stored activations, the blocks' part of them, activations + the gradients that
    exist by then) of a rank; pipelines walk the schedule's own moments
    (`pipeline_ranks.schedule_moments`: stored activations per chunk, whether the gradients
    exist yet). late_grads: gradients backward computes only after every block's (the first
    stage's embedding tables), absent from a one-micro-batch block backward. acts_only: a
    ZeRO-2/3 pipeline rank, whose moments read only the first (`pipeline_fsdp` counts the
    gradients per moment): the other two are not found (0.0)."""
    plan, st, layers, m = view.plan, view.rank_states.states, view.layers, view.microbatches
    acts_terms = view.acts
    per_layer, recompute, head_acts = acts_terms.per_layer, acts_terms.recompute, acts_terms.head
    one_layer = per_layer
    extra = 0.0
    if recompute and layers:
        # the block being recomputed in backward: full's block input is part of its set,
        # selective keeps its stored tensors next to what the recompute re-creates
        one_layer = recompute if plan.ac == "full" else per_layer + recompute
        extra = recompute
    grads = st["grads"]
    if plan.layout.pp > 1 and acts_only:
        acts = -1.0
        for blocks, heads in view.stored:
            stored = blocks + heads
            if stored > acts:
                acts = stored
        return acts + extra, 0.0, 0.0
    if plan.layout.pp > 1:
        acts = fwdbwd = most = -1.0
        for x, (blocks, heads) in zip(view.schedule, view.stored, strict=True):
            # past their input-gradient pass (split backward): a block holds what it
            # recorded for W too, a head only what W reads (`pipeline_ranks.stored_parts`)
            stored = blocks + heads
            with_grads = stored + (grads if x.grads_exist else 0.0)
            if stored > acts:
                acts = stored
            if with_grads > fwdbwd:
                fwdbwd = with_grads
            if blocks > most:
                most = blocks
        # (ZeRO-2/3 defer no cast gradients: `cast_grads_per_block` is 0, not asked)
        deferred = _deferred_casts(view, one_layer) if plan.layout.zero < 2 else 0.0
        return acts + extra, most, max(fwdbwd + extra, deferred)
    first = in_flight * acts_terms.first_block_less if view.rank == 0 and layers else 0.0
    acts = in_flight * layers * per_layer - first + extra + (head_acts if view.last else 0.0)
    block_stored = in_flight * layers * per_layer - first
    if m > 1:
        return acts, block_stored, acts + grads
    # one micro-batch, no pipeline: the backward trades activations for grads; at the last
    # block's backward every gradient exists but the embedding tables' (`late_grads`,
    # `embedding_moment`'s)
    return acts, block_stored, max(acts + st["grads.in_flight"], grads - late_grads + one_layer)


def _deferred_casts(view: RankView, one_layer: float) -> float:
    """Activations and gradients of a pipeline rank at the end of a chunk's backward of a
    micro-batch after the first, ZeRO-0/1 under autocast (0 elsewhere): the other
    micro-batches' stored activations (`ScheduleMoment.deferred_layers`' moment) and every
    gradient, with either the chunk's last block in backward (its own set `one_layer`: under
    full AC the whole re-created set, its input in it; the MLP backward's first gradients,
    w2's cast gradient among them, `mlp_backward_work_bytes`) beside the cast gradients of
    the chunk's other blocks (`cast_grads_per_block`), or, once it is done, every block's.
    Source: the dry-run of llama3-8b dp2 z1 pp4 1f1b, full AC, s2048: the middle rank 2 (9
    blocks) peaks inside its last block's backward at 30.26 GiB, 0.648 GiB over the block's
    start with 8 blocks' cast gradients held (-10.7% without them), the last rank 6 likewise
    at 28.93 GiB with 6 (-1.2%: its loss backward comes before any cast gradient).
    Ignores: the stage input's gradient at the end (one (tokens x h) tensor)."""
    cast = cast_grads_per_block(view)
    if not cast:
        return 0.0
    inside = one_layer + _block_backward_work(view)
    best = 0.0
    for sm, (blocks, heads) in zip(view.schedule, view.stored, strict=True):
        if sm.deferred_layers:
            others = blocks + heads
            chunk = max(inside + (sm.deferred_layers - 1) * cast, sm.deferred_layers * cast)
            best = max(best, others + chunk)
    return best + view.rank_states.states["grads"] if best else 0.0


def _block_backward_work(view: RankView, *, weight_grad: bool = True) -> float:
    """What a block's backward holds first beyond its stored set: the block output's
    gradient, the MLP's first activation gradients and w2's weight gradient
    (`mlp_backward_work_bytes`, compute-dtype gradients; without it, weight_grad=False: a
    split backward's input-gradient pass), cached per search in `view.terms.mlp_work`."""
    plan = view.plan
    L = plan.layout
    wc = plan.compute_bytes
    # MoE experts run as grouped GEMMs (models/moe.py `expert_kernel`) unless fp8 (per-expert
    # scales) or tensor-parallel experts (DTensor weights) keep the per-expert loop; a grouped
    # backward holds no separate first weight gradient at this moment (the dry-run of
    # mixtral-8x7b-L2 dp8 z3 ep8 selective bf16 dropped by exactly h*f*2 B = 117.4 MB when the
    # experts moved from the loop to _grouped_mm)
    grouped = plan.model.is_moe and plan.precision != "fp8" and expert_tp(L.tp, L.ep) == 1
    tokens = plan.seq_len / L.cp * plan.micro_batch
    # (a frozen w2 under LoRA has no weight gradient)
    weight_bytes = 0 if grouped or plan.lora_rank or not weight_grad else wc
    key = (tokens, L.tp, L.sp, wc, weight_bytes)
    work = view.terms.mlp_work.get(key)
    if work is None:
        work = view.terms.mlp_work[key] = mlp_backward_work_bytes(
            plan.model, tokens=tokens, tp=L.tp, sp=L.sp, e=wc, weight_bytes=weight_bytes
        )
    return work


def zero_moments(
    view: RankView, block_stored: float, stage: ZeroStageBackward | None = None
) -> list[Moment]:
    """ZeRO-2/3's moments (FSDP2 as parallel/fsdp.py builds it; measured with the dry-run,
    llama2-7b-L1 dp8 z3: +12% and llama-1024-L4 dp4 z2 fp32: +6% before the block moment
    was modelled):

    - a block's backward: ZeRO-3 gathers the root unit (embedding and/or final norm + head)
      again for the head's backward and keeps it unsharded until its post-backward at the
      very end (ZeRO-2 keeps every unit gathered anyway), with the head's unsharded 16-bit
      gradient (untied) or the head's gradient contribution autograd holds for the tied
      embedding; ZeRO-3 gathers the block's unit (and prefetches the next one); its unsharded
      grads fill, then its fp32 reduce-scatter input is allocated after the unit's parameters
      are freed (the previous block's input is still held while the next block computes;
      with two blocks no block both prefetches and holds one, `_zero3_block_copies`, and the
      end of block 0's backward holds every later block's sharded grads).
      The head's activations are freed by then, except the logits the loop holds.
    - the end of backward, the root unit's post-backward (`_end_of_backward`). The embedding's
      gradient is `embedding_moment`. block_stored: the blocks' stored activations
      (`stored_activations`).
    - pipelines: `_pipeline_zero_moments` instead (stage: its stage backward, when
      `rank.rank_memory` built it first, `pipeline_stage_moment`).
    """
    plan, layers, m = view.plan, view.layers, view.microbatches
    L = plan.layout
    if L.pp > 1:
        return _pipeline_zero_moments(view, stage)
    st, fixed = view.rank_states.states, view.rank_states.fixed
    buffers, fsdp, acts_terms = view.buffers, view.fsdp, view.acts
    bwd_terms = view.rank_states.backward
    per_layer, recompute = acts_terms.per_layer, acts_terms.recompute
    held_logits = acts_terms.held_logits
    root_live, head_held = bwd_terms.root_unit, bwd_terms.head_grad_held
    # one block's unit as gathered (wc x its parameters, or under LoRA its frozen base in
    # its gathered form) and its parameters with gradients (all, or its adapters)
    gathered, trained = bwd_terms.unit_gathered, bwd_terms.unit_grads
    wc = plan.compute_bytes
    rest = fixed - (st["params.in_flight"] if fsdp_reshard_after_forward(L) else 0.0)
    grads_rest = st["grads"] - st["grads.in_flight"]
    more = 1.0 if layers > 1 else 0.0  # a next block to prefetch / a previous RS input
    if fsdp_reshard_after_forward(L):
        # a block's compute: its gathered copy and its 16-bit grads, with the next block
        # prefetched and the previous block's fp32 reduce-scatter input held, both only in a
        # middle block (`_zero3_block_copies`)
        compute = _zero3_block_copies(gathered, wc * trained, 4.0 * trained, layers)
        reduce = gathered * more + wc * trained + 4.0 * trained
    else:
        root_live = 0.0  # counted in `fixed` with every other gathered unit
        compute, reduce = wc * trained + 4.0 * trained * more, wc * trained + 4.0 * trained
    held = held_logits if view.last else 0.0
    accumulated = grads_rest if m > 1 else 0.0
    if m > 1:
        bwd = block_stored + grads_rest
    else:  # the last block to finish has every other block's grads and no activations
        bwd = max(block_stored - per_layer, grads_rest * (layers - 1) / layers)
    copies = max(compute, reduce)
    block_buffers = buffers
    if plan.ac == "full":
        bwd += recompute  # the block being recomputed (its whole no-AC set)
    if layers:
        stored = block_stored
        last = None
        if m == 1:
            # or the last block's backward next to every later block's gradient, where a
            # block's grads outweigh its activations (fp32 expert-parallel experts under
            # ZeRO-3: dry-run, mixtral-8x7b dp8 z3 ep8 selective, peak in block 1's backward
            # with blocks 2.. 's grads: -2.5% at 8 blocks with only the stored-acts side).
            # The later blocks' grads: the rank's sharded grads but the root unit's, which
            # exist only after its reduce-scatter at the very end of backward (ZeRO-2/3,
            # `_end_of_backward`; a frozen root under LoRA has none)
            root_g = 0.0
            if L.zero >= 2 and not plan.lora_rank:
                root_g = min(grads_rest, bwd_terms.root_sharded_grads)
            last = per_layer + (grads_rest - root_g) * (layers - 1) / layers
            stored = max(stored, last)
        if last is not None and more and fsdp_reshard_after_forward(L):
            # the end of the last block's backward (block 0): its stored activations, the
            # later blocks' grads, its own 16-bit grads, its gathered copy and the previous
            # block's fp32 reduce-scatter input, no next block to prefetch. Dry-run,
            # phi-3-mini-L2 dp8 z3 bf16 s2048: 2.449 GB = sharded states 0.635 + the root
            # and block 0 gathered 0.621 + block 1's fp32 input 0.453 and sharded grads
            # 0.057 + block 0's bf16 grads 0.227 + the head's 0.197 + block 0's activations
            # (planned -0.9%; llama2-7b-L2 -0.5%)
            end = last + (recompute if plan.ac == "full" else 0.0)
            end_copies = gathered + wc * trained + 4.0 * trained
            if end + end_copies > bwd + copies:
                bwd, copies = end, end_copies
        bwd, copies, block_buffers = _early_block_backward(
            view,
            stored=stored + accumulated + recompute,
            more=more,
            bwd=bwd,
            copies=copies,
            last=None if last is None or not more else last + recompute,
        )
    out: list[Moment] = [
        ZeroBlockBackward(
            states=rest,
            buffers=block_buffers,
            fsdp=fsdp,
            root_unit=root_live,
            head_grad=head_held,
            unit_copies=copies,
            acts_and_grads=bwd,
            held_logits=held,
        ),
        _end_of_backward(view, rest=rest, grads_rest=grads_rest, held=held),
    ]
    if fsdp_reshard_after_forward(L) and layers:
        out.append(_zero_forward(view, rest=rest, accumulated=accumulated, gathered=gathered))
    return out


def _outside_experts_grad_work(view: RankView) -> float:
    """What an MoE block's full backward adds under ZeRO-2/3 with ep > 1, where FSDP2 leaves
    the experts alone (fp32 parameters, cast by autocast for the grouped GEMMs): the fp32
    gradients the casts' backward makes from the GEMMs' 16-bit weight gradients, every expert
    weight stack's before any is accumulated into its .grad, 4 B x the block's local expert
    parameters. Source: the dry-run's op log, qwen3-30b-a3b-L2 dp2 z3 pp2 1f1b ep2 bf16, last
    rank: three 384 MiB fp32 stacks (64 experts x 768 x 2048) after the three 192 MiB bf16
    ones, at its peak (-3.4% without them). Ignores: the accumulation's own temporary (one more
    stack), a stage with more than one MoE block (one block's at a time), fp8 experts."""
    plan = view.plan
    L, model = plan.layout, plan.model
    if not (model.is_moe and L.ep > 1 and L.zero >= 2) or plan.compute_bytes >= 4:
        return 0.0
    if plan.precision == "fp8" or plan.lora_rank or not view.layers:
        return 0.0
    return 4.0 * view.counts.mlp / expert_split(L)


def pipeline_block_work(view: RankView) -> pipeline_fsdp.BlockWork:
    """What a block's backward holds first on a ZeRO-2/3 pipeline rank
    (`pipeline_fsdp.BlockWork`): a full backward's (`_block_backward_work`, with the experts'
    fp32 gradient casts outside FSDP2, `_outside_experts_grad_work`) and, under a split
    backward (zero-bubble, DualPipeV), an input-gradient pass's; none on a rank without
    blocks. The same on every rank of a plan that holds blocks (`rank.PlanFacts.block_work`)."""
    full = _block_backward_work(view) if view.layers else 0.0
    full += _outside_experts_grad_work(view)
    # (input-gradient passes only under a split backward: zero-bubble, DualPipeV)
    split = view.layers and not fused_head_loss(view.plan.layout)
    inputs = _block_backward_work(view, weight_grad=False) if split else 0.0
    return pipeline_fsdp.BlockWork(full=full, input_pass=inputs)


def pipeline_stage_moment(
    view: RankView, work: pipeline_fsdp.BlockWork | None = None
) -> ZeroStageBackward:
    """A ZeRO-2/3 pipeline rank's stage backward (`pipeline_fsdp.stage_backward_moment`, the
    first of `_pipeline_zero_moments`): built apart so that `rank.rank_memory` can test the
    search's miss shortcut against it before the others are built. work: the plan's
    `pipeline_block_work`, if already found."""
    fr = view.fsdp_units
    assert fr is not None  # (built for every ZeRO-2/3 pipeline rank)
    if work is None:
        work = pipeline_block_work(view)
    return pipeline_fsdp.stage_backward_moment(view, fr, work)


def _pipeline_zero_moments(view: RankView, stage: ZeroStageBackward | None) -> list[Moment]:
    """ZeRO-2/3's moments of a pipeline rank (`pipeline_fsdp`): torch's stage keeps the
    units gathered and their gradients unsharded until the stage's REDUCE_GRAD, whose
    reduce-scatters end its backward. The unpipelined block moment (a block's gradients
    reduce-scattered as its backward ends, the next block prefetched) does not happen there:
    it was 5.6% over at 512 wide (llama-512-L4 dp2 z2 pp2 zero-bubble fp32, last rank),
    counting an fp32 reduce-scatter input no pipelined backward allocates. stage: the stage
    backward if already built (`pipeline_stage_moment`)."""
    fr = view.fsdp_units
    assert fr is not None  # (built for every ZeRO-2/3 pipeline rank)
    out: list[Moment] = [stage if stage is not None else pipeline_stage_moment(view)]
    reduce_grad = pipeline_fsdp.pipeline_reduce_moment(view, fr)
    if reduce_grad is not None:
        out.append(reduce_grad)
    return out


def _zero3_block_copies(gathered: float, grads: float, rs_input: float, layers: int) -> float:
    """The FSDP copies of a block's backward under ZeRO-3, at the end of its compute: its
    gathered parameters and unsharded gradients (grads), the next block's gathered copy that
    the explicit backward prefetch (parallel/fsdp.py `set_modules_to_backward_prefetch`)
    issued when this block's backward started, and the previous block's reduce-scatter input
    (rs_input), which FSDP2 keeps until the next unit's post-backward
    (`FSDPParamGroup.post_backward` pops `comm_ctx.reduce_scatter_states` before its
    reduce-scatter, torch 2.13 `_fsdp_param_group.py`; at most one kept by default).

    Backward runs the blocks last to first: the first to run has no previous input held, the
    last (block 0) no next block to prefetch. Both at once only in a middle block, so at two
    blocks the larger of the ends (dry-run, phi-3-mini-L2 dp8 z3 bf16: block 0's peak holds
    the root and block 0 gathered, block 1's fp32 input; +6.0% with both copies, -3.2% with
    only the copies fixed and without `zero_moments`' end of block 0's backward). Ignores:
    the reduce-scatter output shard (it becomes the sharded grads)."""
    if layers >= 3:
        return 2.0 * gathered + grads + rs_input
    if layers == 2:
        return gathered + grads + max(gathered, rs_input)
    return gathered + grads


def _zero_forward(
    view: RankView, *, rest: float, accumulated: float, gathered: float
) -> ZeroForward:
    """A block's unshard in forward (ZeRO-3, pp = 1): FSDP2 copies the block's all-gather
    output into its unsharded parameters while the previous all-gather's output is still
    held (it is freed once this copy-out is done), and the root unit stays unsharded from its
    forward on. At the first block the previous output is the root's, at a later block the
    previous block's; the earlier blocks' activations are stored by then, and the gradients
    of earlier micro-batches (m > 1) exist. gathered: one block's unit as gathered. Source:
    the dry-run of llama2-7b-L1 dp8 z3 with LoRA (no gradients, so the backward moments no
    longer dominate): 2.093 GB = sharded states 0.233 + the root unsharded and its all-gather
    output 2 x 0.524 + the block's output and unsharded copy 2 x 0.405 (measured 2.103; the
    timeline's marks before and after the unshard, 1.286 and 1.578 GB, bracket it).
    Or, later, a block's compute: its unsharded copy and its all-gather output (held until
    the next copy-out), the next block's output in flight, the stored activations (this
    block's counted whole) and the temporary alive inside a linear (fp8's quantization, a
    quantized LoRA base's dequantization: dry-run, llama2-7b-L1 dp8 z3 QLoRA nf4, 1.869 GB =
    states 0.145 + root 0.524 + 2 x 0.104 + w1's dequantization 0.902 + activations; -5.2%
    with only the copy-out).
    Ignores: a block's other transient activations (its matmul outputs before they are
    saved), below the linears' temporaries."""
    plan, layers = view.plan, view.layers
    root = view.rank_states.backward.root_unit
    per_layer = view.acts.per_layer
    # buffers but FSDP's (the backward's reduce-scatter; the all-gather's input shard is
    # freed once gathered) and the temporaries alive inside a linear
    buffers = view.buffers - view.fsdp - view.fp8_quantize
    more = 1.0 if layers > 1 else 0.0
    first = 2.0 * root + 2.0 * gathered
    later = root + 3.0 * gathered if layers > 1 else 0.0
    stored = (layers - 1) * per_layer * (1.0 if plan.layout.pp == 1 else 0.0)
    # inside a linear: fp8's cast, or the end of the MLP's forward (`block_ends.
    # mlp_forward_end_bytes`, whose x is SP's gathered buffer, already in `buffers`)
    inside = max(
        view.fp8_quantize,
        view.acts.mlp_forward_end - view.buffer_terms.get("tp_all_gather", 0.0),
    )
    compute = root + (2.0 + more) * gathered + layers * per_layer + inside
    if compute > max(first, later + stored):
        return ZeroForward(
            states=rest,
            buffers=buffers + inside,
            root_unit=root,
            unit_copies=(2.0 + more) * gathered,
            acts_and_grads=layers * per_layer + accumulated,
        )
    if later + stored > first:
        return ZeroForward(
            states=rest,
            buffers=buffers,
            root_unit=root,
            unit_copies=3.0 * gathered,
            acts_and_grads=stored + accumulated,
        )
    return ZeroForward(
        states=rest,
        buffers=buffers,
        root_unit=2.0 * root,
        unit_copies=2.0 * gathered,
        acts_and_grads=accumulated,
    )


def _early_block_backward(
    view: RankView,
    *,
    stored: float,
    more: float,
    bwd: float,
    copies: float,
    last: float | None = None,
) -> tuple[float, float, float]:
    """(activation side, unit copies, buffers) of a block's backward moment (ZeRO-2/3): the
    start of the last block's backward where it outweighs the copies' moment (bwd, copies).

    Before any of its gradient copies: every block's stored activations (none is freed yet),
    what the recompute re-created (0 without AC), the MLP backward's first gradients, and of
    the unit copies only the gathered parameters (ZeRO-3: this block and the next one,
    prefetched). It wins over the copies' moment when activations outweigh the block's
    parameters. Dry-run: selective, tiny-llama dp4 z2 b2x2 (-1.1%) and llama2-7b-L1 dp4 z3
    tp2+sp (adding the recompute to the copies' moment is 13% over: at 7B widths the block's
    gradient copies are not alive then); ac none, tiny dp2 z3 fp32 b1 s128 (peak inside the
    last block's w2 backward, block 0's all-gather issued: -7.8% while only the later copies'
    moment was modelled). stored: stored + accumulated grads + recompute; more: 1 if there is
    a next block to prefetch.

    last (ZeRO-3, one micro-batch, several blocks): the last block's own stored activations,
    the later blocks' gradients and its recompute. Its backward starts with its own gathered
    copy and the previous block's fp32 reduce-scatter input (FSDP2 frees it when the next
    unit's reduce-scatter is issued) instead of a prefetched next block: counted where larger
    (dry-run, gemma-2-27b-L2 dp8 z3 selective s4096: the block's whole recompute beside both,
    -3.1% with the first block's copies; the 4 x 566M-parameter fp32 input outweighs the first
    block's stored activations and prefetched copy).

    No SP collective is in flight then: the sequence-parallel all-gather's output
    (`tp_all_gather`) is not a separate buffer but the linears' gathered inputs, which are in
    the stored set (ac none) or in what the recompute re-created (the dry-run of tiny-llama dp2
    z3 tp2+sp selective holds exactly two (b, s, h) gathered copies at its peak, both the
    recompute's: +3.05% with the buffer on top).
    """
    plan, bufs, buffers = view.plan, view.buffer_terms, view.buffers
    gathered = view.rank_states.backward.unit_gathered
    L = plan.layout
    work = _block_backward_work(view)
    moved = 0.0  # buffer bytes the early moment counts in its activation side instead
    if plan.precision == "fp8":
        # fp8's temporaries (`buffers.fp8_quantize_bytes`: the recompute's tail, the cast of
        # w2's output gradient) come before the MLP backward's first gradients, next to the
        # block output's gradient and, under SP, its all-gathered copy: the larger of the two,
        # not their sum (dry-run, h 256 f 896 tp4 z3 full AC s1024 b8: +10.3% without SP,
        # +3.0% with, summed; peak at w2's input cast in the recompute, -0.7% / -2.6% now)
        grad_out = plan.compute_bytes * plan.seq_len / L.cp * plan.micro_batch * plan.model.dim
        sp_tp = L.tp if L.sp else 1
        fp8_side = grad_out / sp_tp + (grad_out if sp_tp > 1 else 0.0) + view.fp8_quantize
        work = max(work, fp8_side)
        if plan.ac == "selective" and not plan.model.is_moe:
            work = max(work, _selective_fp8_recompute_side(view, grad_out, sp_tp))
        moved = view.fp8_quantize
    if view.acts.norm_backward > work:
        # a norm's backward (`block_ends.norm_backward_bytes`: the final norm's, or under
        # AC the last block's MLP norm's), outside any linear: no fp8 cast alive then
        work = view.acts.norm_backward
        moved = view.fp8_quantize
    early = stored + work
    early_copies = gathered * (1 + more) if fsdp_reshard_after_forward(L) else 0.0
    if last is not None and fsdp_reshard_after_forward(L):
        # one gathered unit and its fp32 reduce-scatter input (the block's trained parameters)
        last_copies = gathered + 4.0 * view.rank_states.backward.unit_grads
        if last + work + last_copies > early + early_copies:
            early, early_copies = last + work, last_copies
    sp_gather = bufs.get("tp_all_gather", 0.0) + moved
    if early + early_copies - sp_gather > bwd + copies:
        return early, early_copies, buffers - sp_gather
    return bwd, copies, buffers


def _selective_fp8_recompute_side(view: RankView, grad_out: float, sp_tp: int) -> float:
    """Under fp8 with `ac="selective"`, what a block's backward holds beyond the stored set and
    the recompute (`activations.selective_recompute_bytes`) while the recompute casts the
    MLP's input for its last input linear (w3; w1 under GELU), tok = s_l*b:
    the block output's gradient e*tok*h/t and, under SP, its all-gathered copy e*tok*h (w2's
    reduce-scatter ran backward before w2's matmul asked for the recompute); the MLP's 16-bit
    input X, e*tok*h (gathered under SP), alive as the input the linears cast (the fp8 no-AC
    set saves only their 1-byte copies); the cast's fp32 quotient 4*tok*h (its 1-byte result is
    the linear's saved copy, already in the recompute); less w2's 1-byte input tok*f/t, which
    the recompute has not re-created yet.
    Source: dry-run op trace of Llama-3-70B TP8+SP fp8 selective, 2 blocks, dp32 ZeRO-3, 16 x
    8,192 tokens: the peak is w3's input cast in the recompute (+4,295 MB quotient, +1,074 MB
    fp8), the gathered gradient and the gathered MLP input alive, w2's input not yet cast; at
    h = 8,192 against f/t = 3,584 it outweighs w2's gradient cast (`fp8_side`), which the
    planner counted alone (+4.2% with wo's popped output, -3.8% without it).
    Ignores: 537 MB of the recompute the trace holds there and the no-AC set does not
    (2 x e*tok*h/t: each RMSNorm's 16-bit output before the SP all-gather; not traced to its
    holder); MoE blocks (their MLP is the experts' dispatch)."""
    plan = view.plan
    tok = plan.seq_len / plan.layout.cp * plan.micro_batch
    h, f = plan.model.dim, plan.model.ffn_dim
    e = plan.compute_bytes
    gathered_grad = grad_out if sp_tp > 1 else 0.0
    return grad_out / sp_tp + gathered_grad + e * tok * h + 4.0 * tok * h - tok * f / plan.layout.tp


def _end_of_backward(
    view: RankView, *, rest: float, grads_rest: float, held: float
) -> ZeroEndOfBackward:
    """The end of backward, the root unit's post-backward (ZeRO-2/3).

    Its fp32 reduce-scatter input with either every 16-bit unsharded grad of the unit
    (embedding, final norm, head: FSDP2's `foreach_reduce` copies them all into the input
    before it frees them) or the output shard (which becomes its sharded grads: not counted
    twice) and one of those 16-bit grads (embedding or head) not yet freed, whichever is
    larger, and the logits the loop holds; ZeRO-3 has resharded the root's parameters by then
    (ZeRO-2 keeps every unit gathered: counted in `rest`). The root's sharded grads do not
    exist yet: grad bytes per parameter x its parameters / shards
    (`BackwardTerms.root_sharded_grads`; not the rank's average grad bytes per parameter,
    which expert parallelism's unsharded fp32 expert grads inflate).
    Source: the dry-run's peak of llama-1024-L4 dp2 z3 (sharded grads of the blocks only, one
    bf16 root grad beside the output shard, no unsharded params: +18% with the root gathered
    and its shard counted twice) and of qwen3-30b-a3b-L2 dp8 z3 ep8 (both 16-bit 151,936 x 2048
    tables beside the fp32 input, where the output shard is an eighth: -9.0% with one table
    and the inflated sharded grads). rest: the resting states; grads_rest: the gradients but
    those in flight; held: the logits the loop holds.
    """
    plan = view.plan
    bwd = view.rank_states.backward
    root_live, head_held = bwd.root_unit, bwd.head_grad_held  # read only under ZeRO-3
    L = plan.layout
    wc = plan.compute_bytes
    root_grad = end_held = root_grads = 0.0
    if fsdp_reshard_after_forward(L) and root_live:
        root_grads = min(grads_rest, bwd.root_sharded_grads)
        embedding = wc * view.counts.embedding / L.tp if view.rank == 0 else 0.0
        if plan.lora_rank:  # a frozen root (embedding, head): no gradients, no reduce-scatter
            root_grad, end_held = head_held, held
            root_grads = 0.0
        else:
            # the buffer term is the input and the output shard (output = input / shards): at
            # the copy-in every 16-bit grad stands where the output and one grad stand later
            rs = view.buffer_terms.get("fsdp_reduce_scatter", 0.0)
            rs_out = rs / (1 + max(1, L.zero_shards))
            root_grad, end_held = max(max(embedding, head_held), root_live - rs_out), held
    return ZeroEndOfBackward(
        states=rest,
        buffers=view.buffers,
        fsdp=view.fsdp,
        reduce_scatter=view.buffer_terms.get("fsdp_reduce_scatter", 0.0),
        grads=grads_rest,
        root_grad=root_grad,
        held_logits=end_held,
        root_sharded_grads=root_grads,
    )


def loss_moment(view: RankView, stored: float) -> LossBackward:
    """The last stage's loss backward: every activation still stored plus the cross-entropy
    backward temporaries (`loss_backward_bytes`) and the head weight's gradient the fused loss
    returns (`head_grad_bytes`). FSDP2 has resharded every block (ZeRO-3), so in-flight
    ZeRO-3 copies and FSDP buffers are left out, except the last block's all-gather that the
    root's pre-backward prefetches (ZeRO-3, pp = 1); accumulated grads (m > 1) are held.
    Pipelines: each loss backward of the schedule, with what is stored then and the gradients
    if they exist.

    Not counted, because not held: logits (the last stage runs the fused loss, pipelined or
    not, `config.fused_head_loss`; zero-bubble's logits of earlier micro-batches are not kept
    either: the trainer runs the schedule with return_outputs=False). stored: the stored
    activations (pp = 1)."""
    plan, buffers, fsdp, quant = view.plan, view.buffers, view.fsdp, view.fp8_quantize
    L = plan.layout
    # the head weight the fused loss reads: FSDP2's 16-bit unsharded copy under ZeRO-2/3
    # with 16-bit compute, else the fp32 parameter
    weight_bytes = plan.compute_bytes if L.zero >= 2 else 4
    fused = fused_head_loss(L)
    key = (
        plan.seq_len,
        plan.micro_batch,
        L.tp,
        L.sp,
        L.cp,
        plan.precision,
        fused,
        weight_bytes,
        plan.loss_chunk_tokens,
    )
    cached = view.terms.loss.get(key)
    if cached is None:
        shape = MicroBatchShape.of(plan)
        cached = view.terms.loss[key] = (
            loss_backward_bytes(
                plan.model,
                shape,
                fused=fused,
                weight_bytes=weight_bytes,
                chunk_tokens=plan.loss_chunk_tokens,
            ),
            head_grad_bytes(plan.model, tp=L.tp, fused=fused, weight_bytes=weight_bytes),
        )
    loss_tmp, head = cached
    if plan.lora_rank:
        head = 0.0  # a frozen head: the fused loss computes no weight gradient
    resting, held = _loss_resting(view)
    if L.pp == 1:
        return LossBackward(
            states=resting + _loss_forward_extra(view, head),
            buffers=buffers,
            fsdp=fsdp,
            fp8_quantize=quant,
            stored_acts=stored,
            head_acts=0.0,
            grads=held,
            loss_temp=loss_tmp,
            head_grad=head,
        )
    # each loss backward of the schedule differs only in what is stored and whether grads
    # exist: its total is summed in `LossBackward.total`'s order without building the record,
    # and the first largest is built (what max() over the records returns)
    best, best_total = None, -math.inf
    fr = view.fsdp_units
    # FSDP2's units and unsharded gradients as the schedule left them (`FsdpWalk`: its
    # `gathered` at a loss backward is `pipeline_fsdp.loss_gathered_bytes`)
    walk = None
    if fr is not None:
        walk = view.fsdp_walk or pipeline_fsdp.fsdp_walk(view, fr)
    states = resting
    for i, (sm, (stored_acts, head_stored)) in enumerate(
        zip(view.schedule, view.stored, strict=True)
    ):
        if not sm.is_loss:
            continue
        if walk is not None:
            grads = walk.grads[i]
            states = resting + walk.gathered[i]
        else:
            grads = held if sm.grads_exist else 0.0
        # split backward: past their I, blocks hold what I recorded too, heads what W reads
        t = states + buffers - fsdp - quant + stored_acts + head_stored + grads + loss_tmp + head
        if t > best_total:
            best, best_total = (stored_acts, head_stored, grads, states), t
    if best is None:
        raise ValueError("a pipeline schedule without a loss backward on its last stage")
    return LossBackward(
        states=best[3],
        buffers=buffers,
        fsdp=fsdp,
        fp8_quantize=quant,
        stored_acts=best[0],
        head_acts=best[1],
        grads=best[2],
        loss_temp=loss_tmp,
        head_grad=head,
    )


def head_weight_moment(view: RankView) -> HeadWeightPass | None:
    """The last stage's weight pass (W) of a split backward (zero-bubble, DualPipeV), before it
    frees its micro-batch: every activation still stored (the heads past their I as
    `split_backward.head_after_input_bytes`, this micro-batch's among them; the blocks past
    their I with what they recorded), the gradients if they exist, and the head weight's
    gradient being made (`split_backward.head_weight_pass_bytes`: 16-bit
    and fp32 at once under autocast). States as in the loss backward (`_loss_resting`: FSDP2
    keeps a pipeline stage's units gathered); FSDP and fp8 buffers left out, as there.
    Each W of the schedule (`pipeline_ranks.schedule_moments`' head_weight moments); None
    without one (no split backward, pp = 1). Ignores: the blocks' weight gradients made in the
    same pass, one weight at a time (below the head's). Source: the dry-run, llama-1024 with a
    128,000-row head, pp4 zero-bubble ZeRO-0 bf16: the last rank's W peaks at 3706.9 MB, its
    loss backward at 3705.8 MB (the W's 16-bit and fp32 V x h gradients, 786 MB, against the
    loss backward's two fp32 (tokens, V) buffers)."""
    plan, buffers, fsdp, quant = view.plan, view.buffers, view.fsdp, view.fp8_quantize
    L = plan.layout
    if fused_head_loss(L):  # no split backward (pp = 1 included): no W
        return None
    temp = 0.0
    if not plan.lora_rank:  # a frozen head has no weight gradient
        # the head weight as the matmul reads it: FSDP2's 16-bit unsharded copy under
        # ZeRO-2/3, else the fp32 parameter (through autocast's cast under 16-bit compute)
        weight_bytes = plan.compute_bytes if L.zero >= 2 else 4
        temp = head_weight_pass_bytes(
            plan.model, tp=L.tp, precision=plan.precision, weight_bytes=weight_bytes
        )
    best, best_total = None, -math.inf
    resting, held = _loss_resting(view)
    fr = view.fsdp_units
    for sm, (stored_acts, head_stored) in zip(view.schedule, view.stored, strict=True):
        if not sm.head_weight:
            continue
        extra, states = temp, resting
        if fr is not None:  # W's gradients join the held ones (`weight_pass_grads`)
            grads, on_top = pipeline_fsdp.weight_pass_grads(fr, sm)
            extra = temp if on_top else 0.0
            states = resting + fr.gathered_bytes(sm)
        else:
            grads = held if sm.grads_exist else 0.0
        t = states + stored_acts + head_stored + grads + extra
        if t > best_total:
            best, best_total = (stored_acts, head_stored, grads, extra, states), t
    if best is None:
        return None
    return HeadWeightPass(
        states=best[4],
        buffers=buffers,
        fsdp=fsdp,
        fp8_quantize=quant,
        stored_acts=best[0],
        head_acts=best[1],
        grads=best[2],
        weight_grad_temp=best[3],
    )


def _loss_forward_extra(view: RankView, head_grad: float) -> float:
    """What the fused loss's *forward* holds beyond its backward (`loss_moment`, pp = 1), where
    that is more: ZeRO-2 keeps the last block's all-gather output alive through the loss
    forward. FSDP2 defers freeing a forward all-gather's result to the next all-gather
    (`FSDPParamGroup.wait_for_unshard` saves it in `comm_ctx.all_gather_state`), and the root's
    post-forward frees the last one (`FSDPState._post_forward`); the fused head + loss runs
    inside the root's forward, so one block's gathered unit (compute dtype) is alive while its
    logits are formed. ZeRO-3 holds the same bytes in its loss backward (the prefetched last
    block, `_loss_resting`), ZeRO-2 none there. The loss's temporaries are taken as the
    backward's (the same logits chunk in both passes); the head weight's gradient is not made
    yet. Counts: the gathered unit less that gradient. Ignores: the last norm's output, alive
    as the head's input in both passes. Source: dry-run op trace, tiny-llama dp4 z2 b2x2 s128
    selective: peak at the last micro-batch's head matmul and fp32 cast with a 92,416 B block
    all-gather output alive (-3.4% against the loss backward once the block backward stopped
    counting wo's popped output)."""
    L = view.plan.layout
    if L.zero < 2 or fsdp_reshard_after_forward(L) or not view.layers:
        return 0.0
    return max(0.0, view.rank_states.backward.unit_gathered - head_grad)


def _loss_resting(view: RankView) -> tuple[float, float]:
    """(resting states, held grads) during the loss backward (`loss_moment`)."""
    plan, layers, m = view.plan, view.layers, view.microbatches
    st, count, fixed = view.rank_states.states, view.rank_states.params, view.rank_states.fixed
    root_live = view.rank_states.backward.root_unit
    gathered = view.rank_states.backward.unit_gathered  # the last block's all-gather output
    L = plan.layout
    resting = fixed - (st["params.in_flight"] if fsdp_reshard_after_forward(L) else 0.0)
    held = st["grads"] - st["grads.in_flight"] if (m > 1 or L.pp > 1) else 0.0
    if L.pp > 1 and L.zero >= 2:
        # the units gathered and the unsharded gradients are each moment's
        # (`pipeline_fsdp.loss_gathered_bytes`, `FsdpRank.grad_bytes`): the sharded states here
        resting = fixed - st["params.in_flight"]
        held = 4.0 * count
    if fsdp_reshard_after_forward(L) and L.pp == 1:
        # the fused loss reads the head inside the root unit's forward: FSDP2 does not
        # reshard the root after forward, so its unsharded copy is alive (dry-run,
        # gpt2-124m-L2 dp8 z3: -15% without it)
        resting += root_live
        if layers:
            # the root's pre-backward hook (on the loss) prefetches the last block before
            # the loss backward runs (FSDP2's default backward prefetch, the reverse
            # post-forward order): its all-gather output, one block in the compute dtype,
            # is alive until that block's backward copies it out (dry-run, tiny dp2 z3:
            # 99,968 B = 2 x 49,984 block parameters, -4.2% total without it)
            resting += gathered
    return resting, held


moment_total: Callable[[Moment], float] = attrgetter("total")
"""A moment's total bytes: the key `max` ranks moments by (attrgetter: no Python frame per call,
it runs for every moment of every rank the search evaluates)."""
