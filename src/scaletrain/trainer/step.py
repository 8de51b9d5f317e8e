"""One training step: the code the loop, the dry-run, the profiler and the parity tests all run.

`train_step` is forward + backward of every micro-batch, the gradient syncs the wrappers do not
do themselves, the fp16 unscale/overflow check and clipping; `apply_update` is what follows an
accepted step (optimizer, loss-scale update, zero_grad). Nobody copies these: whoever needs to
watch a step (the dry-run's memory tracker and timeline, the loop's activation probe, the
profiler's phase clock) passes `StepHooks`, and the step is the same code with or without them.

Under fake tensors (the dry-run) values do not exist: the host-side reads of the loss, the
gradient norm and the fp16 overflow flag go through `host_float`, which answers for a fake
tensor with the value a healthy step would have.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from scaletrain.data.loader import Batch
from scaletrain.dtensor import to_full
from scaletrain.models import moe_aux_loss
from scaletrain.parallel import (
    clip_grad_norm_,
    loss_context,
    maybe_no_sync,
    sync_gradients,
    update_router_biases,
)

from .build import tp_mesh
from .host import host_float
from .precision import autocast
from .tokens import loss_divisor, step_token_count

if TYPE_CHECKING:
    from .build import Run

__all__ = [
    "StepHooks",
    "StepOut",
    "train_step",
    "apply_update",
    "forward_backward",
    "local_batch",
    "all_mean",
]


class StepHooks:
    """Observers of one step; the default observes nothing.

    - `microbatch(k)`: a context around micro-batch k's forward and loss (pipelined: around
      the loss the last stage computes for micro-batch k, inside the schedule);
    - `pipeline_step(stages)`: a context around a pipelined step's schedule (this rank's
      stage modules);
    - `stage_forward(stage)`: called before a pipeline stage's forward (the dry-run's action
      driver; torch's schedules do not call it);
    - `event(name)`: 'loss:k', 'backward_done:k', 'forward_backward_done' (every micro-batch
      through), 'grads_ready' (after the gradient syncs, before unscale/clip),
      'optimizer_step', 'zero_grad'.
    """

    def microbatch(self, k: int) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def pipeline_step(self, stages: Sequence[torch.nn.Module]) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def stage_forward(self, stage: torch.nn.Module) -> None:
        return None

    def event(self, name: str) -> None:
        return None


NO_HOOKS = StepHooks()


@dataclass
class StepOut:
    loss: float
    grad_norm: float
    finite: bool
    """Every gradient finite on every rank (fp16 overflow check)."""


def plain(t: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor (the loss under loss_parallel) as a plain tensor."""
    return to_full(t)


def all_mean(x: torch.Tensor) -> float:
    """The mean of a scalar over every rank, on the host."""
    if dist.is_initialized():
        x = x.clone()
        dist.all_reduce(x)
        x /= dist.get_world_size()
    return host_float(x, unknown=0.0)


def local_batch(
    run: Run, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Move a micro-batch to the device; with cp > 1 keep this rank's load-balanced chunks.
    Returns (inputs, targets, model keywords): cp's positions, and with document masking the
    whole sequence's document ids (`cp_model_inputs`)."""
    from scaletrain.parallel.context_parallel import cp_shard

    inputs, targets = inputs.to(run.device), targets.to(run.device)
    if run.dims.cp == 1:
        return inputs, targets, {}
    rank, size = run.dims.cp_rank, run.dims.cp
    shard, kw = cp_model_inputs(inputs, rank, size, document_sep_id(run))
    return shard, cp_shard(targets, rank, size), kw


def document_sep_id(run: Run) -> int | None:
    """The end-of-document id `enable_document_masking` gave the model, else None."""
    from scaletrain.models import Transformer

    if not run.job.data.document_masking:
        return None
    return next(
        (m.document_sep_id for m in run.model.modules() if isinstance(m, Transformer)), None
    )


def cp_model_inputs(
    inputs: torch.Tensor, rank: int, size: int, sep_id: int | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(cp rank `rank`'s shard of (B, T) `inputs`, the model's keywords for it): the shard's
    global positions, or with document masking (`sep_id` set) its positions restarted per
    document and the (B, T) document ids of the whole sequence, computed before sharding (a
    shard cannot tell where its first document began) for ring attention's mask."""
    from scaletrain.models.documents import document_ids
    from scaletrain.parallel.context_parallel import cp_positions, cp_shard

    if sep_id is not None:
        docs, positions = document_ids(inputs, sep_id)
        return cp_shard(inputs, rank, size), {
            "positions": cp_shard(positions, rank, size),
            "documents": docs,
        }
    positions = cp_positions(inputs.shape[1], rank, size, device=inputs.device)
    return cp_shard(inputs, rank, size), {"positions": positions}


def forward_backward(
    run: Run,
    batches: Iterator[Batch],
    hooks: StepHooks = NO_HOOKS,
    num_microbatches: int | None = None,
) -> torch.Tensor:
    """All micro-batches of one step through forward and backward; returns this rank's share
    of the step's loss (`trainer.tokens`: the mean over the global batch's valid targets,
    once `all_mean` has averaged the shares over every rank).

    The step's valid targets are counted first (all its micro-batches, one all-reduce over
    dp), then each micro-batch's mean loss is divided by `tokens.loss_divisor`.
    `num_microbatches` (unpipelined only; default: the step's `grad_accum`) runs fewer: the
    dry-run runs two, since later ones reach no memory state the second has not.
    """
    job = run.job
    mean_degree = run.dims.layout.dp * run.dims.cp  # the ranks the gradient reductions average
    if run.pipeline is not None:
        micro = [next(batches) for _ in range(run.grad_accum)]
        inputs = torch.cat([x for x, _ in micro]).to(run.device)
        targets = torch.cat([y for _, y in micro]).to(run.device)
        total = step_token_count(run.dims, [targets], run.device)

        def divisor(mb_targets: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
            return loss_divisor(total, mb_targets, mean_degree, loss)

        with (
            autocast(job.precision, run.device.type),
            hooks.pipeline_step(run.pipeline.stages),
            run.activation_offload(),
        ):
            loss = run.pipeline.step(inputs, targets, hooks=hooks, loss_divisor=divisor)
            return loss / run.scaler.scale
    accum = num_microbatches or run.grad_accum
    micro = [next(batches) for _ in range(accum)]
    total = step_token_count(run.dims, [y for _, y in micro], run.device)
    loss_sum = torch.zeros((), device=run.device)
    for k in range(accum):
        inputs, targets, model_kw = local_batch(run, *micro[k])
        with maybe_no_sync(run.model, k == accum - 1), loss_context(tp_mesh(run.dims)):
            with (
                autocast(job.precision, run.device.type),
                hooks.microbatch(k),
                run.activation_offload(),  # memory.offload '+activations'
            ):
                loss = run.model(inputs, targets=targets, **model_kw)  # fused head+loss
                # L_k * n_k * D / N: the sum over this micro-batch's valid targets, over the
                # step's N (with equal counts: L_k / accum, as one batch accum times larger)
                div = loss_divisor(total, targets, mean_degree, plain(loss))
                weighted = loss / div
                # a dense model has no load-balancing loss: no walk over its modules per step;
                # it stays per forward (`trainer.tokens`), averaged over the micro-batches
                aux = moe_aux_loss(run.model) / accum if job.model.is_moe else None
                total_k = weighted + aux if aux is not None else weighted
            hooks.event(f"loss:{k}")
            run.scaler.scale_loss(total_k).backward()
        hooks.event(f"backward_done:{k}")
        loss_sum += (plain(loss).detach() / div).to(loss_sum.dtype)
    return loss_sum


def _precompute_fp8_scales(run: Run) -> None:
    """fp8 all-gather: this step's weight scales in one all-reduce before forward
    (`precision.fp8_fsdp.precompute_fp8_scales`), not one per weight and gather."""
    p = run.job.precision
    if p.dtype == "fp8" and p.fp8_all_gather:
        from scaletrain.precision.fp8_fsdp import precompute_fp8_scales

        precompute_fp8_scales(run.model)


def _sync_fp8_amax(run: Run) -> None:
    """fp8 delayed scaling over data/context-parallel ranks: share the recorded amaxes
    (`precision.sync_amax_histories`), so every rank scales like one process would and a
    checkpoint (histories saved once) resumes every rank exactly."""
    p, dims = run.job.precision, run.dims
    if p.dtype == "fp8" and p.fp8_amax == "delayed" and dims.layout.dp * dims.cp > 1:
        from scaletrain.precision import sync_amax_histories

        sync_amax_histories(run.model, dims.submesh("dp_cp").get_group())


def train_step(
    run: Run,
    batches: Iterator[Batch],
    hooks: StepHooks = NO_HOOKS,
    *,
    num_microbatches: int | None = None,
) -> StepOut:
    """Forward, backward, unscale and clip; the caller decides whether to apply the update
    (`apply_update`), e.g. after the spike guard has seen the loss."""
    _precompute_fp8_scales(run)
    loss = forward_backward(run, batches, hooks, num_microbatches)
    hooks.event("forward_backward_done")
    sync_gradients(run.model)  # EP's data parallelism (DDP/FSDP reduce inside backward)
    _sync_fp8_amax(run)
    hooks.event("grads_ready")
    finite = run.scaler.unscale_and_check(run.params)
    extra = run.pipeline.group if run.pipeline is not None else None
    exclude = run.pipeline.norm_exclude if run.pipeline is not None else ()
    clip = run.job.optim.grad_clip or float("inf")
    norm = clip_grad_norm_(run.params, clip, extra_group=extra, norm_exclude=exclude)
    grad_norm = host_float(norm, unknown=0.0)
    return StepOut(
        loss=all_mean(loss), grad_norm=grad_norm, finite=finite and math.isfinite(grad_norm)
    )


def apply_update(run: Run, out: StepOut, hooks: StepHooks = NO_HOOKS) -> None:
    """After an accepted step: the optimizer step (skipped on non-finite gradients), the
    DeepSeek routers' balancing bias (`parallel.update_router_biases`, the step's global expert
    loads; a no-op for other models), the loss scale's update and zero_grad."""
    if out.finite:
        run.optimizer.step()
    if run.job.model.router_bias_rate > 0:
        dims = run.dims
        group = dims.submesh("dp_cp").get_group() if dims.layout.dp * dims.cp > 1 else None
        update_router_biases([run.model], group, apply=out.finite)
    hooks.event("optimizer_step")
    run.scaler.update(out.finite)
    run.optimizer.zero_grad(set_to_none=True)
    hooks.event("zero_grad")
