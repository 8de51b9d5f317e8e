"""Tensor parallelism of LoRA projections (models/lora.py): each adapter split with its base.

A `LoRALinear` W + s B A (W: out x in, A: r x in, B: out x r) under Megatron's split of W
(Shoeybi et al. 2019):

- column-parallel W (wq, wk, wv, w1, w3: rows split, Shard(0)): B is split with W's rows
  (Shard(0)) and A is whole on every rank (Replicate). A x is computed once per rank on the
  replicated input, B_local (A x) gives exactly this rank's output columns, so the adapter
  adds no communication in forward. In backward, the gradient of A x is B_local^T g_local, a
  partial sum over tp: A's gradient and the input's gradient through A are Partial DTensors,
  reduced by DTensor where they meet Replicate (A's with the optimizer's update; the input's
  with the base projection's own partial input gradient, at the block boundary).
- row-parallel W (wo, w2: columns split, Shard(1)): A is split with W's columns (Shard(1)) and
  B is whole (Replicate). A_local x_local is a partial sum of the r-wide A x, B of it a partial
  sum of the adapter's output, added to W_local x_local (itself partial) before the one
  all-reduce (or, with sp, reduce-scatter) the row-parallel output takes anyway: again no
  extra communication in forward; B's gradient is (partial A x)^T g with g replicated, Partial.

Why split rather than keep both adapters whole on every rank: whole adapters would need, on
a row-parallel projection, the whole (all-gathered) input, a (B, T, in) activation per
projection; on a column-parallel one, a (B, T, out) product per rank of which 1/tp is kept
and an all-reduce of B's gradient. Split as above, only the r-wide half of each adapter runs
whole on every rank (A x on a column-parallel projection, B on a row-parallel one) and the
forward adds no collective. It is the split of PEFT's own LoRA layer for Megatron's
tensor-parallel linears (`peft/tuners/lora/tp_layer.py`, `LoraParallelLinear`: lora_A split
on a RowParallelLinear, lora_B on a ColumnParallelLinear). The parameter names and global
shapes are the single-device ones, so `models.init` draws the same values, checkpoints
reshard, and the PEFT export gathers whole adapters (`full_tensor`).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from scaletrain.models.lora import LoRALinear

__all__ = ["LoraColwiseParallel", "LoraRowwiseParallel", "lora_tp_styles"]


def _distribute(module: nn.Module, name: str, mesh: DeviceMesh, placement: Placement) -> None:
    """Replace `module.name` (a parameter, possibly None) by its DTensor with `placement`."""
    param = getattr(module, name, None)
    if param is None:
        return
    dt = distribute_tensor(param, mesh, [placement], src_data_rank=None)
    module.register_parameter(name, nn.Parameter(dt, requires_grad=param.requires_grad))


def _partition(
    name: str,
    module: nn.Module,
    mesh: DeviceMesh,
    *,
    weight: Placement,
    bias: Placement,
    lora_a: Placement,
    lora_b: Placement,
) -> None:
    """`distribute_module`'s partition function: called for the LoRALinear ("") and each
    submodule ("lora_A", "lora_B", "lora_dropout"), each placing its own parameters."""
    if name == "":
        _distribute(module, "weight", mesh, weight)
        _distribute(module, "bias", mesh, bias)
    elif name == "lora_A":
        _distribute(module, "weight", mesh, lora_a)
    elif name == "lora_B":
        _distribute(module, "weight", mesh, lora_b)


class LoraColwiseParallel(ColwiseParallel):
    """`ColwiseParallel` for a `LoRALinear`: W and its bias Shard(0), B Shard(0), A Replicate
    (module docstring); inputs and outputs as `ColwiseParallel`'s."""

    def _partition_linear_fn(self, name: str, module: nn.Module, device_mesh: DeviceMesh):
        _partition(
            name,
            module,
            device_mesh,
            weight=Shard(0),
            bias=Shard(0),
            lora_a=Replicate(),
            lora_b=Shard(0),
        )


class LoraRowwiseParallel(RowwiseParallel):
    """`RowwiseParallel` for a `LoRALinear`: W Shard(1), its bias Replicate, A Shard(1), B
    Replicate (module docstring); inputs and outputs as `RowwiseParallel`'s."""

    def _partition_linear_fn(self, name: str, module: nn.Module, device_mesh: DeviceMesh):
        _partition(
            name,
            module,
            device_mesh,
            weight=Shard(1),
            bias=Replicate(),
            lora_a=Shard(1),
            lora_b=Replicate(),
        )


def lora_tp_styles(block: nn.Module, plan: dict) -> dict:
    """`plan` (a block's, names relative to the block) with the style of every projection that
    is a `LoRALinear` replaced by its LoRA counterpart, same inputs and outputs."""
    out = dict(plan)
    for path, style in plan.items():
        if not isinstance(block.get_submodule(path), LoRALinear):
            continue
        if type(style) is ColwiseParallel:
            lora_style: ColwiseParallel | RowwiseParallel = LoraColwiseParallel()
        elif type(style) is RowwiseParallel:
            lora_style = LoraRowwiseParallel()
        else:  # only the seven dense projections carry adapters (config.lora)
            raise AssertionError(f"{path}: no LoRA split for {type(style).__name__}")
        # the same input/output layouts as the plain style (e.g. wo's Shard(1) output with sp)
        lora_style.__dict__.update(style.__dict__)
        out[path] = lora_style
    return out
