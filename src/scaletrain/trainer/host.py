"""Reading a value back to the host, with or without values behind the tensor.

Under fake tensors (the dry-run) a tensor has a shape and a dtype but no value, so `.item()`
raises. The step reads three values on the host (the logged loss, the gradient norm, the fp16
overflow flag); each goes through `host_float`, which answers for a fake tensor with what a
healthy step would read, so the dry-run runs the trainer's step unchanged.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import is_fake

__all__ = ["host_float"]


def host_float(t: torch.Tensor | float, *, unknown: float) -> float:
    """`t` as a Python float; `unknown` when `t` is a fake tensor."""
    if isinstance(t, torch.Tensor):
        return unknown if is_fake(t) else float(t.item())
    return float(t)
