"""ZeRO-2/3 and HSDP with FSDP2 (`fully_shard`): one parameter group per transformer block.

What each mode holds per rank, with N = the shard degree (dp_shard x cp), Psi parameters,
fp32 Adam (Rajbhandari et al. 2020, "ZeRO", sec. 5; FSDP2 is per-parameter dim-0 sharding):

- ZeRO-3 (`reshard_after_forward=True`): parameters, gradients and optimizer states all
  4*Psi/N, 4*Psi/N, 8*Psi/N bytes at rest; during forward/backward one block (plus the next,
  prefetched) is unsharded at a time. Per step: all-gather in forward, again in backward,
  reduce-scatter of gradients.
- ZeRO-2 (`reshard_after_forward=False`): a block's unsharded parameters stay alive from its
  forward to its backward, so the peak holds full parameters (4*Psi) like ZeRO-2; gradients
  are reduce-scattered (4*Psi/N) and optimizer states sharded (8*Psi/N). After backward the
  parameters are resharded (FSDP2 frees them), so *between* steps they are sharded too; the
  next forward all-gathers them once, which is the all-gather ZeRO-2 does after its
  optimizer step: same traffic, lower memory at rest than textbook ZeRO-2.
- HSDP: a 2-D mesh (dp_replicate, dp_shard x cp): sharded as above inside each replica group,
  gradients all-reduced across the groups.

The root module (embeddings, final norm, head) is its own group. With `reshard_after_forward`
given explicitly (True), torch 2.13 reshards the root after its forward too: only the default
(None) keeps the root gathered (`FSDPState._lazy_init`). On a split-backward pipeline (zero-bubble,
DualPipeV) ZeRO-3 runs without reshard after forward (`config.fsdp_reshard_after_forward`: torch's
weight pass finds the weights through the stage's registered parameters, which a reshard swaps
for the sharded ones), so there it holds what ZeRO-2 holds.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor, Shard

from scaletrain.config import PRECISION_TABLE, ConfigError
from scaletrain.config.precision import REDUCE_DTYPES
from scaletrain.models.transformer import Transformer

__all__ = ["apply_fsdp", "mp_policy"]


def mp_policy(dtype: str, reduce_dtype: str) -> MixedPrecisionPolicy:
    """FSDP2 mixed precision from `precision.dtype` / `precision.reduce_dtype`.

    Parameters are all-gathered and computed in `dtype` (fp8 runs its non-float8 ops in bf16)
    while the sharded master copy stays fp32; gradients are reduced in `reduce_dtype`.
    fp32 compute means no casting at all.
    """
    if dtype not in PRECISION_TABLE:
        raise ConfigError("precision.dtype", dtype, f"choose one of {', '.join(PRECISION_TABLE)}")
    spec = PRECISION_TABLE[dtype]
    if not spec.mixed:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(
        param_dtype=getattr(torch, spec.compute),
        reduce_dtype=getattr(torch, REDUCE_DTYPES[reduce_dtype]),
    )


def _shard_placement(param: nn.Parameter) -> Shard | None:
    """FSDP2 shards on dim 0 (None); a stack of one (1, f, h) - DeepSeekMoE's shared experts
    held as a one-expert `GroupedExperts` - on its first other dim that tensor parallelism
    does not split: on dim 0 every rank would hold the whole stack (padded), unsharded
    (dry-run, tiny-deepseek dp2 z3: +5% parameters)."""
    if param.dim() < 2 or param.shape[0] != 1:
        return None
    taken = (
        {p.dim for p in param.placements if isinstance(p, Shard)}
        if isinstance(param, DTensor)
        else set()
    )
    return Shard(next(d for d in range(1, param.dim()) if d not in taken))


def apply_fsdp(
    model: Transformer,
    mesh: DeviceMesh,
    *,
    reshard_after_forward: bool,
    mp: MixedPrecisionPolicy | None = None,
    offload_params: bool = False,
    prefetch: bool = True,
    ignored_params: set[nn.Parameter] | None = None,
) -> Transformer:
    """Shard `model` in place: each block of `model.layers`, then the root.

    mesh: 1-D (dp_shard x cp) for ZeRO-2/3, 2-D (dp_replicate, dp_shard x cp) for HSDP.
    offload_params: keep sharded parameters, gradients and optimizer states in CPU memory
    (`CPUOffloadPolicy`); the optimizer step then runs on the CPU.
    prefetch: while block i computes, all-gather block i+1 in forward and block i-1 in
    backward (explicit prefetch; FSDP2's implicit one only overlaps with the current block).
    ignored_params: left alone (expert-parallel experts, already split over the dp ranks).
    """
    # Pinned host memory speeds up host<->device copies but needs an accelerator to exist.
    offload = (
        CPUOffloadPolicy(pin_memory=torch.accelerator.is_available())
        if offload_params
        else OffloadPolicy()
    )
    kw: dict = {
        "mesh": mesh,
        "mp_policy": mp or MixedPrecisionPolicy(),
        "offload_policy": offload,
        "ignored_params": ignored_params or None,
        "shard_placement_fn": _shard_placement,
    }
    # each block (a TransformerBlock, or its AC wrapper) in place; fully_shard returns it
    fsdp_blocks = [
        fully_shard(block, reshard_after_forward=reshard_after_forward, **kw)
        for block in model.layers.values()
    ]
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kw)
    if prefetch and len(fsdp_blocks) > 1:
        for i, block in enumerate(fsdp_blocks):
            if i + 1 < len(fsdp_blocks):
                block.set_modules_to_forward_prefetch([fsdp_blocks[i + 1]])
            if i > 0:
                block.set_modules_to_backward_prefetch([fsdp_blocks[i - 1]])
    return model
