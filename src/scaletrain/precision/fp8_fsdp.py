"""Float8 all-gather for FSDP2: the weights of fp8 Linears travel in E4M3, half of bf16's bytes.

FSDP2 lets a parameter's local shard decide what it all-gathers (`fsdp_pre_all_gather`) and how
the gathered pieces become the unsharded parameter (`fsdp_post_all_gather`). `Fp8GatherWeight`
wraps a Float8Linear's fp32 master shard so that

- before the all-gather, the shard is quantized to E4M3 with ONE per-tensor scale: the amax of
  the whole weight (the max over the shards, one all-reduce MAX of a scalar over the shard
  group), exactly the scale the Linear's own tensorwise quantization of the full weight uses;
- the all-gather moves the E4M3 bytes (as uint8: gloo and NCCL both carry them);
- after it, the weight is dequantized into the compute dtype (bf16). The Float8Linear then
  quantizes that tensor again with its own amax; the values are the E4M3 grid times the scale,
  and bf16 keeps 8 significant bits against E4M3's 4, so the second quantization lands on the
  same E4M3 codes (the test checks the output against the bf16-gather path).

Only the all-gather changes: the unsharded weight is still bf16 in memory (no saving there;
the gathered E4M3 bytes are freed as soon as they are dequantized),
gradients are reduce-scattered as before, and everything else — optimizer, clipping,
checkpoints — sees the fp32 shard: every other op unwraps the subclass and runs on the plain
tensor inside (views and copies that FSDP and materialization make of the shard keep the
wrapper, so the hooks survive sharding, padding and `to_empty`).

Scope: tensorwise scaling (a tile-wise weight would need its 128x128 block scales gathered
too) and 1-D FSDP meshes without tensor parallelism (a TP-sharded weight is a DTensor already).
The same recipe as torchao's `enable_fsdp_float8_all_gather`, written for scaletrain's
Float8Linear.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch import nn

from .scaling import _EPS, E4M3, fp8_max

__all__ = ["Fp8GatherWeight", "enable_fp8_all_gather", "precompute_fp8_scales"]

_aten = torch.ops.aten
# ops whose result is (a view or copy of) the same weight: the result keeps the wrapper, so the
# FSDP hooks survive sharding (split/view), padding (new_zeros + copy_) and materialization
_KEEP = {
    _aten.detach.default,
    _aten.alias.default,
    _aten.view.default,
    _aten.as_strided.default,
    _aten.slice.Tensor,
    _aten.split.Tensor,
    _aten.split_with_sizes.default,
    _aten.chunk.default,
    _aten.narrow.default,
    _aten.clone.default,
    _aten.empty_like.default,
    _aten.new_zeros.default,
    _aten.new_empty.default,
    _aten._to_copy.default,
    _aten.copy_.default,
    _aten._pin_memory.default,
}


class Fp8GatherWeight(torch.Tensor):
    """A high-precision weight (shard) whose FSDP2 all-gather runs in float8 (module doc)."""

    _data: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> Fp8GatherWeight:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            data.size(),
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=data.dtype,
            layout=data.layout,
            device=data.device,
            requires_grad=data.requires_grad,
        )

    def __init__(self, data: torch.Tensor) -> None:
        self._data = data
        # bumped by every mutating op through the wrapper (the optimizer step, a checkpoint
        # load): the inner tensor's own version counter does not see ops below autograd
        self._generation = 0
        # (whole-weight amax, the generation it was computed at): `precompute_fp8_scales`
        self._amax: tuple[torch.Tensor, int] | None = None

    def __repr__(self) -> str:  # type: ignore[override]  # no tensor_contents: the wrapped one's
        return f"Fp8GatherWeight({self._data!r})"

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:  # torch types it as a plain function
        unwrap = lambda t: t._data
        out = func(
            *pytree.tree_map_only(cls, unwrap, args),
            **pytree.tree_map_only(cls, unwrap, kwargs or {}),
        )
        if func._schema.is_mutable:  # conservatively: any wrapper an in-place op touched
            for t in pytree.tree_leaves((args, kwargs or {})):
                if isinstance(t, cls):
                    t._generation += 1
        if func not in _KEEP:
            return out
        return pytree.tree_map_only(torch.Tensor, cls, out)

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_data"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], _meta: Any, _size: Any, _stride: Any
    ) -> Fp8GatherWeight:
        return Fp8GatherWeight(inner["_data"])

    # --- FSDP2 all-gather extension ------------------------------------------------------
    @torch.no_grad()
    def fsdp_pre_all_gather(
        self,
        mesh: Any,
        outer_size: Any = None,
        outer_stride: Any = None,
        module: Any = None,
        mp_policy: Any = None,
    ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        shard = self._data
        if self._amax is not None and self._amax[1] == self._generation:
            amax = self._amax[0]  # precomputed for this step, and the weight has not moved
        else:
            # the whole weight's amax: the scale the Linear's own tensorwise quantization uses
            amax = _local_amax(shard)
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=mesh.get_group())
        fmax = fp8_max(E4M3)
        scale = amax.clamp(min=_EPS) / fmax
        data = (shard.float() / scale).clamp_(-fmax, fmax).to(E4M3)
        return (data.view(torch.uint8),), (scale,)

    @torch.no_grad()
    def fsdp_post_all_gather(
        self,
        all_gather_outputs: tuple[torch.Tensor, ...],
        metadata: tuple[torch.Tensor, ...],
        param_dtype: torch.dtype,
        *,
        out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None:
        (data,), (scale,) = all_gather_outputs, metadata
        weight = data.view(E4M3).to(param_dtype).mul_(scale)  # one 16-bit copy, no fp32
        # the E4M3 bytes are dead once dequantized: free them now (FSDP re-allocates the
        # storage before the next all-gather; freeing an empty storage again is a no-op), so
        # a gathered unit holds what the bf16 gather holds, its 16-bit weights
        data.untyped_storage().resize_(0)
        if out is not None:
            # FSDP re-gathers into the unsharded parameter it already made (backward of a
            # resharded unit): refill it in place without bumping its version counter, as
            # FSDP's own all-gather does (autograd saved it in forward; the values are the
            # same weight, re-gathered)
            with torch.autograd._unsafe_preserve_version_counter(out):
                out.copy_(weight)
            return None
        return weight, ()


def enable_fp8_all_gather(model: nn.Module) -> list[str]:
    """Wrap the weight of every tensorwise Float8Linear of `model` in `Fp8GatherWeight` (in
    place, before `fully_shard`); returns the module names. Works on a meta model."""
    from .fp8 import Float8Linear

    names = []
    for fqn, mod in model.named_modules():
        if not isinstance(mod, Float8Linear) or mod.fp8_state.scaling != "tensorwise":
            continue
        w = mod.weight
        if isinstance(w.data, Fp8GatherWeight):
            continue
        mod.weight = nn.Parameter(Fp8GatherWeight(w.data), requires_grad=w.requires_grad)
        mod.register_state_dict_post_hook(_plain_weight_in_state_dict)
        names.append(fqn)
    return names


def _local_amax(shard: torch.Tensor) -> torch.Tensor:
    return (
        shard.detach().abs().amax().float()
        if shard.numel()
        else torch.zeros((), dtype=torch.float32, device=shard.device)
    )


@torch.no_grad()
def precompute_fp8_scales(model: nn.Module) -> int:
    """Every wrapped weight's whole-weight amax in ONE all-reduce (MAX) over the shard group,
    instead of one per weight and all-gather (2 per unit and micro-batch under ZeRO-3). Call
    it once per step, before forward: the weights move only at the optimizer step, and a
    weight changed since (its `_generation` moved) falls back to its own all-reduce.
    Returns the number of weights."""
    from torch.distributed.tensor import DTensor

    weights = [
        p
        for p in model.parameters()
        if isinstance(p, DTensor) and isinstance(p._local_tensor, Fp8GatherWeight)
    ]
    if not weights:
        return 0
    # the shard dimension of the FSDP mesh (HSDP replicas hold the same shards)
    mesh, placements = weights[0].device_mesh, weights[0].placements
    dim = max(i for i, pl in enumerate(placements) if pl.is_shard())
    locals_ = [cast(Fp8GatherWeight, w._local_tensor) for w in weights]  # filtered above
    amax = torch.stack([_local_amax(t._data) for t in locals_])
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=mesh.get_group(dim))
    for t, a in zip(locals_, amax, strict=True):
        t._amax = (a, t._generation)
    return len(weights)


def _plain(t: Any) -> Any:
    """The plain tensor behind a (DTensor of a) Fp8GatherWeight, sharing its storage."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor) and isinstance(t._local_tensor, Fp8GatherWeight):
        return DTensor.from_local(
            t._local_tensor._data,
            t.device_mesh,
            t.placements,
            run_check=False,
            shape=t.shape,
            stride=t.stride(),
        )
    return t._data if isinstance(t, Fp8GatherWeight) else t


def _plain_weight_in_state_dict(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, _local_metadata: Any
) -> None:
    """Checkpoints hold the fp32 shard itself, not the wrapper (which DCP would pickle, and
    scaletrain's loader refuses to unpickle); loading writes through the shared storage."""
    key = prefix + "weight"
    if key in state_dict:
        state_dict[key] = _plain(state_dict[key])
