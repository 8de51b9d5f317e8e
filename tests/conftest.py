"""Shared fixtures."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """One intra-op thread for the test. Tiny matmuls and elementwise ops gain nothing from
    threads, and on a busy 2-core CI host two threads meeting at a barrier make them 10-100x
    slower (OpenMP spin-waits), which blurs timing-sensitive assertions and wastes CI time."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
