"""Memory of the worst pipeline rank of a plan: `estimate_memory(plan) -> MemoryBreakdown`.

The search's hot path (`worst_rank`) returns plain numbers; the breakdown dataclass is built
only for the layouts the planner reports. Both go through `rank_memory`, so they agree: a
rank's peak is the largest of its named moments (`ForwardBackward`, `OptimizerStep`, the
ZeRO-2/3 moments, `LossBackward`, `EmbeddingBackward`), each a slotted dataclass of its byte
terms built by keyword, and `RankMemory.moment` names the one that won. The moments are built in
`rank_moments.py`; the pipeline-schedule geometry below is `pipeline_ranks.py`.

Which ranks are evaluated: rank 0 (embedding), rank pp-1 (head), and the middle ranks no other
middle rank dominates: middle ranks hold the same per-block states, buffers and per-block
activations, so their memory grows with the layer count and with layers x in-flight
micro-batches; one with no more layers and no more in flight than another can never be the
worst. The set is exact, not sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from scaletrain.config import offload_states, offloads_activations

from ..time.pipeline import inflight_per_rank, last_stage_rank
from ..types import MemoryBreakdown, PlanInput
from .buffers import FRAGMENTATION
from .moments import (
    ForwardBackward,
    MlpForwardEnd,
    Moment,
    NormBackward,
    OptimizerStep,
    RankMemory,
)
from .pipeline_fsdp import BlockWork, FsdpRank, fsdp_walk
from .pipeline_ranks import (
    FsdpState,
    fsdp_state,
    pipeline_buffers,
    rank_candidates,
    walked_schedule,
)
from .rank_moments import (
    RankView,
    embedding_moment,
    head_weight_moment,
    loss_moment,
    moment_total,
    pipeline_block_work,
    pipeline_stage_moment,
    stored_activations,
    zero_moments,
)
from .rank_terms import (
    ActivationTerms,
    ModelTerms,
    RankBuffers,
    RankStates,
    activation_terms,
    fsdp_units,
    model_terms,
    rank_buffers,
    rank_states,
)
from .states import dense_layers_on_rank, eager_step_bytes, stage_layer_counts

__all__ = [
    "host_fits",
    "host_per_node",
    "estimate_memory",
    "pipeline_rank_memory",
    "worst_rank",
    "PlanFacts",
    "plan_facts",
    "plan_activations",
    "rank_memory",
    "reserved_bytes",
]


def _late_grads(plan: PlanInput, terms: ModelTerms, st: dict[str, float], count: float) -> float:
    """Rank 0's gradients that come after every block's backward (ZeRO-0/1 only).

    The token embedding's gradient and the position table's come after every block's (dry-run,
    llama3-8b-L1 tp8+sp z0 b1: the V/tp x h gradient counted at the block's backward put the
    planner 10% over); a tied table's is stood in for by the head's contribution, which autograd
    holds from the loss backward on.
    """
    L = plan.layout
    if L.zero >= 2 or not count or plan.lora_rank:  # (LoRA: a frozen embedding)
        return 0.0
    pc = terms.counts
    tied = plan.model.tie_embeddings and L.pp == 1
    return st["grads"] * (pc.position + (0.0 if tied else pc.embedding / L.tp)) / count


@dataclass(slots=True, kw_only=True)
class RankShare:
    """What one pipeline rank (by rank and blocks) of a layout holds whatever the plan's
    micro-batch and AC (`LayoutFacts.ranks`): read by `rank_memory` for each of the layout's
    plans, each found once per search."""

    dense: int
    """An MoE model's dense first blocks on the rank (`states.dense_layers_on_rank`)."""
    states: RankStates
    """`rank_terms.rank_states` of the rank."""
    fsdp_units: FsdpRank | None
    """`rank_terms.fsdp_units` of the rank (None but on a ZeRO-2/3 pipeline)."""
    buffers: dict[float, RankBuffers]
    """`rank_terms.rank_buffers` of the rank by tokens per micro-batch (of one cp rank)."""


@dataclass(slots=True, kw_only=True)
class LayoutFacts:
    """What every plan of one layout shares whatever its micro-batch and AC
    (`layout_facts`): the search evaluates about four plans of each layout it reaches (the
    405B search: 30,089 plans of 7,780 layouts), each reading these per rank; built once per
    search and kept in `ModelTerms.layouts`. Found per plan before, with the rank states'
    and buffers' 17- and 13-field cache keys built per rank; now the 405B warm search builds
    the first for 25,532 of its 55,671 ranks, the second for 49,982 (cProfile call counts)."""

    zero_shards: int
    device: str
    """'cpu' or 'gpu' (the runtime context and the optimizer's temporaries differ)."""
    last_rank: int
    """The pipeline rank holding the last stage (`time.pipeline.last_stage_rank`)."""
    states_offload: str
    """`config.offload_states` of the plan's offload."""
    offloads_activations: bool
    """`config.offloads_activations` of the plan's offload."""
    dense_layers: int
    """An MoE model's dense first blocks (0 without)."""
    fsdp: FsdpState
    """The FSDP2 state the plan's schedule moments carry (`pipeline_ranks.fsdp_state`)."""
    ranks: dict[tuple[int, int], RankShare]
    """Each rank's `RankShare` by (rank, blocks held), found when a plan first reads it."""


def layout_facts(plan: PlanInput, terms: ModelTerms, convention: str) -> LayoutFacts:
    """The `LayoutFacts` of `plan`'s layout, kept in `terms` by the layout and every plan
    field its ranks' states and buffers read (their caches' keys, `rank_states` and
    `rank_buffers`, less the micro-batch's tokens, which `RankShare.buffers` is keyed by)."""
    L, model = plan.layout, plan.model
    device = "cpu" if plan.hardware.is_cpu else "gpu"
    key = (
        L,
        plan.offload,
        convention,
        plan.precision,
        plan.optimizer,
        plan.beta1,
        plan.lora,
        plan.gathers_fp8,
        device,
    )
    hit = terms.layouts.get(key)
    if hit is None:
        hit = terms.layouts[key] = LayoutFacts(
            zero_shards=L.zero_shards,
            device=device,
            last_rank=last_stage_rank(L),
            states_offload=offload_states(plan.offload),
            offloads_activations=offloads_activations(plan.offload),
            dense_layers=model.num_dense_layers if model.is_moe else 0,
            fsdp=fsdp_state(L),
            ranks={},
        )
    return hit


@dataclass(slots=True, kw_only=True)
class PlanFacts:
    """What every pipeline rank of one plan shares (`rank_memory` reads it), found once per
    plan: the search evaluates two to three ranks of each of its ~30,000 plans. Not frozen,
    as the moments (`moments.py`): built for every plan the search evaluates."""

    plan: PlanInput
    terms: ModelTerms
    acts: ActivationTerms | None
    """The plan's activation terms (`rank_terms.activation_terms`); None until a rank needs
    them (`plan_activations`: a miss settled at its optimizer step never does)."""
    modern: bool = True
    """The activation model `plan_activations` builds them with (`activation_terms`)."""
    convention: str
    """The model-state byte convention (`states.CONVENTIONS`)."""
    shared: LayoutFacts
    """What the plan shares with the other plans of its layout (`layout_facts`)."""
    microbatches: int
    """Micro-batches per step (at least 1)."""
    block_work: BlockWork | None = None
    """What a block's backward holds first on a ZeRO-2/3 pipeline rank with blocks
    (`rank_moments.pipeline_block_work`: the plan's, whichever rank), found by the first."""


def plan_facts(
    plan: PlanInput,
    terms: ModelTerms,
    acts: ActivationTerms | None,
    convention: str = "scaletrain",
    modern: bool = True,
) -> PlanFacts:
    """The `PlanFacts` of `plan` (terms: its model's `ModelTerms`; acts: its activation
    terms, or None to build them when a rank first needs them, with `modern`)."""
    return PlanFacts(
        plan=plan,
        terms=terms,
        acts=acts,
        modern=modern,
        convention=convention,
        shared=layout_facts(plan, terms, convention),
        microbatches=max(1, plan.grad_accum),
    )


def plan_activations(facts: PlanFacts) -> ActivationTerms:
    """The plan's activation terms (`rank_terms.activation_terms`), built on first use and
    kept in `facts`."""
    if facts.acts is None:
        facts.acts = activation_terms(facts.plan, facts.terms, facts.modern)
    return facts.acts


def rank_memory(
    facts: PlanFacts,
    *,
    rank: int,
    layers: int,
    in_flight: float,
    settle_at: float | None = None,
) -> RankMemory:
    """Memory of pipeline rank `rank` holding `layers` blocks with `in_flight` micro-batches:
    the largest of its moments (calibrated against the dry-run, see
    benchmarks/results/planner_accuracy.md).

    settle_at: the search's miss shortcut (`worst_rank`). Two moments are tested against it
    first, as soon as they are built: the optimizer step's (model states and buffers: misses
    where the states alone overflow the GPU) and, once the activations are known, the
    forward/backward's (ZeRO-0/1) or a pipeline stage's backward (ZeRO-2/3:
    `stage_backward_moment`); if one's reserved bytes reach `settle_at` the rank is returned
    `settled` at it (`_settled_rank`), the others not built. Exact for the search's decision:
    the peak is the largest moment, so the rank's reserved bytes are at least that moment's
    (the same float, through the same increasing `reserved_bytes`), and reach `settle_at`
    too. The 405B search settles about 16,500 of its 60,000 ranks so."""
    plan, terms, m = facts.plan, facts.terms, facts.microbatches
    L, shared = plan.layout, facts.shared
    last = rank == shared.last_rank
    zs, device = shared.zero_shards, shared.device
    part = shared.ranks.get((rank, layers))
    if part is None:
        # an MoE model's dense first blocks on this rank (DeepSeek): their parameters, and
        # activations in the per-block mean of this rank's blocks
        dense = 0
        if shared.dense_layers:
            dense = dense_layers_on_rank(
                plan.model.num_layers, shared.dense_layers, L.pp, L.pp_virtual, rank, L.pp_schedule
            )
            dense = min(dense, layers)
        rs = rank_states(plan, terms, zs, rank == 0, last, layers, facts.convention, dense)
        part = shared.ranks[(rank, layers)] = RankShare(
            dense=dense,
            states=rs,
            fsdp_units=(
                fsdp_units(plan, terms, rank=rank, layers=layers, states=rs)
                if shared.fsdp != "off"  # (ZeRO-2/3 on a pipeline: `fsdp_units`' own test)
                else None
            ),
            buffers={},
        )
    dense, rs = part.dense, part.states
    st, fixed = rs.states, rs.fixed
    # fsdp: the FSDP collectives' buffers; quant: fp8's quantization temporary, which exists
    # only inside a converted linear's forward/backward: not during the optimizer step, nor
    # the (16-bit) head's loss backward
    tokens = plan.seq_len / L.cp * plan.micro_batch
    rb = part.buffers.get(tokens)
    if rb is None:
        rb = part.buffers[tokens] = rank_buffers(
            plan, terms, zs, rs.unit, device, rs.trainable, rs.backward
        )
    bufs, buffers = rb.terms, rb.total
    ctx, fsdp, quant = rb.runtime_context, rb.fsdp, rb.fp8_quantize
    if L.pp > 1:
        key = (L.pp_schedule, L.pp_virtual, m, rank)
        piped = rb.pipeline.get(key)
        if piped is None:
            piped = rb.pipeline[key] = pipeline_buffers(plan, bufs, buffers, rank, m)
        bufs, buffers = piped
    states_offload = shared.states_offload
    # torch's foreach AdamW/SGD allocate an fp32 intermediate per parameter during step(); on
    # a GPU the trainer runs fused AdamW, which allocates none (the dry-run measures none)
    step_tmp = 0.0 if states_offload != "none" or device != "cpu" else 4.0 * rs.sharded
    if plan.optimizer == "adamw8bit" and not plan.lora_rank:
        # torchao's per-parameter step: compiled on a GPU (no fp32 temporaries counted: not
        # measured), eager on a CPU and in the dry-run (`eager_step_bytes`)
        eager = plan.eager_optimizer_step
        if eager is None:
            eager = device == "cpu"
        step_tmp = 0.0
        if eager:
            step_tmp = eager_step_bytes(
                plan.model,
                terms.counts,
                L,
                first=rank == 0,
                last=last,
                layers=layers,
                zero_shards=zs,
            )
    step = OptimizerStep(
        states=fixed,
        params_in_flight=st["params.in_flight"],
        buffers=buffers,
        fsdp=fsdp,
        fp8_quantize=quant,
        grads=st["grads"],
        grads_in_flight=st["grads.in_flight"],
        step_temp=step_tmp,
    )
    if settle_at is not None and reserved_bytes(step.total, ctx) >= settle_at:
        return _settled_rank(step, rs, ctx=ctx, rank=rank, in_flight=in_flight)
    acts_terms = facts.acts or plan_activations(facts)
    if dense:
        mean = ((layers - dense) * acts_terms.per_layer + dense * acts_terms.dense_per_layer) / (
            layers
        )
        # split backward: what their input-gradient pass records, likewise
        a = acts_terms
        recorded = (layers - dense) * a.recorded_per_layer + dense * a.dense_recorded_per_layer
        acts_terms = replace(acts_terms, per_layer=mean, recorded_per_layer=recorded / layers)
    moments: tuple = ()
    stored: Sequence[tuple[float, float]] = ()
    if L.pp > 1:
        moments, stored = walked_schedule(
            L.pp_schedule,
            L.pp,
            m,
            L.pp_virtual,
            rank,
            plan.model.num_layers,
            shared.fsdp,
            (
                acts_terms.per_layer,
                acts_terms.recorded_per_layer,
                acts_terms.head,
                acts_terms.head_after_input,
            ),
        )
    view = RankView(
        plan=plan,
        terms=terms,
        counts=terms.counts,
        rank=rank,
        layers=layers,
        microbatches=m,
        rank_states=rs,
        buffer_terms=bufs,
        buffers=buffers,
        fsdp=fsdp,
        fp8_quantize=quant,
        runtime_context=ctx,
        acts=acts_terms,
        schedule=moments,
        last=last,
        stored=stored,
        fsdp_units=part.fsdp_units,
    )
    if view.fsdp_units is not None:  # (found once per rank, read by each of its moments)
        view.fsdp_walk = fsdp_walk(view, view.fsdp_units)
    # (a pipeline rank of ends only, the embedding and / or the head, has the pipeline's ZeRO
    # moments too: `rank_moments._pipeline_zero_moments`)
    zero = L.zero >= 2 and rs.unit > 0 and (layers != 0 or view.fsdp_units is not None)
    late = _late_grads(plan, terms, st, rs.params) if rank == 0 else 0.0
    acts, block_stored, fwdbwd = stored_activations(
        view, in_flight=in_flight, late_grads=late, acts_only=zero and L.pp > 1
    )
    # the moment tested against `settle_at` before the others are built: ZeRO-2/3's
    # pipeline stage backward (`pipeline_stage_moment`; none when pp = 1), else the
    # forward/backward
    cands: list[Moment]
    stage = None
    if zero and L.pp > 1:
        work = facts.block_work
        if work is None or not layers:
            work = pipeline_block_work(view)
            if layers:
                facts.block_work = work
        stage = pipeline_stage_moment(view, work)
    first: Moment | None = stage
    if not zero:  # states with the FSDP units in flight, every buffer, activations/grads
        first = ForwardBackward(states=fixed, buffers=buffers, acts_and_grads=fwdbwd)
    if (
        first is not None
        and settle_at is not None
        and reserved_bytes(first.total, ctx) >= settle_at
    ):
        return _settled_rank(first, rs, ctx=ctx, rank=rank, in_flight=in_flight)
    if zero:
        cands = [*zero_moments(view, block_stored, stage), step]
    else:
        assert first is not None
        cands = [first, step]
        if acts_terms.norm_backward and L.pp == 1 and layers:
            # the final norm's (or, under AC, the last block's MLP norm's) backward: the
            # blocks' stored set and the recompute, the norm's temporaries and gradients
            # (`block_ends.norm_backward_bytes`), no linear's fp8 cast or SP gather alive
            held = st["grads"] if m > 1 else st["grads.in_flight"]
            norm_acts = acts - (acts_terms.head if last else 0.0) + acts_terms.norm_backward
            cands.append(
                NormBackward(
                    states=fixed,
                    buffers=buffers - quant - bufs.get("tp_all_gather", 0.0),
                    acts_and_grads=norm_acts + held,
                )
            )
        if acts_terms.mlp_forward_end and L.pp == 1 and layers:
            # the last block's MLP forward at its end (fp8: `block_ends.mlp_forward_end_bytes`,
            # x in it, which is SP's gathered buffer), the earlier micro-batches' gradients
            sp_gather = bufs.get("tp_all_gather", 0.0)
            end = max(quant, acts_terms.mlp_forward_end - sp_gather)
            cands.append(
                MlpForwardEnd(
                    states=fixed,
                    buffers=buffers - quant + end,
                    acts_and_grads=block_stored + (st["grads"] if m > 1 else 0.0),
                )
            )
    loss_terms = emb_tmp = 0.0
    if last:
        extra = acts_terms.recompute if layers else 0.0
        loss = loss_moment(view, acts - extra)
        loss_terms = loss.loss_temp + loss.head_grad
        bufs = dict(bufs, loss_backward_temp=loss.loss_temp, head_grad=loss.head_grad)
        cands.append(loss)
        weight_pass = head_weight_moment(view)
        if weight_pass is not None:  # a split backward's W on the last stage
            bufs = dict(bufs, head_weight_pass_temp=weight_pass.weight_grad_temp)
            cands.append(weight_pass)
    if rank == 0 and layers and states_offload == "none" and not plan.lora_rank:
        emb_tmp = rs.backward.embedding_temp
        cands.append(embedding_moment(view))
        bufs = dict(bufs, embedding_backward_temp=emb_tmp)
    peak = max(cands, key=moment_total)
    total = peak.total
    reserved = reserved_bytes(total, ctx)
    host_terms: tuple[tuple[str, float], ...] = ()
    host: float = 0  # (int 0, what the sum of no terms is: reports print it as before)
    if states_offload != "none" or shared.offloads_activations:  # (else none: `_host_bytes`)
        host_terms = _host_bytes(
            facts, rs, acts_terms, layers=layers, in_flight=in_flight, last=last
        )
        host = sum(v for _, v in host_terms)
    return RankMemory(
        host=host,
        host_terms=host_terms,
        reserved=reserved,
        total=total,
        states=st,
        buffer_terms=bufs,
        buffers=buffers + loss_terms + emb_tmp,
        activations=acts,
        per_layer=acts_terms.per_layer,
        step_temp=step_tmp,
        params=rs.params,
        rank=rank,
        in_flight=in_flight,
        moment=peak.name,
    )


def reserved_bytes(total: float, runtime_context: float) -> float:
    """What the caching allocator is predicted to reserve for `total` allocated bytes:
    total + FRAGMENTATION x (total - runtime context), the context being outside the
    allocator (`buffers.FRAGMENTATION`). Increasing in `total`."""
    return total + FRAGMENTATION * (total - runtime_context)


def _settled_rank(
    moment: Moment, rs: RankStates, *, ctx: float, rank: int, in_flight: float
) -> RankMemory:
    """A rank the search's miss shortcut settled at `moment` (`rank_memory`'s `settle_at`): its
    total and reserved bytes are that moment's, a lower bound of the rank's peak; its states
    and parameters the rank's; the other terms were not computed (0, empty)."""
    total = moment.total
    return RankMemory(
        reserved=reserved_bytes(total, ctx),
        total=total,
        states=rs.states,
        buffer_terms={},
        buffers=0.0,
        activations=0.0,
        per_layer=0.0,
        step_temp=0.0,
        params=rs.params,
        rank=rank,
        in_flight=in_flight,
        moment=moment.name,
        settled=True,
    )


def host_per_node(plan: PlanInput, host_rank: float) -> float:
    """Host bytes per node: the worst rank's times the ranks a node holds, min(GPUs, GPUs per
    node). An upper bound where ranks differ (pipeline stages, the first and last)."""
    return host_rank * max(1, min(plan.num_gpus, plan.hardware.gpus_per_node))


def host_fits(plan: PlanInput, host_rank: float) -> bool:
    """Whether the host memory per node fits `hardware.host_memory_bytes` (unknown: yes)."""
    cap = plan.hardware.host_memory_bytes
    return cap <= 0 or host_per_node(plan, host_rank) <= cap


def _host_bytes(
    facts: PlanFacts,
    rs: RankStates,
    acts: ActivationTerms,
    *,
    layers: int,
    in_flight: float,
    last: bool,
) -> tuple[tuple[str, float], ...]:
    """What one rank puts in host memory at its peak, by kind (`memory.offload`):
    - 'optimizer' (trainer.optim.CPUOffloadAdamW, ZeRO-Offload's split): the fp32 moments, and
      during its step the host copies of every parameter and gradient it updates (4 + 4 B);
    - 'params' (FSDP2's CPUOffloadPolicy): the sharded parameters, gradients and optimizer
      states (`states.model_state_bytes`'s 'offloaded');
    - '+activations' (trainer.activation_offload): every saved tensor of the micro-batches in
      flight (the blocks', the head's, and under autocast the weight casts the matmuls save).
    Ignores: the pinned caching host allocator's rounding of each block up to a power of two
    (up to 2x per tensor on CUDA), the processes' own host memory (CUDA context, libraries,
    data loader), the page cache."""
    out: list[tuple[str, float]] = []
    states = facts.shared.states_offload
    offloaded = rs.states["offloaded"]
    if states == "optimizer":
        out += [("optimizer states", offloaded), ("optimizer step copies", 8.0 * rs.sharded)]
    elif states == "params":
        out.append(("parameters, gradients, optimizer states", offloaded))
    if facts.shared.offloads_activations:
        saved = in_flight * (layers * acts.host_per_layer + rs.host_casts)
        out.append(("activations", saved + (acts.host_head if last else 0.0)))
    return tuple(out)


def worst_rank(
    plan: PlanInput,
    *,
    convention: str = "scaletrain",
    modern: bool = True,
    terms: ModelTerms | None = None,
    settle_at: float | None = None,
) -> tuple[RankMemory, float]:
    """The worst rank's numbers (by reserved bytes) and the largest parameter count of any
    rank (what paces gradient synchronisation).

    settle_at: the search's shortcut for a plan that cannot matter once it misses by so much
    (reserved bytes over the GPU's memory): the ranks are walked until one's reserved bytes
    reach it, and that rank is returned (its reserved bytes a lower bound of the worst's, and
    of its own where a moment settled it, `rank_memory`; the parameter count, of the ranks
    walked). The search passes it only where a miss that large changes nothing
    (`search.layouts._Tally.record`, `miss_threshold`)."""
    L = plan.layout
    terms = model_terms(plan, terms)
    facts = plan_facts(plan, terms, None, convention, modern)
    worst = None
    max_params = 0.0
    for rank, layers, in_flight in rank_candidates(
        plan.model.num_layers,
        L.pp,
        L.pp_virtual,
        L.pp_schedule,
        facts.microbatches,
        facts.shared.dense_layers,
    ):
        nums = rank_memory(
            facts, rank=rank, layers=layers, in_flight=in_flight, settle_at=settle_at
        )
        if worst is None or nums.reserved > worst.reserved:
            worst = nums
        if nums.params > max_params:
            max_params = nums.params
        if settle_at is not None and nums.reserved >= settle_at:
            break
    assert worst is not None
    return worst, max_params


def breakdown(plan: PlanInput, nums: RankMemory) -> MemoryBreakdown:
    """The public MemoryBreakdown of a `RankMemory`."""
    L, st = plan.layout, nums.states
    cap = plan.hardware.memory_bytes
    host, host_cap = host_per_node(plan, nums.host), plan.hardware.host_memory_bytes
    return MemoryBreakdown(
        host=host,
        host_capacity=host_cap,
        params=st["params"],
        grads=st["grads"],
        optimizer=st["optimizer"],
        activations=nums.activations,
        buffers=nums.buffers,
        total=nums.total,
        reserved=nums.reserved,
        capacity=cap,
        fits=nums.reserved <= cap and (host_cap <= 0 or host <= host_cap),
        rank=nums.rank * L.tp * L.cp * L.dp,
        buffer_terms=dict(nums.buffer_terms),
        detail={
            "params.in_flight": st["params.in_flight"],
            "grads.in_flight": st["grads.in_flight"],
            "offloaded.cpu": st["offloaded"],
            "activations.per_layer": nums.per_layer,
            "activations.in_flight": nums.in_flight,
            "optimizer_step.temp": nums.step_temp,
            "allocator_reserve": nums.reserved - nums.total,
            "params.count": nums.params,
            "pipeline_rank": nums.rank,
            **{f"host.{k}": v for k, v in nums.host_terms},
        },
        moment=nums.moment,
    )


def pipeline_rank_memory(
    plan: PlanInput, pp_rank: int, *, convention: str = "scaletrain", modern: bool = True
) -> MemoryBreakdown:
    """Memory of pipeline rank `pp_rank` (not necessarily the worst): what a real rank of the
    run should compare itself with (the trainer's ledger, `verify` of a live run)."""
    L = plan.layout
    if not 0 <= pp_rank < L.pp:
        raise ValueError(f"pp_rank={pp_rank}: the layout has pp={L.pp} pipeline ranks")
    m = max(1, plan.grad_accum)
    layers = stage_layer_counts(plan.model.num_layers, L.pp, L.pp_virtual, L.pp_schedule)[pp_rank]
    in_flight = (
        1.0 if L.pp == 1 else inflight_per_rank(L.pp_schedule, L.pp, m, L.pp_virtual)[pp_rank]
    )
    terms = ModelTerms(plan.model)
    facts = plan_facts(plan, terms, activation_terms(plan, terms, modern), convention)
    return breakdown(plan, rank_memory(facts, rank=pp_rank, layers=layers, in_flight=in_flight))


def estimate_memory(
    plan: PlanInput,
    *,
    convention: str = "scaletrain",
    modern: bool = True,
    terms: ModelTerms | None = None,
) -> MemoryBreakdown:
    """Memory of the plan's worst rank without the time model (the search's first filter)."""
    return breakdown(plan, worst_rank(plan, convention=convention, modern=modern, terms=terms)[0])
