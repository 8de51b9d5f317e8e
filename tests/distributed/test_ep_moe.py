import pytest
import torch

from scaletrain.config import resolve_model
from scaletrain.models import build_model
from scaletrain.parallel.launch import spawn

from ._ep_fns import BATCH, LR, STEPS, _grads, batch, ep_train, train_step

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
EP = 2


def _reference():
    """Single process: the same data-parallel mean, each shard's loss (CE + aux) averaged."""
    model = build_model(resolve_model("tiny-moe"), device="cpu", seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    params0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses, grads = [], []
    for step in range(STEPS):
        tokens, targets = batch(step)
        total = 0.0
        for r in range(EP):
            shard = slice(r * BATCH // EP, (r + 1) * BATCH // EP)
            # backward of loss/EP: scale the grads after, same arithmetic as DP's mean
            total += train_step(model, tokens[shard], targets[shard]).item()
        for p in model.parameters():
            p.grad /= EP
        losses.append(total / EP)
        grads.append(_grads(model))
        opt.step()
        opt.zero_grad()
    final = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params0": params0, "final": final}


def _slice(name, full, rank):
    if "moe.experts." not in name:
        return full
    n = full.shape[0] // EP
    return full[rank * n:(rank + 1) * n]


def test_ep2_matches_single_process_losses_grads_and_params():
    ref = _reference()
    per_rank = spawn(ep_train, EP)
    for rank, got in enumerate(per_rank):
        assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
        for key in ("params0", "final"):
            for n, p in ref[key].items():
                torch.testing.assert_close(got[key][n], _slice(n, p, rank), atol=1e-5,
                                           rtol=1e-5, msg=f"{key} {n} rank {rank}")
        for step in range(STEPS):
            assert set(got["grads"][step]) == set(ref["grads"][step])
            for n, g in ref["grads"][step].items():
                torch.testing.assert_close(got["grads"][step][n], _slice(n, g, rank),
                                           atol=1e-5, rtol=1e-5,
                                           msg=f"grad {n} step {step} rank {rank}")
