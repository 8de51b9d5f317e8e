"""A CPU allocation failure is recognised as out-of-memory (and so gets the OOM report)."""

from __future__ import annotations

import pytest
import torch

from scaletrain.trainer.oom import is_allocation_failure


def test_a_real_cpu_allocation_failure_is_an_oom():
    with pytest.raises(RuntimeError) as e:
        torch.empty(2**62, dtype=torch.uint8)  # 4 EiB: no host can give it
    assert is_allocation_failure(e.value), str(e.value)


@pytest.mark.parametrize(
    ("error", "oom"),
    [
        (MemoryError(), True),
        (torch.OutOfMemoryError("CUDA out of memory"), True),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 bytes"), True),
        (RuntimeError("[enforce fail] not enough memory: you tried to allocate 9 bytes"), True),
        (RuntimeError("shape mismatch"), False),
        (ValueError("not enough memory"), False),
    ],
)
def test_classification(error, oom):
    assert is_allocation_failure(error) is oom
