"""Optimizer-side pieces of ZeRO: the sharded optimizer for stage 1, clipping, memory counting.

Stage 1 is torch's `ZeroRedundancyOptimizer` over DDP: each rank owns the Adam states of a
subset of whole parameters (greedy partition by size), steps only those, then broadcasts the
updated parameters. Why not FSDP2 for stage 1: FSDP2 always reduce-scatters gradients, so it
cannot keep full gradients while sharding only the optimizer; ZeRO-1 over DDP keeps DDP's
bucketed all-reduce and shards exactly the optimizer states (8*Psi/N bytes per rank for fp32
Adam, up to the imbalance of whole-parameter partitioning).

With tensor parallelism the parameters are DTensors, which `ZeroRedundancyOptimizer`'s
broadcast cannot send: `_LocalShardZero` broadcasts their local shards instead. Every dp x cp
rank of one tp rank holds the same shards, and all of them partition the same parameter list
(by global size) alike, so each rank owns the Adam states of whole tp shards and the owner's
updated shard overwrites the others': Megatron's distributed optimizer over TP, except that
ownership is per parameter rather than per flat buffer slice.

With expert parallelism the experts' shards differ between the ep ranks of a ZeRO group, so an
owner's broadcast over the whole group would overwrite other ranks' experts. `_LocalShardZero`
therefore partitions the experts over the ep_replicate index only: the ZeRO group's rank
i = j*ep + e (j: replica index, e: ep rank; `ParallelDims`' ep mesh) holds expert shard e, an
expert parameter assigned to replica j is owned by every rank (j, *) (each steps its own
shard), and the owner (j, e) broadcasts it over the ep_replicate group of the ranks (*, e) that
hold the same shard. Experts' Adam states are thus split dp*cp/ep ways, dense ones dp*cp ways.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import ParamsT

from scaletrain.dtensor import local_bytes, to_full, to_local

from ..numerics import upcast
from .data_parallel import is_expert
from .dims import ParallelDims

__all__ = [
    "wrap_optimizer",
    "clip_grad_norm_",
    "local_state_bytes",
    "zero1_local_state",
    "load_zero1_local_state",
]


class _LocalShardZero(ZeroRedundancyOptimizer):
    """torch's ZeRO-1 whose post-step broadcast also sends DTensor parameters (their local
    shards, in place); plain parameters go exactly as in the base class. Expert-parallel
    parameters are partitioned and broadcast over their replicas (module docstring):
    `ep` is the expert-parallel degree, `expert_group` the ep_replicate group."""

    def __init__(
        self,
        params: ParamsT,
        *,
        ep: int = 1,
        expert_group: dist.ProcessGroup | None = None,
        **kw: Any,
    ) -> None:
        # set before the base class partitions the parameters (in its __init__)
        self._ep, self._expert_group = ep, expert_group
        super().__init__(params, **kw)

    def _partition_parameters(
        self, params_per_rank: list[list[torch.Tensor]] | None = None
    ) -> list[list[dict]]:
        # torch's stub (zero_redundancy_optimizer.pyi) leaves out the private partition helpers
        zero: Any = self
        base: Any = super()
        has_experts = any(is_expert(p) for g in self.param_groups for p in g["params"])
        if params_per_rank is not None or not has_experts or zero._partition_parameters_cache:
            return base._partition_parameters(params_per_rank)
        ep, n = self._ep, self.world_size
        if n % ep:
            raise ValueError(f"ZeRO-1 group of {n} ranks is not a multiple of ep={ep}")
        zero._partition_parameters_cache = [[] for _ in range(n)]
        sizes = [0] * n
        for group in self.param_groups:
            per_rank: list[list[torch.Tensor]] = [[] for _ in range(n)]
            # the base class's greedy rule (largest first, to the least-loaded owner), with an
            # expert going to the replica index j whose ranks (j, *) hold least
            for p in sorted(group["params"], key=lambda t: t.numel(), reverse=True):
                if is_expert(p):
                    j = min(range(n // ep), key=lambda j: sum(sizes[j * ep : (j + 1) * ep]))
                    owners = range(j * ep, (j + 1) * ep)
                else:
                    least = zero._get_min_index(sizes)
                    owners = range(least, least + 1)
                for r in owners:
                    per_rank[r].append(p)
                    sizes[r] += p.numel()
            zero._partition_param_group(group, per_rank)
        return zero._partition_parameters_cache

    def _broadcast_params_from_rank(self, rank: int) -> list:
        src = dist.distributed_c10d.get_global_rank(self.process_group, rank)
        handles = []
        for group in self._partition_parameters()[rank]:
            for p in group["params"]:
                if not is_expert(p):
                    handles.append(
                        dist.broadcast(
                            to_local(p.data), src=src, group=self.process_group, async_op=True
                        )
                    )
                elif (
                    rank % self._ep == self.rank % self._ep
                    and self._expert_group is not None
                    and dist.get_world_size(self._expert_group) > 1
                ):
                    # the ranks holding this rank's expert shards receive the owner's update
                    handles.append(
                        dist.broadcast(
                            to_local(p.data), src=src, group=self._expert_group, async_op=True
                        )
                    )
        return handles


def zero1_local_state(optimizer: ZeroRedundancyOptimizer) -> dict[str, Any]:
    """This rank's ZeRO-1 partition as plain tensors (tensor-parallel states as their local
    shards), so that checkpoints load it with `torch.load(weights_only=True)`."""
    sd = optimizer.optim.state_dict()
    sd["state"] = {
        i: {k: to_local(v) if isinstance(v, torch.Tensor) else v for k, v in st.items()}
        for i, st in sd["state"].items()
    }
    return sd


def load_zero1_local_state(optimizer: ZeroRedundancyOptimizer, sd: dict[str, Any]) -> None:
    """Inverse of `zero1_local_state`: local shards wrapped back as DTensors like their
    parameters (AdamW's foreach kernels need states and parameters of one kind)."""
    params = [p for g in optimizer.optim.param_groups for p in g["params"]]
    for i, st in sd["state"].items():
        p = params[i]
        if not isinstance(p, DTensor):
            continue
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.shape == p.to_local().shape and v.dim():
                st[k] = DTensor.from_local(v, p.device_mesh, p.placements, run_check=False)
    optimizer.optim.load_state_dict(sd)


def wrap_optimizer(
    optimizer_class: type[torch.optim.Optimizer],
    params: ParamsT,
    dims: ParallelDims,
    **defaults: Any,
) -> torch.optim.Optimizer:
    """The optimizer for `dims`: ZeRO-1 shards its states over dp_shard x cp, else plain.

    For ZeRO-2/3 the parameters are already FSDP shards, so a plain optimizer holds sharded
    states. Call after `materialize`. `params`: parameters or parameter groups, listed by the
    optimizer's own constructor.
    """
    if dims.zero == 1 and dims.ddp_enabled:
        group = dims.submesh("dp_shard_cp").get_group()
        experts = dims.submesh("ep_replicate").get_group() if dims.ep > 1 else None
        return _LocalShardZero(
            params,
            optimizer_class=optimizer_class,
            process_group=group,
            ep=dims.ep,
            expert_group=experts,
            **defaults,
        )
    return optimizer_class(params, **defaults)


@torch.no_grad()
def clip_grad_norm_(
    params: Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    *,
    extra_group: dist.ProcessGroup | None = None,
    norm_exclude: Iterable[torch.Tensor] = (),
) -> torch.Tensor:
    """Clip gradients to `max_norm` in total `norm_type`-norm; return the total norm (pre-clip).

    The norm equals the single-process one whatever the sharding: gradients are grouped by
    device mesh (FSDP+TP mixes 1-D and 2-D meshes, which torch's clip cannot stack), each
    group's norm is reduced over its mesh by DTensor, and the groups combine as a p-norm.
    `extra_group` sums the result over ranks holding *different* parameters that no mesh
    covers (pipeline stages). Plain tensors (DDP, ZeRO-1: full gradients) need no reduction.
    `norm_exclude`: parameters scaled but not counted (a second copy of a tied weight).
    """
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    skip = {id(p) for p in norm_exclude}
    groups: dict[Any, list[torch.Tensor]] = {}
    for g in (p.grad for p in params if p.grad is not None and id(p) not in skip):
        key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else None
        groups.setdefault(key, []).append(g)
    norms = []
    for grp in groups.values():
        n = torch.nn.utils.get_total_norm(grp, norm_type)
        norms.append(upcast(to_full(n)))
    stacked = torch.stack(norms) if norms else torch.zeros(1)
    if math.isinf(norm_type):
        total = stacked.max()
        if extra_group is not None:
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=extra_group)
    else:
        total_p = (stacked**norm_type).sum()
        if extra_group is not None:
            dist.all_reduce(total_p, group=extra_group)
        total = total_p ** (1.0 / norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    # Scaling is linear, so scaling each local shard (Shard, Replicate or Partial) is exact;
    # one foreach kernel per (device, dtype) instead of a multiply per gradient.
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        local = to_local(g)
        by_kind.setdefault((local.device, local.dtype), []).append(local)
    for (device, dtype), locals_ in by_kind.items():
        torch._foreach_mul_(locals_, coef.to(device, dtype))
    return total


def local_state_bytes(
    model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, int]:
    """Bytes this rank stores for parameters, gradients and optimizer states right now.

    Counts the local storage of each tensor (a DTensor's local shard; an 8-bit state's codes
    and scales, `local_bytes`), so on CPU it is exact for the training state; buffers,
    activations and communication buffers are not counted.
    """

    params = list(model.parameters())
    out = {
        "params": sum(local_bytes(p) for p in params),
        "grads": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": 0,
    }
    if optimizer is not None:
        inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local part
        for state in inner.state.values():
            out["optimizer"] += sum(
                local_bytes(v)
                for v in state.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0
            )
    return out
