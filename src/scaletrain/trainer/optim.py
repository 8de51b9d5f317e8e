"""Optimizer and learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from scaletrain.config import OptimConfig
from scaletrain.parallel import ParallelDims, wrap_optimizer

__all__ = ["build_optimizer", "lr_at", "set_lr"]


def build_optimizer(params: Iterable[torch.nn.Parameter], *, optim: OptimConfig,
                    device_type: str, dims: ParallelDims | None = None) -> torch.optim.Optimizer:
    """AdamW (fused on CUDA, foreach on CPU) or SGD with momentum; ZeRO-1 shards its states.

    Weight decay applies to matrices only (embeddings and linears), not to norms or biases, the
    GPT-2/Llama convention.
    """
    # groups by (decay?, DTensor?): foreach/fused kernels cannot mix DTensors (TP shards) with
    # plain tensors (parameters TP leaves replicated) in one group
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for p in params:
        if p.requires_grad:
            groups.setdefault((p.ndim >= 2, hasattr(p, "device_mesh")), []).append(p)
    groups = [{"params": ps, "weight_decay": optim.weight_decay if decay else 0.0}
              for (decay, _), ps in sorted(groups.items(), key=lambda kv: kv[0], reverse=True)]
    if optim.name == "sgd":
        cls, kw = torch.optim.SGD, {"lr": optim.lr, "momentum": optim.momentum}
    else:
        fused = device_type == "cuda"
        cls, kw = torch.optim.AdamW, {"lr": optim.lr, "betas": (optim.beta1, optim.beta2),
                                      "eps": optim.eps, "fused": fused or None,
                                      "foreach": None if fused else True}
    if dims is None:
        return cls(groups, **kw)
    return wrap_optimizer(cls, groups, dims, **kw)


def lr_at(step: int, *, optim: OptimConfig, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then the decay."""
    peak, floor = optim.lr, optim.lr * optim.min_lr_ratio
    if optim.warmup_steps and step < optim.warmup_steps:
        return peak * (step + 1) / optim.warmup_steps
    if optim.schedule == "constant":
        return peak
    span = max(1, total_steps - optim.warmup_steps)
    progress = min(1.0, (step - optim.warmup_steps) / span)
    if optim.schedule == "linear":
        return peak + (floor - peak) * progress
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
