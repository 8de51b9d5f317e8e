import pytest
import torch

from scaletrain.config import resolve_model
from scaletrain.models import build_model
from scaletrain.parallel.launch import spawn

from ._ep_fns import (
    BATCH,
    CAPACITY_CASES,
    LR,
    STEPS,
    _grads,
    batch,
    ep_capacity,
    ep_experts_fp8,
    ep_train,
    train_step,
)

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
    return full[rank * n : (rank + 1) * n]


def test_ep2_matches_single_process_losses_grads_and_params():
    ref = _reference()
    per_rank = spawn(ep_train, EP)
    for rank, got in enumerate(per_rank):
        assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
        for key in ("params0", "final"):
            for n, p in ref[key].items():
                torch.testing.assert_close(
                    got[key][n],
                    _slice(n, p, rank),
                    atol=1e-5,
                    rtol=1e-5,
                    msg=f"{key} {n} rank {rank}",
                )
        for step in range(STEPS):
            assert set(got["grads"][step]) == set(ref["grads"][step])
            for n, g in ref["grads"][step].items():
                torch.testing.assert_close(
                    got["grads"][step][n],
                    _slice(n, g, rank),
                    atol=1e-5,
                    rtol=1e-5,
                    msg=f"grad {n} step {step} rank {rank}",
                )


@pytest.mark.parametrize("scaling", ["tensorwise", "tilewise"])
def test_ep2_float8_experts_match_single_process(scaling):
    """Float8 experts (precision/fp8.py Float8ExpertLinear) split over ep2: the same rows and
    weight gradients as the single-process float8 call (`ep_experts_fp8`), to fp32 rounding.

    Tile-wise wgrad re-quantizes its dequantized operand in 128x1 tiles (fp8.py), so an fp32
    rounding difference of one element of w2's input (a GEMM over 2x the rows) can move it to
    the neighbouring fp8 value: measured 6e-4 of the largest w2 gradient; bound 2e-3.
    """
    bound = 1e-5 if scaling == "tensorwise" else 2e-3
    for y_err, grad_errs, y_max in spawn(ep_experts_fp8, EP, scaling):
        assert y_max > 0 and y_err <= 1e-6 * y_max, (scaling, y_err, y_max)
        assert set(grad_errs) == {"w1", "w2", "w3"}
        assert all(e <= bound for e in grad_errs.values()), (scaling, grad_errs)


def test_ep2_token_dropping_caps_each_source_ranks_tokens():
    """Expert capacity under ep2 (models/moe_dispatch.py), both policies, padded (static
    splits, no count exchange) or not: each rank's output, input gradient and router gradient
    equal the single-device layer's on that rank's tokens alone, and each expert shard's
    gradient the mean over ranks of the single-device ones, in float64; tokens are dropped on
    every rank, and one layer over both ranks' tokens together (a global capacity) differs."""
    per_rank = spawn(ep_capacity, EP)
    for rank, cases in enumerate(per_rank):
        assert set(cases) == set(CAPACITY_CASES)
        for case, (y_err, dx_err, router_err, expert_err, dropped, vs_global) in cases.items():
            assert dropped > 0, (rank, case)
            assert max(y_err, dx_err, router_err, expert_err) <= 1e-12, (rank, case, cases)
            assert vs_global > 1e-3, (rank, case)
