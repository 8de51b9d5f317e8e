"""What a full-AC recompute skips when the framework's checkpoint stops early.

torch's non-reentrant checkpoint (torch.utils.checkpoint.checkpoint, use_reentrant=False,
which torch.distributed's checkpoint_wrapper with CheckpointImpl.NO_REENTRANT calls) counts the
tensors the forward saved for backward and, during the recompute, raises an internal
_StopRecomputationError from the saved-tensor pack hook once that many are back, so the rest of
the block never runs (torch/utils/checkpoint.py `_enable_checkpoint_early_stop = True`,
`set_checkpoint_early_stop`; on by default since pytorch/pytorch PR 96866, 2023-03-15, first
released in torch 2.1; a per-call `early_stop` kwarg since PR 160781, 2025-08-15). An aten op
saves its inputs before its kernel runs, so the recompute ends at the pack of the block's last
saved tensor: the input (and weight) of the MLP's down projection. Its matmul, the
tensor-parallel reduction of its output (all-reduce, or reduce-scatter under SP) and the final
residual add are not recomputed. The planner's FLOP counter measured this on scaletrain's own
trainer (time/flops.py `counted_flops_per_token`: 'full' drops a dense block's down
projection).

A reentrant checkpoint (torch's CheckpointFunction, Megatron's and DeepSpeed's autograd
Functions, Nanotron's use of torch's CheckpointFunction) runs the forward under no_grad and
replays the whole block: nothing is skipped. Which a framework runs is `Recipe.ac_early_stop`
(a row's `PlanInput.ac_early_stop` where its version differs).

Ignores: the elementwise residual add (its bytes stay in time/elementwise.py's recompute
count); under torch.compile the recompute is the partitioner's graph, taken here to skip the
same ops (its backward reads nothing the down projection produces; not measured)."""

from __future__ import annotations

from ..recipes.schema import Recipe
from ..types import PlanInput
from .flops import layer_kinds

__all__ = [
    "down_projection_skipped",
    "early_stop_applies",
    "early_stop_skipped_forward_flops",
]


def early_stop_applies(plan: PlanInput, recipe: Recipe | None) -> bool:
    """Whether `plan`'s full-AC recompute stops at the pack of the MLP down projection's saved
    tensors: ac 'full' and the framework's checkpoint stops early (the row's
    `PlanInput.ac_early_stop`, else `Recipe.ac_early_stop`; the default recipe, scaletrain's
    trainer: parallel/ac.py wraps each block in torch's non-reentrant checkpoint, so yes).
    What follows that pack (the TP reduction of the down projection's output, the residual
    add) is then not recomputed; whether the matmul itself is: `down_projection_skipped`.
    Not under LoRA: an adapter on the down projection, or a quantized base weight, adds
    saves after the base matmul (not separated: the whole replay is kept)."""
    if plan.ac != "full" or plan.lora is not None:
        return False
    if plan.ac_early_stop is not None:
        return plan.ac_early_stop
    return recipe.ac_early_stop if recipe is not None else True


def down_projection_skipped(plan: PlanInput, recipe: Recipe | None) -> bool:
    """Whether the early stop (`early_stop_applies`) also skips the down projection's matmul:
    an aten mm packs its saved inputs before its kernel runs, so yes in 16-bit. Not under
    fp8: a converted linear's matmul is an autograd Function whose saved tensors are packed
    after its forward, so the matmul is recomputed and the stop comes after it (scaletrain's
    _Fp8Matmul, dry-run measured in time/flops.py `counted_flops_per_token`; torchao's
    Float8Linear, torchtitan's fp8, taken to be alike: not measured here)."""
    return early_stop_applies(plan, recipe) and plan.precision != "fp8"


def early_stop_skipped_forward_flops(plan: PlanInput, recipe: Recipe | None) -> float:
    """Forward FLOPs per token of the mean block that the recompute skips
    (`down_projection_skipped`): each dense block's down projection, 2 x h x f (its
    multiply-adds at 2 FLOPs each), times the dense blocks' share of all blocks (an MoE
    block's expert outputs are saved by the combine's multiply, so all of its experts are
    recomputed: time/flops.py `counted_flops_per_token`, dry-run measured on tiny-deepseek);
    0 otherwise. The whole tensor-parallel group's, as `step_time.model_flops`' are."""
    if not down_projection_skipped(plan, recipe):
        return 0.0
    model = plan.model
    down = sum(
        n * 2.0 * kind.dim * kind.ffn_dim for n, kind in layer_kinds(model) if not kind.is_moe
    )
    return down / max(1, model.num_layers)
