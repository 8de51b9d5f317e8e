"""The auxiliary-loss-free balancing step of DeepSeek-V3's routers, over the data-parallel ranks.

Wang et al. 2024 (arXiv:2408.15664, Algorithm 1) and DeepSeek-V3 (arXiv:2412.19437 sec. 2.1.2):
after each training step every MoE layer's expert bias moves by gamma * sign(mean load - load),
the load counted over the step's whole batch. Each rank counted the tokens of its own
micro-batches (`models.deepseek_moe.DeepSeekMoE.expert_load`); the counts of all layers go
through one all-reduce (sum) over the data x context-parallel ranks, which see disjoint tokens
and hold the same layers (tensor-parallel ranks route the same tokens: not summed over; each
pipeline rank updates its own layers), so every replica of a layer moves its bias alike.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.models.deepseek_moe import DeepSeekMoE

__all__ = ["update_router_biases"]


def update_router_biases(
    modules: Iterable[nn.Module], group: dist.ProcessGroup | None, *, apply: bool = True
) -> None:
    """Take every DeepSeek router's load since the last call, sum it over `group` and update
    its bias (`apply=False`: a skipped step, the loads only dropped). A no-op without a router
    that updates (bias_rate 0, softmax routing)."""
    layers = [
        m
        for mod in modules
        for m in mod.modules()
        if isinstance(m, DeepSeekMoE) and m.expert_bias is not None and m.bias_rate > 0
    ]
    if not layers:
        return
    loads = torch.stack([m.take_load() for m in layers])  # (layers, E) int64
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(loads, group=group)
    if apply:
        for m, load in zip(layers, loads, strict=True):
            m.update_expert_bias(load)
