"""The step's loss is the mean over the global batch's valid target tokens.

A micro-batch's loss is the mean over its own valid targets (`models.loss`: targets equal to
`IGNORE_INDEX` do not count: SFT prompts, masked documents, padding). Averaging those means
over micro-batches (`total / accum`) and data-parallel ranks (DDP's and FSDP's gradient mean)
weights every micro-batch alike, so a micro-batch of 10 valid targets counts as much as one of
1,000: the gradient is not that of the global token mean when the counts differ (the defect
Hugging Face transformers fixed in 4.46; torchtitan divides by the global count instead).

Here the step counts the valid targets of all its micro-batches, all-reduced once per step
over the data-parallel ranks (`step_token_count`; the cp ranks of a dp rank see the same
sequences, so the count over dp is the global one), and micro-batch k's mean loss L_k over its
n_k targets enters the backward divided by `loss_divisor` = N / (n_k * D): L_k * n_k * D / N,
its sum over tokens times D / N. D = dp x cp is the number of ranks the gradient reductions
average over (DDP, FSDP, the manual sync, EP's replicas: every one of them computes the
gradient of the mean over the dp x cp ranks of their local losses), so their mean gives
sum_k sum_tokens / N: the global token mean, whatever the accumulation / dp / cp / pp split.
Under cp, n_k counts this rank's shard of the micro-batch (its share of the sum).

With equal counts (n_k * D * M = N for M micro-batches) the divisor is exactly M, so the loss
is `L_k / M` bit for bit as before. A micro-batch with no valid target has loss 0 and gradient
0 (its divisor is N, finite). The logged loss (and the spike guard, which reads it) is the same
quantity: sum_k L_k / divisor_k on each rank, averaged over all ranks by the step
(`all_mean`: dp x cp ranks hold shares times D, tp and pp replicas hold equal values).

The MoE load-balancing loss is a function of the tokens one forward routes, not a sum over
target tokens: it stays per forward, averaged over micro-batches and ranks as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from scaletrain.parallel import ParallelDims

__all__ = ["IGNORE_INDEX", "loss_divisor", "step_token_count", "valid_targets"]

IGNORE_INDEX = -100
"""The target id the loss ignores (`models.loss`, the loader's masked targets)."""


def valid_targets(targets: torch.Tensor) -> torch.Tensor:
    """The number of targets != IGNORE_INDEX, an int64 scalar on `targets`' device."""
    return (targets != IGNORE_INDEX).sum()


def step_token_count(
    dims: ParallelDims, targets: Sequence[torch.Tensor], device: torch.device
) -> torch.Tensor:
    """The valid targets of the whole step on `device`: this rank's micro-batches (whole
    sequences, before any cp sharding; counted where they are), summed over the data-parallel
    ranks (one all-reduce; none at dp = 1)."""
    count = torch.stack([valid_targets(t) for t in targets]).sum().to(device)
    if dims.mesh is not None and dims.layout.dp > 1:
        dist.all_reduce(count, group=dims.submesh("dp").get_group())
    return count


def loss_divisor(
    total: torch.Tensor, targets: torch.Tensor, mean_degree: int, like: torch.Tensor
) -> torch.Tensor:
    """N / (n * D) in `like`'s dtype: what a micro-batch's mean loss over its n valid
    `targets` is divided by for the step's loss to be the mean over all N (`total`) valid
    targets once the gradient reductions have averaged over D = `mean_degree` ranks."""
    share = (valid_targets(targets) * mean_degree).clamp(min=1)
    return (total.clamp(min=1) / share).to(dtype=like.dtype, device=like.device)
