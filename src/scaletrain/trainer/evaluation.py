"""Validation: the mean loss over held-out batches, per layout (pipelined or not), and the
per-source losses of `data.eval_sources`."""

from __future__ import annotations

import torch

from scaletrain.data.loader import Batch

from .build import Run
from .metrics import perplexity
from .precision import autocast
from .step import all_mean, local_batch, plain

__all__ = ["val_batch_count", "evaluate", "evaluate_sets"]


def val_batch_count(run: Run) -> int:
    """`train.eval_batches`, rounded up to whole pipeline steps under pipelining."""
    n = run.job.train.eval_batches
    k = run.grad_accum if run.pipeline is not None else 1
    return -(-n // k) * k


@torch.no_grad()
def evaluate(run: Run, batches: list[Batch]) -> float | None:
    """Mean validation loss over `batches` (all ranks). Pipelined: forward-only schedule runs
    over groups of `grad_accum` batches (the step's micro-batch count; `val_batch_count`
    rounds the count up to whole groups), the same mean over the same batches."""
    run.model.eval()
    if run.pipeline is not None:
        k = run.grad_accum
        losses = []
        for i in range(0, len(batches) - k + 1, k):
            inputs = torch.cat([x for x, _ in batches[i : i + k]]).to(run.device)
            targets = torch.cat([y for _, y in batches[i : i + k]]).to(run.device)
            with autocast(run.job.precision, run.device.type):
                losses.append(run.pipeline.eval_loss(inputs, targets) / run.scaler.scale)
        run.model.train()
        return all_mean(torch.stack(losses).mean()) if losses else None
    total = torch.zeros((), device=run.device)
    for inputs, targets in batches:
        inputs, targets, model_kw = local_batch(run, inputs, targets)
        with autocast(run.job.precision, run.device.type):
            loss = run.model(inputs, targets=targets, **model_kw)  # fused head+loss
        total += plain(loss).detach().float()
    run.model.train()
    return all_mean(total / max(1, len(batches)))


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
