"""Validation: the mean loss over every valid target token of the held-out batches, per layout
(pipelined or not), and the per-source losses of `data.eval_sources`.

The validation loss is sum(token losses) / count(valid targets) over all the ranks' batches,
both all-reduced once: the quantity the training step's loss is (`trainer.tokens`). A mean of
per-batch means would weight a batch of 10 valid targets (an SFT reply, the last packed
document) like one of 1,000. Each batch's fused loss is its mean over its n valid targets
(this cp rank's shard under cp), so loss x n is its token sum; a pipeline's last stage weighs
each micro-batch the same way (`PipelineRuntime.eval_loss` with `loss_divisor` = 1 / n) and
broadcasts the sum to its pp ranks. The all-reduce runs over every rank: tp and pp replicas of
a dp x cp rank hold equal sums and counts, so each dp x cp share is counted tp x pp times in
the numerator and the denominator alike. Sums and counts are float64 (exact counts to 2^53).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from scaletrain.data.loader import Batch

from .build import Run
from .host import host_float
from .metrics import perplexity
from .precision import autocast
from .step import local_batch, plain
from .tokens import valid_targets

__all__ = ["val_batch_count", "evaluate", "evaluate_sets"]


def val_batch_count(run: Run) -> int:
    """`train.eval_batches`, rounded up to whole pipeline steps under pipelining."""
    n = run.job.train.eval_batches
    k = run.grad_accum if run.pipeline is not None else 1
    return -(-n // k) * k


def _token_sum(targets: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    """The pipeline's `loss_divisor` for a token sum: 1 / n, so a micro-batch's mean loss over
    its n valid targets enters as its sum over them (a micro-batch without any: loss 0)."""
    return valid_targets(targets).clamp(min=1).to(loss.dtype).reciprocal()


@torch.no_grad()
def evaluate(run: Run, batches: list[Batch]) -> float | None:
    """The mean loss over all valid target tokens of `batches` on all ranks (module docstring);
    None when there are none. Pipelined: forward-only schedule runs over groups of
    `grad_accum` batches (the step's micro-batch count; `val_batch_count` rounds the count up
    to whole groups)."""
    run.model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=run.device)
    count = torch.zeros((), dtype=torch.float64, device=run.device)
    k = run.grad_accum if run.pipeline is not None else 1
    for i in range(0, len(batches) - k + 1, k):
        inputs = torch.cat([x for x, _ in batches[i : i + k]]).to(run.device)
        targets = torch.cat([y for _, y in batches[i : i + k]]).to(run.device)
        shard, shard_targets, model_kw = local_batch(run, inputs, targets)  # cp: this shard
        n = valid_targets(shard_targets)
        count += n
        with autocast(run.job.precision, run.device.type):
            if run.pipeline is not None:  # (it takes the whole batch and shards it over cp)
                summed = run.pipeline.eval_loss(inputs, targets, loss_divisor=_token_sum)
                loss_sum += summed.double() / run.scaler.scale
            else:
                loss = run.model(shard, targets=shard_targets, **model_kw)  # fused head+loss
                loss_sum += plain(loss).detach().double() * n
    run.model.train()
    both = torch.stack([loss_sum, count])
    if dist.is_initialized():
        dist.all_reduce(both)
    total, tokens = host_float(both[0], unknown=0.0), host_float(both[1], unknown=0.0)
    return total / tokens if tokens > 0 else None


def evaluate_sets(
    run: Run, sets: dict[str, list[Batch]], last: dict[str, float]
) -> dict[str, float]:
    """Loss and perplexity of each eval source (all ranks), as metric fields; `last` keeps
    the latest loss per name (the run's result)."""
    out = {}
    for name, batches in sets.items():
        loss = evaluate(run, batches)
        if loss is None:
            continue
        last[name] = loss
        out[f"val_loss/{name}"], out[f"ppl/{name}"] = loss, perplexity(loss)
    return out
