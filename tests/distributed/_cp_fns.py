"""Rank functions for the context-parallel parity tests (module-level so `spawn` can pickle)."""

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


STEPS, BATCH, SEQ, LR = 2, 2, 16, 0.5


def lm_batch(step):
    g = torch.Generator().manual_seed(300 + step)
    tokens = torch.randint(0, 256, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def train_lm(preset, cp_group=None):
    """2 SGD steps of `preset`; with a cp group: sharded sequence, ring attention, grads
    averaged over cp. Returns losses and per-step gradients (full, identical on all ranks)."""
    from scaletrain.config import resolve_model
    from scaletrain.models import build_model, causal_lm_loss
    from scaletrain.parallel.context_parallel import apply_cp, cp_positions

    model = build_model(resolve_model(preset), device="cpu", seed=0)
    rank, size = (dist.get_rank(cp_group), dist.get_world_size(cp_group)) if cp_group \
        else (0, 1)
    apply_cp(model, cp_group)
    cores = {type(b.attention.core).__name__ for b in model.layers.values()}
    assert cores == ({"RingAttentionCore"} if size > 1 else {"SDPAAttentionCore"}), cores
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads = [], []
    for step in range(STEPS):
        tokens, targets = lm_batch(step)
        tokens, targets = cp_shard(tokens, rank, size), cp_shard(targets, rank, size)
        loss = causal_lm_loss(model(tokens, cp_positions(SEQ, rank, size)), targets)
        loss.backward()
        loss = loss.detach()
        if size > 1:
            dist.all_reduce(loss, group=cp_group)
            for p in model.parameters():
                dist.all_reduce(p.grad, group=cp_group)
                p.grad /= size
        losses.append(loss.item() / size)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return {"losses": losses, "grads": grads}


def cp_train_models(presets):
    return [train_lm(p, dist.group.WORLD) for p in presets]
