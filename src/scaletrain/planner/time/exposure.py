"""Which communication of a step stays on the critical path: the families a run overlaps with
compute (`run_overlap`), the compute of the busiest pipeline rank they can hide behind
(`ComputeWindow`), and the seconds each family leaves exposed after overlap
(`exposed_by_family`, summed), which step_time.step_time adds to the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import compute_bytes

from ..recipes.schema import DEFAULT_RECIPE, Recipe
from ..types import PlanInput
from .comm import CommInputs, allreduce_seconds, allreduce_time, axis_link, dp_allreduce_latency
from .efficiency import COMM_OVERLAP

__all__ = ["run_overlap", "ComputeWindow", "exposed_by_family", "fsdp2_end_exposure"]


def run_overlap(plan: PlanInput, recipe: Recipe | None) -> tuple[str, ...]:
    """The communication families a plan's run overlaps with compute (`exposed_by_family`): its
    framework recipe's defaults (efficiency.COMM_OVERLAP) and those the run states
    (`PlanInput.comm_overlap`, foreign recipes only: scaletrain's trainer overlaps its own).
    A run whose pipeline sends are Megatron-LM 2021's blocking scatter/gather
    (`PlanInput.pp_scatter_gather`) does not overlap them under the interleaved schedule."""
    if recipe is None:
        return ()
    own = COMM_OVERLAP.get(recipe.name, ())
    if recipe.name == DEFAULT_RECIPE:
        return own
    if plan.pp_scatter_gather:
        own = tuple(f for f in own if f != "pp_p2p_interleaved")
    return own + tuple(f for f in plan.comm_overlap if f not in own)


@dataclass(kw_only=True, slots=True)
class ComputeWindow:
    """The compute of the busiest pipeline rank that communication can hide behind
    (`exposed_by_family`). Not frozen, as `step_time.StepTime`."""

    microbatches: int
    """Micro-batches per step (m)."""
    forward_s: float
    """One micro-batch's forward seconds."""
    backward_s: float
    """One micro-batch's backward seconds (with any recompute)."""
    core_s: float
    """The step's attention-core seconds (what the CP ring overlaps)."""
    layers: int
    """Blocks of the busiest rank (one FSDP unit each, + the root unit)."""
    fsdp_ends: tuple[float, float] | None = None
    """(gather, reduce-scatter) seconds per micro-batch at a ZeRO-3 pass's two ends that no
    compute of the window covers under FSDP2 (`fsdp2_end_exposure`); None: the shared rule
    (one average unit's gather)."""


def fsdp2_end_exposure(
    plan: PlanInput,
    recipe: Recipe | None,
    inputs: CommInputs,
    terms: dict[str, tuple[float, float]],
) -> tuple[float, float] | None:
    """(the all-gather, the reduce-scatter) seconds per micro-batch that torch FSDP2 leaves
    exposed at the two ends of a ZeRO-3 pass, for a recipe that runs torch's `fully_shard`
    (Recipe.fsdp2_ends_exposed) with pp = 1 and ep = 1; None otherwise (`exposed_by_family` then
    keeps its one-average-unit rule). Read in torch's torch/distributed/fsdp/_fully_shard/
    _fsdp_state.py (pytorch/pytorch 1fd469d):
    - the forward: a unit's all-gather is issued by its pre-forward hook on the all-gather
      stream, and the compute stream waits for it; the next unit's gather hides behind this
      unit's compute because the host runs ahead, but the step's first gathers have no compute
      before them: the first unit (the root under `fsdp_ends` 'root' / 'unstated': embedding,
      final norm and head; the embedding's own unit under 'own_units', `PlanInput.fsdp_ends`)
      and block 0, behind nothing but the embedding lookup;
    - the backward: `FSDPState._root_post_backward_final_callback` runs the post-backward of
      every unit whose forward inputs needed no gradient (the root / embedding unit: its input
      is the token ids), which issues that unit's reduce-scatter after block 0's, then, on the
      last backward, makes the current stream wait on the last reduce-scatter's event
      (`reduce_scatter_state.event`): block 0's and the end unit's reduce-scatters hide behind
      nothing (the embedding's backward is a scatter-add).
    Seconds: the family's own (`terms`, calibrated where the plan is) in proportion to the
    units' bytes: the gathered bytes (the end units in the gather dtype, never fp8: neither the
    embedding nor the head is a Float8Linear; block 0's share of the fp8-gathered weights at
    1 B) over a pass's, the reduce-scatter's parameters over the rank's. Per-rank parameters:
    the end units' count / tp, a block the rest / layers. Ignores: the collective's latency
    steps (scaled with the bytes), the embedding lookup's few microseconds."""
    L = plan.layout
    if (
        recipe is None
        or not recipe.fsdp2_ends_exposed
        or L.zero < 3
        or L.pp > 1
        or L.ep > 1
        or "fsdp_all_gather" not in terms
        or "fsdp_reduce_scatter" not in terms
    ):
        return None
    c = plan.model.param_counts()
    end = float(c.embedding + c.position)
    if plan.fsdp_ends != "own_units":
        end += c.final_norm + c.head
    P = inputs.stage_params
    end_rank = min(P, end / max(1, L.tp))
    block = (P - end_rank) / max(1, inputs.layers)
    pb = inputs.param_comm_bytes or compute_bytes(plan.precision)
    fp8 = min(inputs.fp8_gather_params, P - end_rank)
    fp8_block = fp8 / max(1, inputs.layers)
    gathered = (P - fp8) * pb + fp8
    if gathered <= 0 or P <= 0:
        return None
    m = max(1, inputs.micro_batches)
    per = terms["fsdp_all_gather"][1] / (2 * m)
    rs = terms["fsdp_reduce_scatter"][1] / m
    first_bytes = end_rank * pb + (block - fp8_block) * pb + fp8_block
    return per * first_bytes / gathered, rs * (end_rank + block) / P


def exposed_by_family(
    terms: dict[str, tuple[float, float]],
    plan: PlanInput,
    compute: ComputeWindow,
    *,
    stage_params: float,
    gpus_per_node: int | None,
    bucket_bytes: float = 25 * 2**20,
    tree: bool = False,
    overlap: tuple[str, ...] = (),
) -> dict[str, float]:
    """Communication seconds left on the critical path after overlap, per family of `terms`
    (FSDP's reduce-scatter is charged with the backward all-gather, under 'fsdp_all_gather').
    bucket_bytes: the last gradient bucket, reduced after the backward ends (exposed);
    tree: its latency term is NCCL's ring / tree model (comm.dp_allreduce_latency);
    overlap: families the recipe's framework overlaps (efficiency.COMM_OVERLAP): 'tp' and
    'pp_p2p' hide behind the step's compute, 'dp_param_gather' (the updated weights'
    all-gather) behind the next step's forwards except one chunk, like the gradient reduce;
    compute.fsdp_ends: (gather, reduce-scatter) seconds per micro-batch that FSDP2 leaves
    exposed at a pass's two ends (`fsdp2_end_exposure`): the forward's first gathers and the
    backward's last reduce-scatters, every micro-batch, the backward's at least that; None:
    the first unit's gather only, as one unit of layers + 1 even ones."""
    L, hw = plan.layout, plan.hardware
    m, layers = compute.microbatches, compute.layers
    t_fwd, t_bwd, t_core = compute.forward_s, compute.backward_s, compute.core_s
    fsdp_ends = compute.fsdp_ends
    out: dict[str, float] = {}
    bucket = 0.0
    if "dp_allreduce" in terms or "zero_reduce_scatter" in terms or "hsdp_allreduce" in terms:
        link = axis_link(L, hw, "dp", gpus_per_node)
        bw, lat, _ = link
        n = L.dp * L.cp if L.zero else L.dp
        size = min(bucket_bytes, stage_params * 4)
        nn = max(n, 2)
        if tree:
            ring = 2 * (nn - 1) / nn * size / bw + dp_allreduce_latency(L, hw, gpus_per_node, nn)
        else:
            ring = allreduce_time(size, nn, bw, lat)
        # an all-reduce (zero 0) may run as NVLink SHARP inside a node; ZeRO's last bucket is a
        # reduce-scatter, priced as the ring's all-reduce here as before
        bucket = allreduce_seconds(size, nn, link, hw, ring=ring) if not L.zero else ring
    for name, (_, t) in terms.items():
        if name in ("dp_allreduce", "hsdp_allreduce"):
            out[name] = max(t - t_bwd, min(t, bucket))
        elif name == "zero_reduce_scatter":
            window = t_bwd if L.zero == 1 else m * t_bwd
            out[name] = max(t - window, min(t, bucket))
        elif name == "fsdp_all_gather":
            per = t / (2 * m)
            rs = terms["fsdp_reduce_scatter"][1] / m
            if fsdp_ends is None:
                first = per / (layers + 1)  # the first unit's gather has nothing to hide behind
                fwd = m * max(0.0, per - t_fwd, first)
                bwd = m * max(0.0, per + rs - t_bwd)
            else:
                # the end gathers are part of `per`: a pass exposes the larger of its deficit
                # and its unhidden ends (first + max(rest, compute) - compute), never their sum
                fwd = m * max(0.0, per - t_fwd, fsdp_ends[0])
                bwd = m * max(0.0, per + rs - t_bwd, fsdp_ends[1])
            out[name] = fwd + bwd
        elif name == "fsdp_reduce_scatter":
            continue  # charged with the backward all-gather above
        elif name == "cp_ring":
            out[name] = max(0.0, t - t_core)
        elif (
            name in ("tp", "pp_p2p")
            and name in overlap
            or (
                name == "pp_p2p"
                and "pp_p2p_interleaved" in overlap
                and L.pp_schedule == "interleaved"
            )
        ):
            out[name] = max(0.0, t - m * (t_fwd + t_bwd))
        elif name == "zero_all_gather" and L.zero == 1 and "dp_param_gather" in overlap:
            out[name] = max(t - m * t_fwd, min(t, bucket))
        else:  # zero_all_gather, tp, pp_p2p, ep_all_to_all: on the critical path
            out[name] = t
    return out
