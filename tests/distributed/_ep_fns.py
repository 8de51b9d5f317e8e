"""Rank functions for the expert-parallel parity test."""

import torch
import torch.distributed as dist

from scaletrain.config import resolve_model
from scaletrain.models import build_model, causal_lm_loss, materialize, moe_aux_loss
from scaletrain.parallel.expert_parallel import ExpertParallelExperts, apply_ep

# SGD, not Adam: Adam normalizes near-zero gradients, turning 1e-9 rounding into 1e-5 steps
STEPS, BATCH, SEQ, LR = 2, 4, 16, 0.5


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, 256, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def train_step(model, tokens, targets):
    loss = causal_lm_loss(model(tokens), targets) + moe_aux_loss(model)
    loss.backward()
    return loss.detach()


def _grads(model):
    out = {}
    for n, p in model.named_parameters():
        g = p.grad
        out[n] = (g.to_local() if hasattr(g, "to_local") else g).clone()
    return out


def ep_train():
    """ep = world size; each rank trains on its batch shard; non-expert grads all-reduced."""
    rank, size = dist.get_rank(), dist.get_world_size()
    cfg = resolve_model("tiny-moe")
    model = build_model(cfg, device="meta")
    apply_ep(model, dist.group.WORLD)
    materialize(model, device="cpu", seed=0)
    assert all(isinstance(m, ExpertParallelExperts) for n, m in model.named_modules()
               if n.endswith("moe.experts"))
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    params0 = {n: (p.to_local() if hasattr(p, "to_local") else p).detach().clone()
               for n, p in model.named_parameters()}
    losses, grads = [], []
    for step in range(STEPS):
        tokens, targets = batch(step)
        shard = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
        loss = train_step(model, tokens[shard], targets[shard])
        for p in model.parameters():
            if not hasattr(p.grad, "to_local"):  # non-expert: data-parallel mean
                dist.all_reduce(p.grad)
                p.grad /= size
        dist.all_reduce(loss)
        losses.append((loss / size).item())
        grads.append(_grads(model))
        opt.step()
        opt.zero_grad()
    final = {n: (p.to_local() if hasattr(p, "to_local") else p).detach().clone()
             for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params0": params0, "final": final}
