"""Rank functions for the ring-attention tests (module-level so `spawn` can pickle).

Model-level context-parallel training parity lives in test_parity_matrix.py.
"""

import torch
import torch.distributed as dist

from scaletrain.parallel.context_parallel import cp_shard, ring_attention


def ring_attention_shards(cases):
    """For each (B, nh, nkv, T, hd, seed): this rank's output and q/k/v grad shards."""
    rank, size = dist.get_rank(), dist.get_world_size()
    results = []
    for b, nh, nkv, t, hd, seed in cases:
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(b, n, t, hd, generator=g) for n in (nh, nkv, nkv))
        dout = torch.randn(b, nh, t, hd, generator=g)
        ql, kl, vl = (cp_shard(x, rank, size, dim=2).requires_grad_() for x in (q, k, v))
        out = ring_attention(ql, kl, vl)
        out.backward(cp_shard(dout, rank, size, dim=2))
        results.append({"out": out.detach(), "dq": ql.grad, "dk": kl.grad, "dv": vl.grad})
    return results
