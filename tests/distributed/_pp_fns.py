"""Rank functions for the pipeline-parallel parity tests."""

import dataclasses

import torch
import torch.distributed as dist

from scaletrain.config import resolve_model
from scaletrain.models import build_model, causal_lm_loss, materialize
from scaletrain.parallel.pipeline import build_pipeline

STEPS, BATCH, SEQ, MICRO, LR = 2, 8, 16, 4, 0.5


def config():
    return dataclasses.replace(resolve_model("tiny-llama"), num_layers=4)


def batch(step):
    g = torch.Generator().manual_seed(200 + step)
    tokens = torch.randint(0, 256, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _train(runtime, data_slice, dp_group=None):
    params = [p for m in runtime.stages for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=LR)
    losses = []
    for step in range(STEPS):
        tokens, targets = batch(step)
        loss = runtime.step(tokens[data_slice], targets[data_slice])
        if dp_group is not None:  # plain data-parallel mean over the dp axis
            for p in params:
                dist.all_reduce(p.grad, group=dp_group)
                p.grad /= dist.get_world_size(dp_group)
            dist.all_reduce(loss, group=dp_group)
            loss /= dist.get_world_size(dp_group)
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    final = {n: p.detach().clone() for m in runtime.stages for n, p in m.named_parameters()}
    return {"losses": losses, "final": final, "stage_ids": runtime.stage_ids}


def _build(schedule, virtual, group, pp_rank, pp_size):
    return build_pipeline(build_model(config(), device="meta"), pp_group=group,
                          pp_rank=pp_rank, pp_size=pp_size, schedule=schedule,
                          virtual=virtual, n_microbatches=MICRO, loss_fn=causal_lm_loss,
                          device="cpu",
                          parallelize_stage=lambda m: materialize(m, device="cpu", seed=0))


def pp_train(cases):
    """pp = world size; one training run per (schedule, virtual)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    return [_train(_build(s, v, dist.group.WORLD, rank, size), slice(None)) for s, v in cases]


def pp_dp_train(schedule, virtual):
    """World 4 = dp 2 x pp 2: ranks (dp, pp) = divmod(rank, 2)."""
    rank = dist.get_rank()
    pp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    dp_rank, pp_rank = divmod(rank, 2)
    runtime = _build(schedule, virtual, pp_groups[dp_rank], pp_rank, 2)
    half = slice(dp_rank * BATCH // 2, (dp_rank + 1) * BATCH // 2)
    return _train(runtime, half, dp_groups[pp_rank])


def reference():
    model = build_model(config(), device="cpu", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        tokens, targets = batch(step)
        loss = causal_lm_loss(model(tokens), targets)
        loss.backward()
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return {"losses": losses, "final": {n: p.detach().clone()
                                        for n, p in model.named_parameters()}}
