"""Shared fixtures, and the test process's intra-op thread count."""

import os

import pytest
import torch

if "OMP_NUM_THREADS" not in os.environ:
    # One intra-op thread for the in-process tests unless the caller chose a count. Their
    # tiny matmuls and elementwise ops gain nothing from threads, and on a busy 2-core host
    # torch's default (one thread per core) meets at a barrier per op: OpenMP spin-waits
    # for a descheduled peer. Measured alone at load ~11 (issue 32): the DeepSeek resume test
    # 214 s at the default 2 threads vs 6.1 s at one, the fp8 run 19.4 s vs 3.2 s; in CI's
    # last full run these in-process tests were the slowest of the suite. Ranks started by
    # `spawn` already run one thread each (its `threads=1`), and the CLI subprocesses the
    # tests start set OMP_NUM_THREADS=1. To run the suite at other thread counts (the
    # parity verdicts must hold at 1, 2 or 4), set OMP_NUM_THREADS: it is then left alone.
    torch.set_num_threads(1)


@pytest.fixture
def one_thread():
    """One intra-op thread for the test, whatever OMP_NUM_THREADS says. Tiny matmuls and
    elementwise ops gain nothing from threads, and on a busy 2-core CI host two threads
    meeting at a barrier make them 10-100x slower (OpenMP spin-waits), which blurs
    timing-sensitive assertions and wastes CI time."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
