"""DDP (ZeRO-0) and the gradient-accumulation switch shared by every data-parallel mode.

DDP is torch's composable `replicate` (the DistributedDataParallel reducer: gradients grouped
into ~25 MiB buckets, each bucket all-reduced as soon as its last gradient is ready, so
communication overlaps the rest of backward). It is applied to a *meta* model: `replicate`
builds its reducer lazily at the first forward, after the trainer has materialized the weights
(rank-independent init, so the reducer's initial broadcast changes nothing).

DDP over tensor-parallel (DTensor) parameters: torch's DDP / `replicate` turn DTensors back
into plain tensors, so with tp > 1 (and with expert-parallel experts) data parallelism is
`apply_manual_grad_sync`: one flat all-reduce of the gradients' local shards over dp x cp,
after accumulation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate import DDP, replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

__all__ = ["apply_ddp", "apply_manual_grad_sync", "is_expert", "sync_gradients", "maybe_no_sync"]


def apply_ddp(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    bucket_cap_mb: float = 25.0,
    compression: str = "none",
    powersgd_rank: int = 2,
    powersgd_start_step: int = 10,
    init_sync: bool = True,
) -> nn.Module:
    """All-reduce (average) gradients over `mesh` (1-D: the dp x cp ranks); in place.

    init_sync=False skips DDP's start-up broadcast of every parameter from rank 0 (and its
    shape check): that broadcast flattens the parameters into one buffer, which an NF4 weight
    (a tensor subclass of codes and scales) is not, and corrupts it. The trainer's weights
    are identical on every rank by construction (rank-independent initialization; every rank
    reads the same files), so the broadcast only re-checks what construction guarantees.

    compression='powersgd' replaces each bucket's all-reduce by PowerSGD (Vogels et al. 2019):
    rank-r factors P, Q of every gradient matrix are all-reduced instead of the matrix, with
    error feedback (the compression residual is added to the next step's gradient). Traffic per
    n x m matrix drops from n*m to r*(n+m) elements; the first `powersgd_start_step` steps use
    plain all-reduce (its warm-up). torch's `powerSGD_hook` does the work.
    """
    replicate(model, device_mesh=mesh, bucket_cap_mb=bucket_cap_mb, init_sync=init_sync)
    assert isinstance(model, DDP)  # replicate swaps the class in place (DDP<cls>)
    if compression == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        state = psgd.PowerSGDState(
            process_group=mesh.get_group(),
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=powersgd_start_step,
            use_error_feedback=True,
            warm_start=True,
        )
        model.register_comm_hook(state, psgd.powerSGD_hook)
    return model


_SYNC_ATTR = "_scaletrain_grad_sync_meshes"


def is_expert(t: torch.Tensor) -> bool:
    """An expert-parallel parameter or gradient: a DTensor on the "ep" mesh."""
    return isinstance(t, DTensor) and "ep" in (t.device_mesh.mesh_dim_names or ())


def apply_manual_grad_sync(
    model: nn.Module, mesh: DeviceMesh, *, experts: bool = False
) -> nn.Module:
    """Data parallelism for models holding DTensor parameters: tensor-parallel shards (tp > 1)
    and / or expert-parallel experts (ep > 1).

    `replicate` would turn DTensors into plain tensors and hide them from the optimizer's state
    dict, so instead `sync_gradients` all-reduces (averages) over `mesh` (dp x cp) once per
    step, after accumulation: plain gradients as they are, tensor-parallel ones through their
    local shards. The dp x cp ranks of one tp rank hold the same shard of each parameter with
    the same placement (Shard, Replicate, or Partial under SP), and averaging is linear, so
    averaging local shards is averaging the DTensors. Expert gradients (DTensors on the "ep"
    mesh) are distinct on every rank and already scaled to the data-parallel mean by the EP
    layer: left alone by this mesh. With `experts=True` the call sets the other half instead:
    the expert gradients alone are averaged over `mesh`, the ep_replicate ranks holding the same
    experts (ep < dp x cp; FSDP, which ignores the experts, sets only this half). Not
    overlapped with backward: the price of correctness here (DDP's buckets would overlap it).
    """
    meshes = dict(getattr(model, _SYNC_ATTR, {}))
    meshes[experts] = mesh
    setattr(model, _SYNC_ATTR, meshes)
    return model


def _synced_grads(module: nn.Module, experts: bool) -> list[torch.Tensor]:
    """The gradients (local shards) `sync_gradients` averages for `module`: the expert-parallel
    ones (`experts`), or all the others."""
    out = []
    for p in module.parameters():
        g = p.grad
        if g is None or is_expert(g) != experts:
            continue
        if isinstance(g, DTensor):
            g = g._local_tensor  # the storage itself (to_local() may be a view)
        out.append(g)
    return out


def sync_gradients(model: nn.Module) -> None:
    """Average gradients over the mesh set by `apply_manual_grad_sync` on `model` or any of
    its submodules (pipeline stages); a no-op where none was set."""
    for module in model.modules():
        for experts, mesh in getattr(module, _SYNC_ATTR, {}).items():
            _average(_synced_grads(module, experts), mesh)


def _average(grads: list[torch.Tensor], mesh: DeviceMesh) -> None:
    if mesh.size() == 1:
        return
    for bucket in _buckets(grads):
        flat = torch._utils._flatten_dense_tensors(bucket)  # one collective per bucket
        dist.all_reduce(flat, group=mesh.get_group())
        flat /= mesh.size()
        for g, synced in zip(
            bucket, torch._utils._unflatten_dense_tensors(flat, bucket), strict=True
        ):
            g.copy_(synced)


BUCKET_BYTES = 25 * 2**20
"""Flat all-reduce buffers of at most ~this size (DDP's default bucket): one flat copy of the
whole gradient would cost a transient 4 B/param (11 GB per GPU for GPT-3 175B at tp8 pp8)."""


def _buckets(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive same-dtype groups of about BUCKET_BYTES (a larger tensor alone)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if not out or out[-1][0].dtype != g.dtype or size + nbytes > BUCKET_BYTES:
            out.append([])
            size = 0
        out[-1].append(g)
        size += nbytes
    return out


@contextmanager
def maybe_no_sync(model: nn.Module, is_last_microbatch: bool) -> Iterator[None]:
    """Wrap one micro-batch's forward *and* backward.

    DDP / ZeRO-1: skip the gradient all-reduce on every micro-batch but the last (gradients
    accumulate locally, one all-reduce per optimizer step; DDP reads the flag at forward time,
    so the forward must be inside the block).

    ZeRO-2/3 (FSDP2): gradients are reduce-scattered on *every* micro-batch on purpose:
    skipping it (`set_requires_gradient_sync(False)`) would keep unsharded fp32 gradients of the
    whole model alive between micro-batches, i.e. give up the memory the stage promises.
    The price is one reduce-scatter per micro-batch instead of per step.

    No data parallelism (degree 1): a no-op.
    """
    from torch.distributed.fsdp import FSDPModule

    # `replicate` (DDP) and FSDP2 both have `set_requires_gradient_sync`; only DDP's is used
    if isinstance(model, DDP) and not isinstance(model, FSDPModule) and not is_last_microbatch:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield
