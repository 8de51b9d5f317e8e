"""The manual gradient sync's buckets (parallel.data_parallel._buckets): consecutive, one
dtype each, about BUCKET_BYTES, every gradient exactly once."""

from __future__ import annotations

import torch

from scaletrain.parallel import data_parallel


def test_buckets_are_consecutive_same_dtype_and_bounded(monkeypatch):
    monkeypatch.setattr(data_parallel, "BUCKET_BYTES", 100)  # 25 fp32 values
    grads = [
        torch.zeros(10),
        torch.zeros(10),
        torch.zeros(30),
        torch.zeros(5, dtype=torch.float64),
        torch.zeros(2),
        torch.zeros(3),
    ]
    buckets = data_parallel._buckets(grads)
    assert [[g.numel() for g in b] for b in buckets] == [[10, 10], [30], [5], [2, 3]]
    assert [id(g) for b in buckets for g in b] == [id(g) for g in grads]  # same, in order
    assert all(len({g.dtype for g in b}) == 1 for b in buckets)
