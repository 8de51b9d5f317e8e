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


def ring_attention_document_shards(cases):
    """As `ring_attention_shards` with document masking: for each (B, nh, nkv, T, hd, seed)
    and the (B, T) tokens `document_tokens(B, T, seed)` (separator 0), this rank's output and
    q/k/v grad shards, masked and (output only) unmasked."""
    from scaletrain.models.documents import document_ids

    rank, size = dist.get_rank(), dist.get_world_size()
    results = []
    for b, nh, nkv, t, hd, seed in cases:
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(b, n, t, hd, generator=g) for n in (nh, nkv, nkv))
        dout = torch.randn(b, nh, t, hd, generator=g)
        docs, _ = document_ids(document_tokens(b, t, seed), 0)
        ql, kl, vl = (cp_shard(x, rank, size, dim=2).requires_grad_() for x in (q, k, v))
        out = ring_attention(ql, kl, vl, documents=docs)
        out.backward(cp_shard(dout, rank, size, dim=2))
        plain = ring_attention(*(cp_shard(x, rank, size, dim=2) for x in (q, k, v)))
        results.append(
            {"out": out.detach(), "dq": ql.grad, "dk": kl.grad, "dv": vl.grad, "unmasked": plain}
        )
    return results


def document_tokens(b, t, seed):
    """(B, T) ids in 0..3 (0 ends a document: about 4 tokens per document)."""
    return torch.randint(0, 4, (b, t), generator=torch.Generator().manual_seed(seed + 100))


def document_model_grads(b, t, seed, masked):
    """tiny-llama (fp32, seed 0) under ring attention over every rank, with document masking
    when `masked` (separator 0): the cp-group mean loss of `document_tokens(B, T + 1, seed)`
    (inputs / next-token targets) and the cp-mean parameter gradients, by name."""
    from scaletrain.config import resolve_model
    from scaletrain.models import build_model
    from scaletrain.parallel.context_parallel import apply_cp
    from scaletrain.trainer.step import cp_model_inputs

    rank, size = dist.get_rank(), dist.get_world_size()
    model = apply_cp(
        build_model(resolve_model("tiny-llama"), device="cpu", seed=0),
        None if size == 1 else dist.group.WORLD,
    )
    tokens = document_tokens(b, t + 1, seed)
    x, y = tokens[:, :-1], tokens[:, 1:]
    shard, kw = cp_model_inputs(x, rank, size, 0 if masked else None)
    loss = model(shard, targets=cp_shard(y, rank, size), **kw)
    loss.backward()
    # equal shards: the whole batch's mean is the mean of the shard means
    dist.all_reduce(loss := loss.detach())
    grads = {}
    for n, p in model.named_parameters():
        dist.all_reduce(g := p.grad.clone())
        grads[n] = g / size
    return float(loss) / size, grads
