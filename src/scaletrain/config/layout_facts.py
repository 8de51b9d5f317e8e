"""What a layout implies for how it runs, one rule each for the trainer and the planner: which
gradient sync data parallelism uses, whether the fused head + loss runs, how experts are split
and sharded, micro-batches per step, and which layers and stages each pipeline rank holds.

Whether a layout is legal at all is `config.layout`'s (`layout_problems`); these assume it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .layout import Layout

__all__ = [
    "ddp_reducer",
    "fused_head_loss",
    "expert_tp",
    "expert_split",
    "expert_zero_shards",
    "fsdp_reshard_after_forward",
    "grad_accum_steps",
    "split_backward",
    "stage_layer_ranges",
    "stage_ids",
]


def ddp_reducer(layout: Layout) -> bool:
    """Whether ZeRO-0/1 data parallelism runs torch's DDP reducer (bucketed all-reduce inside
    backward): only over plain parameters of an unpipelined model. Tensor- and expert-parallel
    parameters are DTensors, and pipeline stages interleave micro-batches, so with tp, ep or
    pp > 1 gradients are averaged once after backward instead
    (`parallel.data_parallel.apply_manual_grad_sync`). Trainer (`parallel.uses_ddp`) and
    planner (DDP's bucket copy, `planner.memory.buffers.buffer_terms`) share this rule."""
    return (
        layout.zero <= 1
        and layout.dp * layout.cp > 1
        and layout.tp == 1
        and layout.ep == 1
        and layout.pp == 1
    )


def fused_head_loss(layout: Layout) -> bool:
    """Whether the training step's last stage runs the fused chunked head + cross-entropy
    (`models.loss`: no (tokens x vocabulary) logits) rather than logits then a loss: always,
    pipelined too (`parallel.pipeline` hands the last stage the targets), except under the
    zero-bubble and DualPipeV schedules, whose split backward (input gradients, then weight
    gradients as a second autograd pass) would run the fused loss's single backward twice (the
    dry-run's FlopCounterMode: +50% on llama-1024-L4 pp2 rank 1). Trainer and planner share
    this rule."""
    return not split_backward(layout)


def split_backward(layout: Layout) -> bool:
    """Whether the pipeline schedule splits each backward into an input-gradient pass and a
    later weight-gradient pass (zero-bubble, DualPipeV: torch's `stage_backward_input` /
    `stage_backward_weight`)."""
    return layout.pp > 1 and layout.pp_schedule in ("zero-bubble", "dualpipev")


def fsdp_reshard_after_forward(layout: Layout) -> bool:
    """Whether FSDP2 frees a unit's gathered parameters after its forward (`fully_shard`'s
    `reshard_after_forward`): under ZeRO-3, except on a split-backward pipeline (`split_backward`),
    whose stages keep every unit gathered from torch's UNSHARD action to its RESHARD.

    Why: torch 2.13's `stage_backward_input` (torch/distributed/pipelining/_backward.py) finds
    the weights' gradient paths through the stage module's registered parameters at the
    input-gradient pass, and FSDP2 registers the sharded DTensors there once a unit is
    resharded (`FSDPParam.to_sharded`), while the graph holds the unsharded ones. A unit
    resharded after its forward (an explicit `reshard_after_forward=True` reshards the root
    too: only the default None keeps it gathered, `_fsdp_state._lazy_init`) is then missed,
    and the weight pass computes no gradient for it: on gloo, pp2 x dp2 ZeRO-3 zero-bubble
    left every parameter of the last stage without a gradient, and with 2 virtual stages the
    last stage's norm and head. torch's multi-stage runtime brackets a stage's compute with
    UNSHARD / RESHARD (`schedules._add_unshard_reshard`, up to 3 stages gathered at once);
    with FSDP's own reshard after forward off, the units stay gathered between them, so I and
    W find them. torchtitan turns it off under every pipeline (`reshard_after_forward = not
    pp_enabled`). Trainer (`parallel.parallelize`) and planner (`planner.memory.states`)
    share this rule."""
    return layout.zero >= 3 and not split_backward(layout)


def expert_tp(tp: int, ep: int) -> int:
    """Ways each expert's f dim is split over tp: tp when ep = 1 (Megatron's expert TP), else 1
    (experts split whole by ep and kept whole on every tp rank). The one rule trainer and
    planner share (parallel.parallelize passes `shard_experts = ep == 1` to `apply_tp`)."""
    return tp if ep == 1 else 1


def expert_split(layout: Layout) -> int:
    """Ranks each MoE expert parameter is split over: ep x `expert_tp` (tp or ep)."""
    return layout.ep * expert_tp(layout.tp, layout.ep)


def expert_zero_shards(layout: Layout) -> int:
    """Ranks ZeRO shards each expert's states over: the dp*cp/ep ranks holding the same
    experts (ZeRO-1 partitions them there, `parallel.zero._LocalShardZero`; with ep = 1 that is
    every ZeRO rank); 1 under ZeRO-2/3 with ep > 1, whose FSDP2 leaves the experts alone
    (`parallel.parallelize`: only their gradients are averaged over the replicas)."""
    if layout.ep > 1 and layout.zero >= 2:
        return 1
    return max(1, layout.zero_shards // layout.ep)


def grad_accum_steps(global_batch: int, micro_batch: int, dp: int) -> int:
    """Micro-batches per optimizer step per dp rank (= pipeline micro-batches m)."""
    return global_batch // (micro_batch * dp)


def stage_layer_ranges(num_layers: int, num_stages: int) -> list[range]:
    """Transformer-layer indices of each pipeline stage; the one balancing rule of scaletrain.

    The embedding and the final norm + head each count as one unit of work beside the L layers;
    the L + 2 units are spread evenly over the stages, leftovers to the middle stages first, then
    to the ends; the first stage's embedding and the last stage's head take one unit each. So 32
    layers over 4 stages hold 7, 9, 9, 7 layers. Ignores that a 128k-vocabulary head costs more
    than one layer (Narayanan et al. 2021 balance by layers only; this is a step closer).
    """
    if num_stages < 1 or num_layers + 2 < num_stages:
        raise ValueError(
            f"cannot split {num_layers} layers (+ embedding + head) into "
            f"{num_stages} stages: lower parallel.pp or parallel.pp_virtual"
        )
    if num_stages == 1:
        return [range(num_layers)]
    units = [(num_layers + 2) // num_stages] * num_stages
    extra = (num_layers + 2) % num_stages
    for s in [*range(1, num_stages - 1), 0, num_stages - 1][:extra]:
        units[s] += 1
    units[0] -= 1  # the embedding
    units[-1] -= 1  # the final norm + head
    out, start = [], 0
    for n in units:
        out.append(range(start, start + n))
        start += n
    return out


def stage_ids(pp_rank: int, pp_size: int, virtual: int, *, schedule: str = "") -> list[int]:
    """Global stage indices held by `pp_rank`: rank r holds r, r + pp, ... (looped:
    interleaved, zero-bubble), or r and 2·pp − 1 − r under 'dualpipev' (the V: rank 0 holds
    the first and the last stage; torch's `generate_stage_to_rank_mapping(style="v")`)."""
    if schedule == "dualpipev":
        return [pp_rank, 2 * pp_size - 1 - pp_rank]
    return [pp_rank + k * pp_size for k in range(virtual)]
