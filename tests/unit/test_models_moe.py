"""MoE layer: top-k routing against a per-token reference, load-balancing loss, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scaletrain.config import model_preset
from scaletrain.models import MoE, build_model, causal_lm_loss, moe_aux_loss


def _moe(activation: str = "swiglu", bias: bool = False, top_k: int = 2) -> MoE:
    torch.manual_seed(0)
    moe = MoE(16, 24, 4, top_k, activation=activation, bias=bias, aux_loss_coef=0.01)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
    return moe


def _reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    # Token by token: softmax over the top-k router logits, sum of the chosen experts.
    flat = x.reshape(-1, x.shape[-1])
    ex = moe.experts
    out = torch.zeros_like(flat)
    for n, tok in enumerate(flat):
        logits = moe.router(tok)
        top, idx = logits.topk(moe.top_k)
        for w, e in zip(torch.softmax(top, -1), idx.tolist(), strict=True):
            up = F.linear(tok, ex.w1[e], None if ex.b1 is None else ex.b1[e])
            if ex.w3 is not None:
                up = F.silu(up) * F.linear(tok, ex.w3[e], None if ex.b3 is None else ex.b3[e])
            else:
                up = F.gelu(up, approximate="tanh")
            out[n] += w * F.linear(up, ex.w2[e], None if ex.b2 is None else ex.b2[e])
    return out.view_as(x)


@pytest.mark.parametrize(
    "activation,bias,top_k", [("swiglu", False, 2), ("gelu", True, 1), ("swiglu", True, 3)]
)
def test_moe_matches_per_token_reference(activation, bias, top_k):
    moe = _moe(activation, bias, top_k)
    x = torch.randn(2, 7, 16)
    out = moe(x)
    torch.testing.assert_close(out, _reference(moe, x), atol=1e-5, rtol=0)
    # The recorded counts are the top-k choices of the router.
    expected = torch.bincount(
        moe.router(x.reshape(-1, 16)).topk(top_k).indices.reshape(-1), minlength=4
    )
    assert torch.equal(moe.last_tokens_per_expert, expected)
    assert int(moe.last_tokens_per_expert.sum()) == 14 * top_k


def test_aux_loss_is_one_for_uniform_router_probabilities():
    moe = _moe()
    with torch.no_grad():
        moe.router.weight.zero_()  # every expert equally likely: P_i = 1/E
    moe(torch.randn(3, 5, 16))
    torch.testing.assert_close(moe.aux_loss, torch.tensor(1.0))


def test_aux_loss_grows_with_imbalance():
    moe = _moe()
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = 50.0  # expert 0 takes (almost) everything with x[:, 0] > 0
    x = torch.randn(4, 8, 16)
    x[..., 0] = x[..., 0].abs() + 1
    moe(x)
    assert moe.aux_loss.item() > 1.5


def test_model_aux_loss_and_gradients_reach_router_and_experts():
    cfg = model_preset("tiny-moe", vocab_size=61, dim=32, ffn_dim=40, max_seq_len=32)
    model = build_model(cfg, device="cpu")
    for blk in model.layers.values():
        with torch.no_grad():
            blk.moe.router.weight.zero_()
    tokens = torch.randint(0, 61, (2, 16))
    logits = model(tokens)
    aux = moe_aux_loss(model)
    # Uniform probabilities in every layer: each layer contributes coef * 1.
    torch.testing.assert_close(aux, torch.tensor(cfg.num_layers * cfg.moe_aux_loss_coef))
    (causal_lm_loss(logits[:, :-1], tokens[:, 1:]) + aux).backward()
    for blk in model.layers.values():
        for p in (
            blk.moe.router.weight,
            blk.moe.experts.w1,
            blk.moe.experts.w2,
            blk.moe.experts.w3,
        ):
            assert p.grad is not None and p.grad.abs().sum() > 0


def test_router_gets_gradient_from_aux_loss_alone():
    moe = _moe()
    moe(torch.randn(2, 6, 16))
    moe.aux_loss.backward()
    assert moe.router.weight.grad.abs().sum() > 0


def test_balanced_counts_cover_every_assignment():
    from scaletrain.models.moe import balanced_counts

    assert balanced_counts(10, 4) == [3, 3, 2, 2]
    assert balanced_counts(8, 4) == [2, 2, 2, 2]
    assert sum(balanced_counts(37, 8)) == 37


def test_fake_tensors_take_the_balanced_dispatch_real_ones_the_exact_one(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from scaletrain.models import moe as moe_mod

    moe = _moe()
    seen = []
    orig = moe.experts.forward

    def spy(x_sorted, counts):
        seen.append(counts)
        return orig(x_sorted, counts)

    monkeypatch.setattr(moe.experts, "forward", spy)
    x = torch.randn(2, 5, 16)
    real = moe(x)
    assert torch.is_tensor(seen[-1])  # real path: the router's own counts
    assert int(seen[-1].sum()) == 2 * 5 * moe.top_k
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_x = mode.from_tensor(x)
        fake = moe(fake_x)
    assert seen[-1] == moe_mod.balanced_counts(2 * 5 * moe.top_k, moe.num_experts)
    assert fake.shape == real.shape and fake.dtype == real.dtype
    assert moe.last_tokens_per_expert.shape == (moe.num_experts,)


def test_moe_under_autocast_on_fp32_params_returns_the_compute_dtype():
    """DDP / single-process bf16: fp32 parameters under autocast. The experts emit bf16 while
    the norm output is fp32; the combine must accumulate in the experts' dtype (it raised a
    dtype mismatch in index_add_ before)."""
    torch.manual_seed(0)
    model = build_model(model_preset("tiny-moe"), device="cpu", seed=0)
    tokens = torch.randint(0, model_preset("tiny-moe").vocab_size, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
        moe = model.layers["0"].moe
        out = moe(torch.randn(2, 16, moe.experts.w1.shape[-1]))
    assert out.dtype == torch.bfloat16
    loss = causal_lm_loss(logits.float(), tokens) + moe_aux_loss(model)
    loss.backward()
    assert torch.isfinite(loss) and moe.experts.w1.grad.abs().sum() > 0


@pytest.mark.parametrize("ac", ["full", "selective"])
def test_checkpoint_recompute_keeps_the_forward_aux_loss(ac):
    """Activation checkpointing re-runs the MoE forward inside backward. The aux loss kept for
    the step must stay the forward's (whose graph the backward consumed): one stored from the
    recompute held its never-used graph - the recomputed block's saved tensors, 0.34 GB per
    Mixtral-8x7B block at 4096 tokens - until the next forward (issue #16: the dry-run peak of
    mixtral-8x7b dp8 z3 ep8 selective, 107.00 GB -> 96.04 GB)."""
    from scaletrain.parallel.ac import apply_ac

    torch.manual_seed(0)
    cfg = model_preset("tiny-moe")
    model = build_model(cfg, device="cpu", seed=0)
    apply_ac(model, ac)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    logits = model(tokens)
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    forward_aux = [m.aux_loss for m in moes]
    counts = [m.last_tokens_per_expert for m in moes]
    (causal_lm_loss(logits.float(), tokens) + moe_aux_loss(model)).backward()
    assert moes and all(m.aux_loss is a for m, a in zip(moes, forward_aux, strict=True))
    assert all(m.last_tokens_per_expert is c for m, c in zip(moes, counts, strict=True))
    # the recompute did run (the checkpointed blocks got gradients through it)
    assert all(m.experts.w1.grad is not None for m in moes)
