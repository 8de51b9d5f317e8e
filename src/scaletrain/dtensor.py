"""The DTensor conversions the trainer, the dry-run, the precision code and the meters share.

Parameters, gradients, optimizer states and losses are DTensors under FSDP2, tensor parallelism
and expert parallelism, and plain tensors otherwise; code that handles both goes through these
functions instead of testing `hasattr(t, "to_local")` at each site. Importing this module does not
import `torch.distributed` (the single-process path never loads it): a DTensor can only exist once
`torch.distributed.tensor` has been imported, so the check looks there.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeGuard

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["is_dtensor", "to_local", "to_full", "local_bytes"]


def is_dtensor(t: object) -> TypeGuard[DTensor]:
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def to_local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (what occupies this rank's memory); a plain tensor as is.

    Local: no communication."""
    return t.to_local() if is_dtensor(t) else t


def local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank stores for `t`: a DTensor's local shard; for a wrapper tensor subclass
    (torchao's 8-bit optimizer states: uint8 codes, fp32 block scales, a code map; an NF4
    weight, a Parameter whose type is NF4Tensor) the plain tensors it holds, not numel x its
    nominal dtype's size. Local: no communication."""
    t = to_local(t)
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        flatten = getattr(t, "__tensor_flatten__", None)
        if flatten is not None:
            inner, _ = flatten()
            return sum(local_bytes(getattr(t, name)) for name in inner)
    return t.numel() * t.element_size()


def to_full(t: torch.Tensor) -> torch.Tensor:
    """The whole value of a DTensor, gathered over its mesh; a plain tensor as is.

    Collective for a sharded DTensor: every rank of its mesh must call it."""
    return t.full_tensor() if is_dtensor(t) else t
