"""Which exceptions are allocation failures (and so get the OOM report).

CUDA raises `torch.OutOfMemoryError`; Python raises `MemoryError`; but the CPU allocator
raises a plain `RuntimeError` ("DefaultCPUAllocator: can't allocate memory: you tried to
allocate N bytes", or "not enough memory" on some builds), which used to escape as a
traceback instead of the report.
"""

from __future__ import annotations

import torch

__all__ = ["is_allocation_failure"]

_CPU_MESSAGES = ("DefaultCPUAllocator: can't allocate memory", "not enough memory")


def is_allocation_failure(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _CPU_MESSAGES)
