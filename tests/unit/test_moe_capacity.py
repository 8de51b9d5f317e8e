"""Expert capacity / token dropping (issue #37 item 3; models/moe_dispatch.py): a float64
reference of the dropping rule, an explicit loop over experts, against the layer's output and
gradients for both policies, padded or not, on a skewed router that drops; a capacity that
cannot overflow changes nothing to the bit; the padded path under fake tensors; the config's
one-line refusals."""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from scaletrain.config import ConfigError, expert_capacity, model_preset
from scaletrain.models import MoE
from scaletrain.models.deepseek_moe import DeepSeekMoE
from scaletrain.models.moe import expert_mlp
from scaletrain.models.moe_dispatch import Capacity

B, T, H, F_DIM, E = 2, 12, 16, 24, 4


def _moe(top_k: int, *, activation: str = "swiglu", bias: bool = True, skew: float = 1.5) -> MoE:
    """A float64 layer whose router sends most tokens to expert 0 (`skew` on its row)."""
    torch.manual_seed(0)
    moe = MoE(H, F_DIM, E, top_k, activation=activation, bias=bias, aux_loss_coef=0.01)
    return _skewed(moe.double(), skew)


def _deepseek() -> DeepSeekMoE:
    torch.manual_seed(0)
    moe = DeepSeekMoE(
        *(H, F_DIM, E, 2),
        activation="swiglu",
        bias=False,
        aux_loss_coef=0.001,
        num_shared=1,
        scoring="sigmoid",
        groups=2,
        topk_groups=1,
        norm_topk=True,
        scale=2.5,
        bias_rate=0.0,
    )
    return _skewed(moe.double(), 1.5)


def _skewed(moe: MoE, skew: float) -> MoE:
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
        moe.router.weight[0] += skew  # expert 0 wins where sum(x) > 0
    return moe


def _x() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    return (x + 0.3).requires_grad_()  # mostly positive sums: expert 0 overflows


def _reference(moe: MoE, x: torch.Tensor, factor: float, policy: str) -> torch.Tensor:
    """The dropping rule written out: per expert, its assignments sorted by the policy
    (weight descending, or position; ties and positions in (t, b) order), the first C kept;
    each token the weighted sum of its kept experts' outputs (weights not renormalized)."""
    b, t, h = x.shape
    flat = x.reshape(-1, h)
    n, k = flat.shape[0], moe.top_k
    if isinstance(moe, DeepSeekMoE):
        w, idx, _ = moe._route(flat)
    else:
        top, idx = moe.router(flat).topk(k, dim=-1)
        w = torch.softmax(top, dim=-1)
    cap = min(n, math.ceil(n * k / moe.num_experts * factor))
    per_expert = moe.experts.weights().unbind()
    parts: list[list[torch.Tensor]] = [[] for _ in range(n)]
    for e in range(moe.num_experts):
        members = [(i, j) for i in range(n) for j in range(k) if int(idx[i, j]) == e]

        def position(m: tuple[int, int]) -> tuple[int, int]:
            return (m[0] % t, m[0] // t)  # (position in the sequence, sequence)

        if policy == "probs":
            members.sort(key=lambda m: (-float(w[m].detach()), position(m)))
        else:
            members.sort(key=position)
        for i, j in members[:cap]:
            y = expert_mlp(flat[i : i + 1], moe.experts.activation, *per_expert[e])
            parts[i].append(w[i, j] * y[0])
    out = torch.stack([sum(p) if p else flat.new_zeros(h) for p in parts])  # type: ignore[misc]
    if isinstance(moe, DeepSeekMoE) and moe.shared_experts is not None:
        out = out + moe.shared_experts(flat, [n])
    return out.view(b, t, h)


def _output_and_grads(moe: MoE, x: torch.Tensor, run) -> tuple[torch.Tensor, list[torch.Tensor]]:
    moe.zero_grad(set_to_none=True)
    x.grad = None
    y = run()
    g = torch.Generator().manual_seed(2)
    y.backward(torch.randn(y.shape, generator=g, dtype=y.dtype))
    grads = [x.grad.clone()] + [p.grad.clone() for p in moe.parameters() if p.grad is not None]
    return y.detach(), grads


CASES = [  # (top_k, activation, bias, factor)
    (2, "swiglu", True, 0.5),
    (1, "gelu", False, 0.75),
    (3, "swiglu", False, 1.0),
]


@pytest.mark.parametrize("pad", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("policy", ["probs", "position"])
@pytest.mark.parametrize(("top_k", "activation", "bias", "factor"), CASES)
def test_layer_matches_the_float64_dropping_rule(top_k, activation, bias, factor, policy, pad):
    moe = _moe(top_k, activation=activation, bias=bias)
    x = _x()
    moe.capacity = Capacity(factor, policy, pad)
    y, grads = _output_and_grads(moe, x, lambda: moe(x))
    # the router overflows: some assignments are dropped, every expert keeps at most C
    n = B * T
    cap = expert_capacity(n, top_k, E, factor)
    routed, kept = moe.last_tokens_per_expert, moe.last_kept_per_expert
    assert routed is not None and kept is not None
    assert int(routed.max()) > cap and int(kept.max()) == cap
    assert torch.equal(kept, routed.clamp(max=cap)) and int(kept.sum()) < n * top_k
    if top_k == 1:  # a token whose only expert dropped it: nothing added (the residual's)
        assert (y.reshape(n, H).abs().sum(-1) == 0).any()
    ref, ref_grads = _output_and_grads(moe, x, lambda: _reference(moe, x, factor, policy))
    torch.testing.assert_close(y, ref, atol=1e-12, rtol=1e-12)
    assert len(grads) == len(ref_grads)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("pad", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("policy", ["probs", "position"])
def test_deepseek_moe_drops_by_the_same_rule(policy, pad):
    """DeepSeekMoE (sigmoid, group-limited, scaled weights, a shared expert): the routed
    experts drop as `MoE`'s; the shared expert takes every token."""
    moe, x = _deepseek(), _x()
    moe.capacity = Capacity(0.5, policy, pad)
    y, grads = _output_and_grads(moe, x, lambda: moe(x))
    assert moe.last_kept_per_expert is not None and moe.last_tokens_per_expert is not None
    assert int(moe.last_kept_per_expert.sum()) < int(moe.last_tokens_per_expert.sum())
    ref, ref_grads = _output_and_grads(moe, x, lambda: _reference(moe, x, 0.5, policy))
    torch.testing.assert_close(y, ref, atol=1e-12, rtol=1e-12)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("policy", ["probs", "position"])
def test_a_capacity_nothing_overflows_is_bitwise_no_dropping(dtype, policy):
    """Unpadded, a factor whose C is at least every expert's load (the dropping code runs and
    keeps every row) and one whose C reaches N (no expert can overflow): the output and every
    gradient equal the dropless layer's to the bit, in the grouped GEMM's dtypes."""
    moe = _moe(2, skew=0.0).to(dtype)
    x = _x().detach().to(dtype).requires_grad_()
    want, want_grads = _output_and_grads(moe, x, lambda: moe(x))
    routed = moe.last_tokens_per_expert
    assert routed is not None
    n = B * T
    loads = int(routed.max())
    factor = loads * E / (n * 2)  # C = the busiest expert's load, < N
    assert loads <= expert_capacity(n, 2, E, factor) < n
    for f in (factor, 100.0):
        moe.capacity = Capacity(f, policy, False)
        got, got_grads = _output_and_grads(moe, x, lambda: moe(x))
        assert torch.equal(got, want), f
        assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads, strict=True)), f


def test_padded_capacity_that_drops_nothing_equals_no_dropping():
    """Padded, C above every load: the same rows plus padding rows that add nothing (float64:
    equal to rounding; the padded GEMMs run other shapes)."""
    moe = _moe(2, skew=0.0)
    x = _x()
    want, want_grads = _output_and_grads(moe, x, lambda: moe(x))
    moe.capacity = Capacity(4.0, "probs", True)
    got, got_grads = _output_and_grads(moe, x, lambda: moe(x))
    torch.testing.assert_close(got, want, atol=1e-13, rtol=1e-13)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-13, rtol=1e-13)


@pytest.mark.parametrize("pad", [False, True], ids=["unpadded", "padded"])
def test_fake_tensors_dispatch_static_rows(pad):
    """Under fake tensors (the dry-run) padded runs E*C rows, the real path's shapes;
    unpadded the balanced router's min(N*k/E, C) per expert."""
    seen: list[tuple[int, list[int]]] = []
    with FakeTensorMode():
        moe = MoE(16, 24, 8, 2, activation="swiglu", bias=False, aux_loss_coef=0.01)
        moe.capacity = Capacity(0.75, "probs", pad)
        moe.experts.register_forward_hook(
            lambda _m, args, _out: seen.append((args[0].shape[0], list(args[1])))
        )
        for p in moe.parameters():  # (Module.to cannot swap fake parameters)
            p.data = p.data.to(torch.bfloat16)
        x = torch.randn(2, 32, 16, dtype=torch.bfloat16, requires_grad=True)
        moe(x).sum().backward()
        assert moe.experts.w1.grad is not None
    cap = expert_capacity(64, 2, 8, 0.75)  # ceil(16 * 0.75) = 12 < the balanced 16
    assert seen == [(8 * cap, [cap] * 8)]


def test_config_refuses_bad_capacity_in_one_line():
    assert model_preset("tiny-moe", moe_capacity_factor=1.25).moe_capacity_factor == 1.25
    bad = [
        ({"moe_capacity_factor": -1.0}, "model.moe_capacity_factor"),
        ({"moe_capacity_factor": float("nan")}, "model.moe_capacity_factor"),
        ({"moe_pad_to_capacity": True}, "model.moe_pad_to_capacity"),
        ({"moe_drop_policy": "latest"}, "model.moe_drop_policy"),
    ]
    for over, field in bad:
        with pytest.raises(ConfigError) as err:
            model_preset("tiny-moe", **over)
        assert err.value.field == field and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="dense model"):
        model_preset("tiny-llama", moe_capacity_factor=1.0)


def test_capacity_is_megatrons_expression_capped_at_the_tokens():
    # ceil((N*k / E) * c): Megatron-Core moe_utils.get_capacity(N*k, E, c)
    assert expert_capacity(4096, 2, 8, 1.0) == 1024
    assert expert_capacity(4096, 2, 8, 1.25) == 1280
    assert expert_capacity(100, 1, 3, 1.0) == 34
    assert expert_capacity(64, 8, 8, 2.0) == 64  # 128 capped: an expert takes a token once
    cfg = model_preset("tiny-moe", moe_capacity_factor=0.5)
    assert cfg.expert_rows_per_token(256) == 4 * expert_capacity(256, 2, 4, 0.5) / 256
    padded = model_preset("tiny-moe", moe_capacity_factor=1.5, moe_pad_to_capacity=True)
    assert padded.expert_rows_per_token(256) == 3.0  # E*C = 4 * 192 rows for 256 tokens
    assert model_preset("tiny-moe", moe_capacity_factor=1.5).expert_rows_per_token(256) == 2
    assert model_preset("tiny-moe").expert_rows_per_token(256) == 2
