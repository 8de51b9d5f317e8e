"""Memory of the worst pipeline rank of a plan: `estimate_memory(plan) -> MemoryBreakdown`.

The search's hot path (`worst_rank`) returns plain numbers; the breakdown dataclass is built
only for the layouts the planner reports. Both go through `_rank_numbers`, so they agree.

Which ranks are evaluated: rank 0 (embedding), rank pp-1 (head), and the middle ranks no other
middle rank dominates: middle ranks hold the same per-block states, buffers and per-block
activations, so their memory grows with the layer count and with layers x in-flight
micro-batches; one with no more layers and no more in flight than another can never be the
worst. The set is exact, not sampled.
"""

from __future__ import annotations

import functools

from .memory import (
    FRAGMENTATION,
    buffer_terms,
    head_activation_bytes,
    layer_activation_bytes,
    loss_backward_bytes,
    model_state_bytes,
    stage_layer_counts,
)
from .pipeline import inflight_per_rank
from .types import MemoryBreakdown, PlanInput

__all__ = ["estimate_memory", "worst_rank", "rank_candidates", "RankNumbers"]

RankNumbers = tuple
"""(reserved, total, states dict, buffers dict, buffers sum, activations, per-layer
activations, step temporary, parameter count, pipeline rank, in-flight micro-batches)."""


@functools.lru_cache(maxsize=8192)
def rank_candidates(num_layers: int, pp: int, virtual: int, schedule: str,
                    m: int) -> tuple[tuple[int, int, float], ...]:
    """(pipeline rank, layers held, micro-batches in flight) of the ranks that can be the worst
    (see the module docstring); in-flight counts are `pipeline.inflight_microbatches`."""
    counts = stage_layer_counts(num_layers, pp, virtual)
    if pp == 1:
        return ((0, counts[0], 1.0),)
    inflight = inflight_per_rank(schedule, pp, m, virtual)
    best: dict[int, tuple[int, float]] = {}
    for r in range(1, pp - 1):
        c, f = counts[r], inflight[r]
        if c not in best or f > best[c][1]:
            best[c] = (r, f)
    # drop a middle rank another one dominates (at least as many layers and in flight)
    middle = [(r, c, f) for c, (r, f) in sorted(best.items())
              if not any(c2 >= c and f2 >= f and c2 != c for c2, (_, f2) in best.items())]
    return ((0, counts[0], inflight[0]), *middle, (pp - 1, counts[-1], inflight[-1]))


_STATES: dict[tuple, tuple] = {}


def _rank_states(plan: PlanInput, zs: int, first: bool, last: bool, layers: int,
                 convention: str) -> tuple:
    """(model-state dict, parameter count, largest FSDP unit, ZeRO-sharded count), cached."""
    L, model = plan.layout, plan.model
    key = (id(model), L.tp, L.ep, L.zero, zs, L.pp > 1, first, last, layers, plan.precision,
           plan.optimizer, plan.offload, convention)
    hit = _STATES.get(key)
    if hit is not None and hit[0] is model:  # the stored reference keeps id(model) unique
        return hit[1]
    pc = model.param_counts()
    tp, ep = L.tp, L.ep
    dense_mlp = 0 if model.is_moe else pc.mlp
    block = (pc.attention + dense_mlp) / tp + pc.norms + pc.router
    dense = layers * block
    expert = layers * pc.mlp / (tp * ep) if model.is_moe else 0.0
    unit = block + (pc.mlp / (tp * ep) if model.is_moe else 0.0)
    # FSDP2's root unit (parallel/fsdp.py: fully_shard(model) after the blocks) holds all that
    # is not a block on this stage: embedding + positions and/or final norm + head, gathered as
    # ONE unit (the dry-run's unsharded root of llama2-7b is embedding + head).
    root = 0.0
    if first:
        dense += pc.embedding / tp + pc.position
        root += pc.embedding / tp + pc.position
    if last:
        head = pc.head or (pc.embedding if L.pp > 1 else 0)  # tied head: a copy on the last stage
        dense += pc.final_norm + head / tp
        root += pc.final_norm + head / tp
    unit = max(unit, root)
    st = model_state_bytes(dense, precision=plan.precision, optimizer=plan.optimizer,
                           zero=L.zero, zero_shards=zs, offload=plan.offload,
                           convention=convention, expert_params=expert,
                           expert_shards=max(1, zs // ep), unit_params=unit,
                           largest_param=(pc.embedding / tp) if (first or last) else block)
    sharded = (dense / zs + expert / max(1, zs // ep)) if L.zero else dense + expert
    fixed = st["params"] + st["optimizer"]
    out = (st, dense + expert, unit, sharded, fixed)
    if len(_STATES) > 16384:
        _STATES.clear()
    _STATES[key] = (model, out)
    return out


_ACTS: dict[tuple, tuple] = {}


def _activation_terms(plan: PlanInput, modern: bool) -> tuple[float, float, float]:
    """(stored bytes per block, a block's full no-AC set, head bytes) per micro-batch, cached."""
    L, model = plan.layout, plan.model
    residual_fp32 = plan.precision != "fp32" and L.zero < 3  # autocast on fp32 params
    key = (id(model), plan.seq_len, plan.micro_batch, L.tp, L.sp, L.cp, plan.ac, plan.precision,
           plan.compile, modern, residual_fp32)
    hit = _ACTS.get(key)
    if hit is not None and hit[0] is model:
        return hit[1]
    s, b, p = plan.seq_len, plan.micro_batch, plan.precision
    per_layer = layer_activation_bytes(model, seq_len=s, micro_batch=b, tp=L.tp, sp=L.sp,
                                       cp=L.cp, ac=plan.ac, precision=p, modern=modern,
                                       compile=plan.compile, residual_fp32=residual_fp32)
    full = layer_activation_bytes(model, seq_len=s, micro_batch=b, tp=L.tp, sp=L.sp, cp=L.cp,
                                  ac="none", precision=p, modern=modern, compile=plan.compile,
                                  residual_fp32=residual_fp32)
    head = head_activation_bytes(model, seq_len=s, micro_batch=b, tp=L.tp, sp=L.sp, cp=L.cp,
                                 precision=p, residual_fp32=residual_fp32)
    terms = (per_layer, full, head)
    if len(_ACTS) > 16384:
        _ACTS.clear()
    _ACTS[key] = (model, terms)
    return terms


_BUFS: dict[tuple, tuple] = {}


def _buffers(plan: PlanInput, zs: int, unit: float, device: str, count: float = 0.0) -> tuple:
    """(named buffer terms, their sum, runtime context), cached. count: the rank's parameters
    (DDP's bucket copy)."""
    L, model = plan.layout, plan.model
    tokens = plan.seq_len / L.cp * plan.micro_batch
    key = (id(model), tokens, plan.precision, L.zero, L.dp, L.tp, L.sp, L.pp, L.cp, L.ep, unit,
           zs, device, count)
    hit = _BUFS.get(key)
    if hit is not None and hit[0] is model:
        return hit[1]
    bufs = buffer_terms(hidden=model.dim, tokens=tokens, precision=plan.precision, zero=L.zero,
                        dp=L.dp, tp=L.tp, sp=L.sp, pp=L.pp, cp=L.cp, ep=L.ep,
                        kv_dim=model.kv_dim, experts_per_token=model.experts_per_token,
                        unit_params=unit, zero_shards=zs, device=device,
                        bucket_params=count)
    out = (bufs, sum(bufs.values()), bufs["runtime_context"])
    if len(_BUFS) > 16384:
        _BUFS.clear()
    _BUFS[key] = (model, out)
    return out


def _block_params(plan: PlanInput) -> float:
    """Parameters of one block on this rank (the FSDP unit of a block)."""
    model, L = plan.model, plan.layout
    pc = model.param_counts()
    if model.is_moe:
        return pc.attention / L.tp + pc.norms + pc.router + pc.mlp / (L.tp * L.ep)
    return (pc.attention + pc.mlp) / L.tp + pc.norms


def _rank_numbers(plan: PlanInput, acts_terms: tuple[float, float, float], zs: int, rank: int,
                  layers: int, in_flight: float, m: int, convention: str,
                  device: str) -> RankNumbers:
    """Memory of pipeline rank `rank` holding `layers` blocks with `in_flight` micro-batches."""
    L = plan.layout
    pp = L.pp
    last = rank == pp - 1
    st, count, unit, sharded, fixed = _rank_states(plan, zs, rank == 0, last, layers,
                                                   convention)
    per_layer, full_layer, head_acts = acts_terms
    acts = in_flight * layers * per_layer
    one_layer = per_layer
    if plan.ac == "full" and layers:
        one_layer = full_layer  # one block's full set while it is recomputed in backward
        acts += one_layer
    if last:
        acts += head_acts * (m if L.pp_schedule == "gpipe" and pp > 1 else 1)
    bufs, buffers, ctx = _buffers(plan, zs, unit, device, count)
    grads = st["grads"]
    if m > 1 or pp > 1:
        fwdbwd = acts + grads
    else:  # one micro-batch, no pipeline: the backward trades activations for grads
        fwdbwd = max(acts + st["grads.in_flight"], grads + one_layer)
    # torch's foreach AdamW/SGD allocate an fp32 intermediate per parameter during step(); on a
    # GPU the trainer runs fused AdamW, which allocates none (the dry-run measures none).
    step_tmp = 0.0 if plan.offload != "none" or device != "cpu" else 4.0 * sharded
    # Three moments, the peak is the largest (calibrated against the dry-run, see
    # benchmarks/results/planner_accuracy.md):
    # - backward: states with the FSDP units in flight, every buffer, activations/grads;
    # - optimizer step: states, grads and the step's temporaries;
    # - loss backward (last stage): every activation still stored plus the cross-entropy
    #   backward temporaries (loss_backward_bytes). FSDP2 has resharded every unit (ZeRO-3) and
    #   no collective is in flight, so in-flight ZeRO-3 copies and FSDP buffers are left out;
    #   accumulated grads (m > 1) are held.
    fsdp = sum(v for k, v in bufs.items() if k.startswith("fsdp_"))
    # optimizer step: after backward the 16-bit weight casts (autocast) / unsharded FSDP units
    # are freed and no FSDP collective is in flight; DDP buckets persist.
    step_peak = fixed - st["params.in_flight"] + buffers - fsdp + grads - st["grads.in_flight"] \
        + step_tmp
    peak = max(fixed + buffers + fwdbwd, step_peak)
    if L.zero >= 3 and layers and unit > 0:
        # ZeRO-3: the in-flight copies and FSDP buffers scale with the unit. While activations
        # are stored only block units are in flight; the root unit (embedding, head: the
        # largest) is reduce-scattered at the very end of backward, when every activation is
        # freed (FSDP2 runs the root's post-backward last). So: a block-unit backward moment
        # and an end-of-backward moment with one root unit and no activations.
        blk = _block_params(plan)
        f = min(1.0, blk / unit)
        inflight = st["params.in_flight"] + fsdp
        rest = fixed - st["params.in_flight"]
        grads_rest = grads - st["grads.in_flight"]
        if m > 1 or pp > 1:
            bwd = acts + grads_rest + f * st["grads.in_flight"]
        else:
            bwd = max(acts + f * st["grads.in_flight"], grads_rest + one_layer)
        bwd_peak = rest + buffers - fsdp + f * inflight + bwd
        # end of backward: one root unit gathered, its fp32 reduce-scatter input and output
        # shard; its 16-bit unsharded grads are already cast into that input (the dry-run of
        # llama2-7b widths sees no bf16 root grads at this peak).
        end_peak = rest + buffers - fsdp + inflight - st["params.in_flight"] / 2 + grads_rest
        peak = max(bwd_peak, end_peak, step_peak)
    loss_tmp = 0.0
    if last:
        loss_tmp = loss_backward_bytes(plan.model, seq_len=plan.seq_len,
                                       micro_batch=plan.micro_batch, tp=L.tp, cp=L.cp)
        bufs = dict(bufs, loss_backward_temp=loss_tmp)
        resting = fixed - (st["params.in_flight"] if L.zero >= 3 else 0.0)
        coll = sum(v for k, v in bufs.items() if k.startswith("fsdp_"))
        held = grads - st["grads.in_flight"] if (m > 1 or pp > 1) else 0.0
        loss_peak = resting + buffers - coll + acts + held + loss_tmp
        peak = max(peak, loss_peak)
    total = peak
    reserved = total + FRAGMENTATION * (total - ctx)
    return (reserved, total, st, bufs, buffers + loss_tmp, acts, per_layer, step_tmp, count,
            rank, in_flight)


def worst_rank(plan: PlanInput, *, convention: str = "scaletrain",
               modern: bool = True) -> tuple[RankNumbers, float]:
    """The worst rank's numbers (by reserved bytes) and the largest parameter count of any
    rank (what paces gradient synchronisation)."""
    L = plan.layout
    m = max(1, plan.grad_accum)
    device = "cpu" if plan.hardware.name == "cpu" else "gpu"
    zs = L.zero_shards
    acts_terms = _activation_terms(plan, modern)
    worst = None
    max_params = 0.0
    for rank, layers, in_flight in rank_candidates(plan.model.num_layers, L.pp, L.pp_virtual,
                                                   L.pp_schedule, m):
        nums = _rank_numbers(plan, acts_terms, zs, rank, layers, in_flight, m, convention,
                             device)
        if worst is None or nums[0] > worst[0]:
            worst = nums
        if nums[8] > max_params:
            max_params = nums[8]
    assert worst is not None
    return worst, max_params


def breakdown(plan: PlanInput, nums: RankNumbers) -> MemoryBreakdown:
    """The public MemoryBreakdown of `_rank_numbers`' tuple."""
    reserved, total, st, bufs, buffers, acts, per_layer, step_tmp, count, rank, inflight = nums
    L = plan.layout
    cap = plan.hardware.memory_bytes
    return MemoryBreakdown(
        params=st["params"], grads=st["grads"], optimizer=st["optimizer"], activations=acts,
        buffers=buffers, total=total, reserved=reserved, capacity=cap, fits=reserved <= cap,
        rank=rank * L.tp * L.cp * L.dp, buffer_terms=dict(bufs),
        detail={"params.in_flight": st["params.in_flight"],
                "grads.in_flight": st["grads.in_flight"], "offloaded.cpu": st["offloaded"],
                "activations.per_layer": per_layer, "activations.in_flight": inflight,
                "optimizer_step.temp": step_tmp, "allocator_reserve": reserved - total,
                "params.count": count, "pipeline_rank": rank})


def estimate_memory(plan: PlanInput, *, convention: str = "scaletrain",
                    modern: bool = True) -> MemoryBreakdown:
    """Memory of the plan's worst rank without the time model (the search's first filter)."""
    return breakdown(plan, worst_rank(plan, convention=convention, modern=modern)[0])
