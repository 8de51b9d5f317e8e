"""The two DTensor conversions the trainer, the dry-run and the meters share.

Parameters, gradients, optimizer states and losses are DTensors under FSDP2, tensor parallelism
and expert parallelism, and plain tensors otherwise; code that handles both goes through these
two functions instead of testing `hasattr(t, "to_local")` at each site.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

__all__ = ["to_local", "to_full"]


def to_local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (what occupies this rank's memory); a plain tensor as is.

    Local: no communication."""
    return t.to_local() if isinstance(t, DTensor) else t


def to_full(t: torch.Tensor) -> torch.Tensor:
    """The whole value of a DTensor, gathered over its mesh; a plain tensor as is.

    Collective for a sharded DTensor: every rank of its mesh must call it."""
    return t.full_tensor() if isinstance(t, DTensor) else t
