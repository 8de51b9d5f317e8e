"""Rank functions for the expert-parallel parity test."""

import torch
import torch.distributed as dist

from scaletrain.config import resolve_model
from scaletrain.models import build_model, causal_lm_loss, materialize, moe_aux_loss
from scaletrain.parallel.expert_parallel import ExpertParallelExperts, apply_ep
from scaletrain.precision import Float8ExpertLinear, apply_fp8

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
    assert all(
        isinstance(m, ExpertParallelExperts)
        for n, m in model.named_modules()
        if n.endswith("moe.experts")
    )
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    params0 = {
        n: (p.to_local() if hasattr(p, "to_local") else p).detach().clone()
        for n, p in model.named_parameters()
    }
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
    final = {
        n: (p.to_local() if hasattr(p, "to_local") else p).detach().clone()
        for n, p in model.named_parameters()
    }
    return {"losses": losses, "grads": grads, "params0": params0, "final": final}


def ep_experts_fp8(scaling):
    """One float8 `GroupedExperts` call, single-process and split over the ep ranks.

    Every rank feeds the same tokens, so each expert's owner receives its token group once
    from every rank: the duplicates leave each group's amax (the tensorwise scale) and each
    row's tiles unchanged, so the expert-parallel rows must equal the single-process rows and
    its weight gradient (ep x the rows, times EP's 1/ep) the single-process one.
    Returns (max |y_ep - y|, {param: max |grad_ep - grad slice|}, max |y|).
    """
    from scaletrain.models.moe import GroupedExperts

    rank, size = dist.get_rank(), dist.get_world_size()
    cfg = resolve_model("tiny-moe")
    torch.manual_seed(0)
    ref = GroupedExperts(
        cfg.dim, cfg.ffn_dim, cfg.num_experts, activation=cfg.activation, bias=False
    )
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.05)
    counts = [(7 * e + 3) % 29 + 1 for e in range(cfg.num_experts)]  # uneven, none empty
    x = torch.randn(sum(counts), cfg.dim)
    dy = torch.randn(sum(counts), cfg.dim)
    apply_fp8(ref, scaling=scaling, backend="scaletrain")
    ep = ExpertParallelExperts(ref, _world_mesh())
    assert isinstance(ref.linear, Float8ExpertLinear) and ep.linear is ref.linear
    y = ref(x, counts)
    y.backward(dy)
    y_ep = ep(x, counts)
    y_ep.backward(dy)
    n = cfg.num_experts // size
    grads = {}
    for name in ("w1", "w2", "w3"):
        mine = getattr(ep, name).grad.to_local()
        want = getattr(ref, name).grad[rank * n : (rank + 1) * n]
        grads[name] = (mine - want).abs().max().item() / want.abs().max().item()
    return (y_ep - y).abs().max().item(), grads, y.abs().max().item()


def _world_mesh():
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(dist.group.WORLD, "cpu")
