"""`estimate(plan) -> Estimate`: memory of the worst rank, step time, tokens/s, MFU; cost napkin.

Pure arithmetic (no torch): the search calls it tens of thousands of times per second.
"""

from __future__ import annotations

from dataclasses import dataclass

from .memory.rank import breakdown, host_fits, worst_rank
from .memory.rank_terms import ModelTerms, model_terms
from .recipes.dist_optim import plan_recipe
from .recipes.memory import recipe_worst_rank
from .recipes.schema import Recipe
from .time.step_time import (
    model_flops,
    step_floor,
    step_time,
)
from .types import Estimate, MemoryBreakdown, PlanInput, TimeBreakdown

__all__ = [
    "estimate",
    "reserved_and_step",
    "plan_step",
    "Shortcut",
    "FULL",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Shortcut:
    """What a search call of `reserved_and_step` may skip."""

    memory_only: bool = False
    """Skip the time model (a memory probe: the step is reported as 0)."""
    settle_at: float | None = None
    """Reserved bytes, over the GPU's memory, from which a miss is settled
    (`memory.rank.worst_rank`'s early stop): once a rank reaches them the step is inf and the
    bytes a lower bound of the worst rank's (the search's `miss_threshold`)."""
    floor: bool = False
    """Time a plan that fits by `step_time.step_floor`, a lower bound of its step without the
    communication model: the search times the step itself (`plan_step`) only where its pick
    could read it."""


FULL = Shortcut()
"""Nothing skipped."""

_NOTES = (
    "FLOPs: matmuls only, 2 FLOPs per multiply-add, causal attention halved; MFU uses model "
    "FLOPs (no recompute), compute time uses hardware FLOPs (with recompute).",
    "peak model: total = params + optimizer + buffers + max(forward/backward peak, optimizer-step"
    " peak); grads coexist with all activations when m > 1 or pp > 1, else the backward trades "
    "activations for grads; fields are each term's own peak.",
    "reserved = total + FRAGMENTATION x (total - runtime_context); fits = reserved <= capacity.",
    "pipeline split: config.stage_layer_ranges (embedding and head count as a layer each); "
    "embedding on rank 0, head (a copy if tied) on the last rank; every rank that can be the "
    "worst is evaluated (rank = first global rank of the worst stage); the slowest rank paces "
    "compute.",
    "pipeline: in-flight micro-batches per rank = time.pipeline.inflight_microbatches (exact for "
    "torch's orders); bubble = time.pipeline.bubble_fraction (zero-bubble = ZB-H1, torch's order).",
    "overlap: DP/ZeRO grad reduction hides behind the last backward except one 25 MB bucket; "
    "FSDP gathers hide behind compute; TP, PP p2p and EP all-to-all are exposed; CP ring hides "
    "behind the attention core (torch's all-gather ring, Recipe.cp_ring 'torch_allgather': "
    "behind its first sub-SDPA only, time/cp_ring.py).",
)


def reserved_and_step(
    plan: PlanInput,
    *,
    convention: str = "scaletrain",
    modern: bool = True,
    causal: bool = True,
    gpus_per_node: int | None = None,
    zero_bubble: str = "h1",
    terms: ModelTerms | None = None,
    shortcut: Shortcut = FULL,
) -> tuple[float, float, float]:
    """The search's hot path: (worst-rank reserved bytes, step seconds, the largest parameter
    count of a rank: what `plan_step` reads); the step is inf when the plan does not fit (its
    time model is skipped), 0 with `shortcut.memory_only` and a lower bound with
    `shortcut.floor`. Same arithmetic as `estimate`, without building dataclasses. terms: the
    search's `ModelTerms` of the plan's model. shortcut: what the search may skip
    (`Shortcut`)."""
    terms = model_terms(plan, terms)
    recipe = _recipe(plan)
    if recipe is not None:
        mem, max_params = recipe_worst_rank(plan)
        reserved = mem.reserved
    else:
        nums, max_params = worst_rank(
            plan,
            convention=convention,
            modern=modern,
            terms=terms,
            settle_at=shortcut.settle_at,
        )
        reserved = nums.reserved
        if not host_fits(plan, nums.host):  # the offloaded bytes exceed the node's RAM
            return reserved, float("inf"), max_params
    if reserved > plan.hardware.memory_bytes:
        return reserved, float("inf"), max_params
    if shortcut.memory_only:
        return reserved, 0.0, max_params
    if shortcut.floor:
        floor = step_floor(
            plan, max_params, terms=terms, causal=causal, zero_bubble=zero_bubble, recipe=recipe
        )
        return reserved, floor, max_params
    step = plan_step(
        plan,
        max_params,
        terms=terms,
        causal=causal,
        gpus_per_node=gpus_per_node,
        zero_bubble=zero_bubble,
    )
    return reserved, step, max_params


def plan_step(
    plan: PlanInput,
    max_params: float,
    *,
    terms: ModelTerms | None = None,
    causal: bool = True,
    gpus_per_node: int | None = None,
    zero_bubble: str = "h1",
) -> float:
    """The step seconds `reserved_and_step` reports for a plan that fits, whose ranks hold at
    most `max_params` parameters (`step_time.step_time` under the plan's recipe)."""
    st = step_time(
        plan,
        max_params,
        terms=model_terms(plan, terms),
        causal=causal,
        gpus_per_node=gpus_per_node,
        zero_bubble=zero_bubble,
        recipe=_recipe(plan),
    )
    return st.step_s


def _recipe(plan: PlanInput) -> Recipe | None:
    """The plan's framework recipe (`recipes.registry`), None for the default one (scaletrain's
    own model)."""
    return plan_recipe(plan)


def estimate(
    plan: PlanInput,
    *,
    convention: str = "scaletrain",
    modern: bool = True,
    causal: bool = True,
    gpus_per_node: int | None = None,
    zero_bubble: str = "h1",
    terms: ModelTerms | None = None,
) -> Estimate:
    """Evaluate one layout: worst-rank memory, step time, tokens/s (whole job), MFU.

    convention: model-state byte convention (memory.states.CONVENTIONS); modern: modern activation
    model (False = Korthikanti's GPT formula); causal: halve causal attention FLOPs;
    zero_bubble: 'h1' = the ZB-H1 bubble of torch's zero-bubble order that the trainer runs,
    'h2' = the ideal zero bubble (what-if only; see time.pipeline.bubble_fraction).
    """
    L, hw = plan.layout, plan.hardware
    terms = model_terms(plan, terms)
    recipe = _recipe(plan)
    mem: MemoryBreakdown
    if recipe is not None:
        mem, max_params = recipe_worst_rank(plan)
    else:
        nums, max_params = worst_rank(plan, convention=convention, modern=modern, terms=terms)
        mem = breakdown(plan, nums)
    st = step_time(
        plan,
        max_params,
        terms=terms,
        causal=causal,
        gpus_per_node=gpus_per_node,
        zero_bubble=zero_bubble,
        recipe=recipe,
    )
    step_s = st.step_s
    model_fpt = model_flops(terms, plan.seq_len, causal, plan.ac, plan.lora, L.tp).model
    comm_s = {k: v[1] for k, v in st.comm.items()}
    m = max(1, plan.grad_accum)
    tokens_step = float(m * plan.micro_batch * L.dp * plan.seq_len)
    tokens_per_s = tokens_step / step_s if step_s > 0 else 0.0
    peak = hw.flops(plan.precision)
    mfu = model_fpt * tokens_per_s / (peak * max(1, plan.num_gpus))
    time = TimeBreakdown(
        step_s=step_s,
        compute_s=st.compute_s,
        comm_exposed_s=st.exposed_s,
        bubble_s=st.bubble_s,
        optimizer_s=st.optimizer_s,
        overhead_s=st.overhead_s,
        comm_total_s=sum(comm_s.values()),
        comm_terms=comm_s,
        overlap_sm_s=st.overlap_sm_s,
        host_bound_s=st.host_bound_s,
    )
    notes = _notes(convention, st.efficiency, plan.precision, peak)
    if plan.calibration is not None and plan.efficiency <= 0:
        from .time.calibration import describe_calibration, host_sharing_note

        notes[1] = " ".join(describe_calibration(plan.calibration))
        per_host = min(plan.layout.world_size, plan.hardware.gpus_per_node)
        sharing = host_sharing_note(plan.calibration, per_host)
        if sharing is not None:
            notes.insert(2, sharing)
    if recipe is not None:
        notes[0] = (
            f"recipe={recipe.name!r} ({recipe.framework}): model states, activations, "
            "loss, buffers and allocator terms from planner/recipes.py "
            "(recipes/memory.py); time model time/efficiency.py"
        )
    return Estimate(
        plan=plan,
        memory=mem,
        time=time,
        flops_per_token=model_fpt,
        tokens_per_s=tokens_per_s,
        mfu=mfu,
        notes=notes,
    )


_NOTES_CACHE: dict[tuple, list[str]] = {}


def _notes(convention: str, eff: float, precision: str, peak: float) -> list[str]:
    key = (convention, eff, precision, peak)
    hit = _NOTES_CACHE.get(key)
    if hit is None:
        hit = [
            f"model states: convention={convention!r}",
            f"efficiency={eff:.3f} of {precision} peak {peak / 1e12:.1f} TFLOP/s",
            *_NOTES,
        ]
        if len(_NOTES_CACHE) > 1024:
            _NOTES_CACHE.clear()
        _NOTES_CACHE[key] = hit
    return list(hit)
