"""Expert parallelism: experts split over the ep group, tokens moved with all_to_all.

`MoE.forward` routes and sorts the (token, expert) pairs by expert and calls
`experts(x_sorted, num_tokens_per_expert)`; `apply_ep` replaces only that call's module, so
routing, the combine weights and the load-balancing loss are untouched. Inside:

1. exchange the per-expert counts (all_to_all of E integers), giving every rank the number of
   tokens each source rank sends to each of its local experts;
2. dispatch the tokens with `all_to_all_single` and uneven splits (rank d receives the
   contiguous block of pairs routed to experts d·E/ep … (d+1)·E/ep − 1);
3. regroup the received rows from source-major to local-expert-major, run the local experts,
   undo the regrouping;
4. combine: the reverse all_to_all returns every row to the rank (and slot) it came from.

The all_to_all is an autograd Function whose backward is the reverse all_to_all. Expert
weights become DTensors sharded on the expert dim (Shard(0)) over the ep mesh, so
`materialize` draws the same values as the single-device model and checkpoints / norms see
the global tensor. The ep ranks are data-parallel ranks (config/layout.py: ep divides dp·cp):
each rank's loss is a mean over its own tokens, and the global loss is the mean over ranks, so
an expert shard, which receives gradient from all ep ranks' losses, scales its weight
gradient by 1/ep; with ep < dp·cp the dp·cp/ep ranks holding the same shard (the
"ep_replicate" mesh) average it (`data_parallel.sync_gradients`, set up by `parallelize`),
which completes the mean over all dp·cp ranks.

Step 1 is skipped where the counts are host ints every rank shares (a list, not a tensor):
under fake tensors (the dry-run), which have no values to exchange, the balanced-router
assumption of `scaletrain.models.moe` (every rank sends N·k/E rows per expert, or
min(N·k/E, C) with an expert capacity), and with `model.moe_pad_to_capacity`, where every rank
sends exactly C rows per expert (`models.moe_dispatch`): the splits are then computed locally,
with no count all_to_all and no host sync. Both rest on every rank routing the same number of
tokens per forward, which the trainer's equal micro-batches give. The capacity itself is each
source rank's own: it caps the tokens that rank routes (Megatron-Core's per-rank capacity
under its all-to-all dispatcher).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from scaletrain.models.moe import (
    EXPERT_WEIGHTS,
    ExpertWeights,
    GroupedExperts,
    MoE,
    grouped_expert_mlp,
    host_counts,
    is_fake,
)

__all__ = ["ExpertParallelExperts", "all_to_all", "apply_ep"]


def _as_mesh(group_or_mesh) -> DeviceMesh | None:
    if group_or_mesh is None or isinstance(group_or_mesh, DeviceMesh):
        return group_or_mesh
    device = "cuda" if dist.get_backend(group_or_mesh) == "nccl" else "cpu"
    return DeviceMesh.from_group(group_or_mesh, device)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        grad_in = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(grad_in, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return grad_in, None, None, None


def all_to_all(
    x: torch.Tensor,
    out_splits: list[int],
    in_splits: list[int],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Differentiable `all_to_all_single` along dim 0 with uneven splits (rows per rank)."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class ExpertParallelExperts(GroupedExperts):
    """`GroupedExperts` holding experts [ep_rank·E/ep, (ep_rank+1)·E/ep) as Shard(0) DTensors.

    Same parameter names and global shapes as the module it replaces; `forward` takes the
    *global* sorted tokens and counts of this rank, like `GroupedExperts.forward`.
    """

    def __init__(self, experts: GroupedExperts, mesh: DeviceMesh) -> None:
        nn.Module.__init__(self)
        self.mesh, self.group = mesh, mesh.get_group()
        self.ep_size, self.ep_rank = mesh.size(), mesh.get_local_rank()
        self.num_global_experts = experts.num_experts
        self.num_experts = experts.num_experts // self.ep_size
        self.activation = experts.activation
        self.linear = experts.linear  # F.linear, or the fp8 matmul apply_fp8 set
        self.kernel = experts.kernel
        lo = self.ep_rank * self.num_experts
        for name in EXPERT_WEIGHTS:
            p = getattr(experts, name)
            if p is None:
                setattr(self, name, None)
                continue
            local = p.detach()[lo : lo + self.num_experts].clone()
            dt = DTensor.from_local(
                local, mesh, [Shard(0)], run_check=False, shape=p.shape, stride=p.stride()
            )
            setattr(self, name, nn.Parameter(dt, requires_grad=p.requires_grad))

    def _local_weights(self) -> ExpertWeights:
        def local(p: torch.Tensor) -> torch.Tensor:
            assert isinstance(p, DTensor)  # set up so by __init__
            return _ScaleGrad.apply(p.to_local(), 1.0 / self.ep_size)

        return self.weights().map(local)

    def _static_splits(
        self, counts: list[int]
    ) -> tuple[list[int], list[int], list[list[int]], list[list[int]], list[int]]:
        """The count exchange answered locally for host counts every rank shares.

        `counts` are this rank's per-expert rows: the balanced dispatch of fake tensors
        (`models.moe_dispatch.balanced_counts`, capped at C with a capacity) or the padded
        capacity's C per expert; every rank routes the same number of tokens, so every
        source sends this rank what this rank sends itself. Returns send / receive rows per
        rank, block starts and sizes [source][local expert], and rows per local expert.
        """
        ep, el = self.ep_size, self.num_experts
        counts = list(counts)
        send = [sum(counts[d * el : (d + 1) * el]) for d in range(ep)]
        mine = counts[self.ep_rank * el : (self.ep_rank + 1) * el]
        sizes = [list(mine) for _ in range(ep)]
        recv = [sum(mine)] * ep
        return send, recv, _cumulative_starts(sizes), sizes, [n * ep for n in mine]

    def forward(
        self, x_sorted: torch.Tensor, num_tokens_per_expert: torch.Tensor | list[int]
    ) -> torch.Tensor:
        ep, el = self.ep_size, self.num_experts
        if not torch.is_tensor(num_tokens_per_expert) or is_fake(x_sorted):
            send, recv, starts, sizes, per_expert = self._static_splits(
                host_counts(num_tokens_per_expert)
            )
        else:
            counts = torch.as_tensor(num_tokens_per_expert, dtype=torch.int64).cpu()  # (E,)
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.group)  # (ep*El,) by source
            send = counts.view(ep, el).sum(1).tolist()
            recv_se = recv_counts.view(ep, el)  # [source rank, local expert]
            recv = recv_se.sum(1).tolist()
            starts = (torch.cumsum(recv_counts, 0) - recv_counts).view(ep, el).tolist()
            sizes = recv_se.tolist()
            per_expert = recv_se.sum(0).tolist()
        x_recv = all_to_all(x_sorted, recv, send, self.group)  # (sum recv, h), source-major

        # source-major -> local-expert-major row order
        order = [
            torch.arange(starts[s][e], starts[s][e] + sizes[s][e])
            for e in range(el)
            for s in range(ep)
        ]
        perm = torch.cat(order).to(x_sorted.device)  # (sum recv,)
        x_local = x_recv[perm]

        y_local = grouped_expert_mlp(
            x_local,
            per_expert,
            self.activation,
            self._local_weights(),
            linear=self.linear,
            kernel=self.kernel,
        )
        y_local = torch.empty_like(y_local).index_copy(0, perm, y_local)  # source-major again
        return all_to_all(y_local, send, recv, self.group)  # (N*k, h), back in sorted order


def _cumulative_starts(sizes: list[list[int]]) -> list[list[int]]:
    """Row offset of each [source][local expert] block in the source-major receive buffer."""
    out: list[list[int]] = []
    pos = 0
    for row in sizes:
        out.append([])
        for n in row:
            out[-1].append(pos)
            pos += n
    return out


def apply_ep(model: nn.Module, ep_mesh_or_group) -> nn.Module:
    """Shard every MoE layer's experts over the ep mesh/group (in place); degree 1: no-op.

    Works on a meta model (then `materialize` fills each rank's shard with its slice of the
    single-device init) or on a materialized one (each rank keeps its slice).
    """
    mesh = _as_mesh(ep_mesh_or_group)
    if mesh is None or mesh.size() == 1:
        return model
    for m in model.modules():
        if isinstance(m, MoE) and not isinstance(m.experts, ExpertParallelExperts):
            if m.num_experts % mesh.size():
                raise ValueError(
                    f"parallel.ep={mesh.size()} must divide model.num_experts={m.num_experts}"
                )
            m.experts = ExpertParallelExperts(m.experts, mesh)
    return model
