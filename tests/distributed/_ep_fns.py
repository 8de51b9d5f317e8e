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


CAPACITY_CASES = [(p, pad) for p in ("probs", "position") for pad in (False, True)]


def _capacity_layer(policy, pad):
    """A float64 MoE layer with an expert capacity (factor 0.75) whose router favours
    expert 0, the same on every rank (seeded)."""
    from scaletrain.models import MoE

    torch.manual_seed(0)
    moe = MoE(
        16,
        24,
        4,
        2,
        activation="swiglu",
        bias=True,
        aux_loss_coef=0.0,
        capacity_factor=0.75,
        drop_policy=policy,
        pad_to_capacity=pad,
    ).double()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
        moe.router.weight[0] += 1.0
    return moe


def _capacity_tokens(rank):
    """(x, dy) of `rank`: rank 0's tokens overflow expert 0 more than rank 1's."""
    g = torch.Generator().manual_seed(10 + rank)
    x = torch.randn(2, 12, 16, generator=g, dtype=torch.float64) + (0.4 if rank == 0 else -0.2)
    return x, torch.randn(2, 12, 16, generator=g, dtype=torch.float64)


def ep_capacity():
    """Per (policy, pad): an expert-parallel layer (ep = world) on this rank's tokens against
    the single-device layer run on those tokens alone (the capacity is each source rank's own).
    Returns {case: (max |y_ep - y|, max |dx_ep - dx|, max |router grad diff|, max |expert
    grad diff| against the mean over ranks of the single-device expert gradients, assignments
    dropped here, max |y_ep - the rows of one layer run on every rank's tokens together|)}."""
    rank, size = dist.get_rank(), dist.get_world_size()
    out = {}
    for policy, pad in CAPACITY_CASES:
        ep = apply_ep(_capacity_layer(policy, pad), dist.group.WORLD)
        assert isinstance(ep.experts, ExpertParallelExperts)
        x, dy = _capacity_tokens(rank)
        x = x.requires_grad_()
        y = ep(x)
        y.backward(dy)
        dropped = int(ep.last_tokens_per_expert.sum() - ep.last_kept_per_expert.sum())

        alone = _capacity_layer(policy, pad)  # this rank's tokens alone
        x_ref = x.detach().clone().requires_grad_()
        y_ref = alone(x_ref)
        y_ref.backward(dy)
        every = _capacity_layer(policy, pad)  # every rank's tokens, one forward each
        for r in range(size):
            xr, dyr = _capacity_tokens(r)
            every(xr).backward(dyr)
        n = 4 // size
        expert_err = max(
            (
                getattr(ep.experts, name).grad.to_local()
                - getattr(every.experts, name).grad[rank * n : (rank + 1) * n] / size
            )
            .abs()
            .max()
            .item()
            for name in ("w1", "w2", "w3", "b1", "b2", "b3")
        )
        together = _capacity_layer(policy, pad)  # one group of every rank's tokens
        xs = torch.cat([_capacity_tokens(r)[0] for r in range(size)])
        y_all = together(xs)[rank * 2 : (rank + 1) * 2]
        out[(policy, pad)] = (
            (y - y_ref).abs().max().item(),
            (x.grad - x_ref.grad).abs().max().item(),
            (ep.router.weight.grad - alone.router.weight.grad).abs().max().item(),
            expert_err,
            dropped,
            (y.detach() - y_all.detach()).abs().max().item(),
        )
    return out
