"""Model zoo: parameter counts, attention backends, positions, init, stage-style forward."""

from __future__ import annotations

import pytest
import torch

from scaletrain.config import MODEL_PRESETS, ModelConfig, model_preset
from scaletrain.models import build_model, causal_lm_loss, materialize, moe_aux_loss
from scaletrain.models.attention import Attention


@pytest.mark.parametrize("name", list(MODEL_PRESETS))
def test_param_count_matches_config(name):
    cfg = MODEL_PRESETS[name]()
    model = build_model(cfg)  # meta: no memory, even for 405B
    assert all(p.device.type == "meta" for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()


def _gpt(**kw) -> ModelConfig:
    base = dict(vocab_size=61, dim=32, num_layers=2, num_heads=4, max_seq_len=32)
    return ModelConfig(**{**base, **kw})


def _llama(**kw) -> ModelConfig:
    base = dict(vocab_size=61, dim=32, num_heads=4, num_kv_heads=2, ffn_dim=48, max_seq_len=32)
    return model_preset("tiny-llama", **{**base, **kw})


CASES = {
    "gpt2-mha": lambda **kw: _gpt(**kw),
    "llama-gqa": lambda **kw: _llama(**kw),
    "llama-mha": lambda **kw: _llama(num_kv_heads=4, **kw),
    "llama-mqa-tied": lambda **kw: _llama(num_kv_heads=1, tie_embeddings=True, **kw),
}


def _loss_and_grads(cfg, tokens):
    model = build_model(cfg, device="cpu", seed=3)
    logits = model(tokens)
    loss = causal_lm_loss(logits[:, :-1], tokens[:, 1:])
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", list(CASES))
def test_naive_and_sdpa_agree_forward_and_backward(case):
    tokens = torch.randint(0, 61, (2, 24), generator=torch.Generator().manual_seed(0))
    logits_n, grads_n = _loss_and_grads(CASES[case](attention="naive"), tokens)
    logits_s, grads_s = _loss_and_grads(CASES[case](attention="sdpa"), tokens)
    torch.testing.assert_close(logits_s, logits_n, atol=1e-5, rtol=0)
    assert grads_n.keys() == grads_s.keys()
    for name in grads_n:
        torch.testing.assert_close(grads_s[name], grads_n[name], atol=1e-5, rtol=0, msg=name)


def test_naive_core_is_causal():
    # Changing a later token must not change earlier logits.
    model = build_model(_llama(attention="naive"), device="cpu")
    a = torch.randint(0, 61, (1, 16))
    b = a.clone()
    b[0, 10:] = (b[0, 10:] + 7) % 61
    with torch.no_grad():
        la, lb = model(a), model(b)
    torch.testing.assert_close(la[:, :10], lb[:, :10], atol=0, rtol=0)
    assert (la[:, 10:] - lb[:, 10:]).abs().max() > 1e-3


@pytest.mark.parametrize("case", ["gpt2-mha", "llama-gqa"])
def test_explicit_positions_match_default(case):
    model = build_model(CASES[case](), device="cpu")
    tokens = torch.randint(0, 61, (2, 12))
    with torch.no_grad():
        ref = model(tokens)
        by_t = model(tokens, positions=torch.arange(12))
        by_bt = model(tokens, positions=torch.arange(12).expand(2, 12))
        # Per-sample positions: sample 1 has a gap after its 6th token (as a context-parallel
        # shard would), which changes relative distances, so its logits must change.
        gap = torch.cat([torch.arange(6), torch.arange(10, 16)])
        shifted = model(tokens, positions=torch.stack([torch.arange(12), gap]))
    torch.testing.assert_close(by_t, ref, atol=0, rtol=0)
    torch.testing.assert_close(by_bt, ref, atol=0, rtol=0)
    torch.testing.assert_close(shifted[0], ref[0], atol=0, rtol=0)
    assert (shifted[1] - ref[1]).abs().max() > 1e-4


def test_rope_relative_property():
    # RoPE attention depends only on position differences: shifting every position of a
    # sequence by a constant leaves the logits unchanged (learned positions would not).
    model = build_model(_llama(), device="cpu")
    tokens = torch.randint(0, 61, (1, 12))
    with torch.no_grad():
        ref = model(tokens)
        shifted = model(tokens, positions=torch.arange(7, 19))
    torch.testing.assert_close(shifted, ref, atol=1e-5, rtol=0)


def test_init_is_deterministic_and_name_based():
    cfg = _llama(num_layers=3)
    a = build_model(cfg, device="cpu", seed=7)
    b = build_model(cfg)  # meta, then materialized like a parallelized copy would be
    materialize(b, device="cpu", seed=7)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb
        assert torch.equal(pa, pb), na
    assert torch.equal(a.rope.cos, b.rope.cos)
    c = build_model(cfg, device="cpu", seed=8)
    assert not torch.equal(a.layers["0"].attention.wq.weight, c.layers["0"].attention.wq.weight)
    # A pipeline stage holding only layer "2" gets that layer's weights bit for bit.
    stage = build_model(cfg)
    del stage.layers["0"], stage.layers["1"]
    stage.tok_embeddings = None
    materialize(stage, device="cpu", seed=7)
    for name, p in stage.layers["2"].named_parameters():
        assert torch.equal(p, a.layers["2"].get_parameter(name)), name


def test_init_statistics():
    cfg = _gpt(dim=256, num_layers=8, vocab_size=512)
    model = build_model(cfg, device="cpu")
    blk = model.layers["3"]
    std = cfg.init_std
    assert abs(blk.attention.wq.weight.std().item() - std) < 0.1 * std
    out_std = std / (2 * cfg.num_layers) ** 0.5
    assert abs(blk.attention.wo.weight.std().item() - out_std) < 0.1 * out_std
    assert abs(blk.feed_forward.w2.weight.std().item() - out_std) < 0.1 * out_std
    assert torch.count_nonzero(blk.attention.wq.bias) == 0
    assert torch.equal(blk.attention_norm.weight, torch.ones(cfg.dim))
    assert torch.count_nonzero(blk.attention_norm.bias) == 0


def test_stage_forward_composes_to_full_model():
    cfg = _gpt(num_layers=4)
    full = build_model(cfg, device="cpu")
    first, last = build_model(cfg), build_model(cfg)
    for k in ("2", "3"):
        del first.layers[k]
    for k in ("0", "1"):
        del last.layers[k]
    first.norm = None  # tied head: the first stage returns hidden states
    last.tok_embeddings = last.pos_embeddings = None
    last.output = torch.nn.Linear(cfg.dim, cfg.vocab_size, bias=False, device="meta")
    materialize(first, seed=0)
    materialize(last, seed=0)
    with torch.no_grad():
        last.output.weight.copy_(full.tok_embeddings.weight)  # the stage's copy of the tied head
        tokens = torch.randint(0, 61, (2, 10))
        hidden = first(tokens)
        assert hidden.shape == (2, 10, cfg.dim)
        torch.testing.assert_close(last(hidden), full(tokens), atol=1e-6, rtol=0)


def test_attention_reads_local_head_counts():
    # The tensor-parallel contract: shard wq/wk/wv by output rows (whole heads), wo by input
    # columns, divide n_heads/n_kv_heads; the shards' outputs sum to the full output.
    torch.manual_seed(0)
    full = Attention(32, 4, 2, bias=False, backend="sdpa")
    x = torch.randn(2, 8, 32)
    ref = full(x)
    total = torch.zeros_like(ref)
    hd = full.head_dim
    for r in range(2):
        shard = Attention(32, 4, 2, bias=False, backend="sdpa")
        shard.n_heads, shard.n_kv_heads = 2, 1
        q_rows = slice(r * 2 * hd, (r + 1) * 2 * hd)
        kv_rows = slice(r * hd, (r + 1) * hd)
        shard.wq.weight = torch.nn.Parameter(full.wq.weight[q_rows])
        shard.wk.weight = torch.nn.Parameter(full.wk.weight[kv_rows])
        shard.wv.weight = torch.nn.Parameter(full.wv.weight[kv_rows])
        shard.wo.weight = torch.nn.Parameter(full.wo.weight[:, q_rows])
        total = total + shard(x)
    torch.testing.assert_close(total, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["gpt2-mha", "llama-gqa"])
def test_fused_qkv_equals_three_projections(case):
    """`model.fused_qkv`: one matmul against cat([wq, wk, wv]) instead of three, the same
    parameters and state-dict names. In float64 the two orders of the same products differ by
    rounding only: |logit| ~ 1 and sums of <= 32 products give errors ~1e-15, held to 1e-12
    (a wrong split would differ by O(1e-2)). gpt2-mha has biases, llama-gqa 2 KV heads."""
    tokens = torch.randint(0, 61, (2, 24), generator=torch.Generator().manual_seed(0))
    out = {}
    for fused in (False, True):
        model = build_model(CASES[case](fused_qkv=fused), device="cpu", seed=3).double()
        logits = model(tokens)
        causal_lm_loss(logits[:, :-1], tokens[:, 1:]).backward()
        out[fused] = logits.detach(), {n: p.grad for n, p in model.named_parameters()}
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-12, rtol=0)
    assert out[True][1].keys() == out[False][1].keys()
    for name, g in out[False][1].items():
        torch.testing.assert_close(out[True][1][name], g, atol=1e-12, rtol=0, msg=name)


def test_fused_qkv_keeps_three_linears_where_they_are_not_plain():
    """fp8 swaps wq/wk/wv for its own Linear subclasses: those run (here a subclass that
    counts its calls), not the concatenated weight."""
    calls = []

    class Counting(torch.nn.Linear):
        def forward(self, x):
            calls.append(1)
            return super().forward(x)

    # float64: the two paths differ by rounding only (~1e-15 at outputs of order 1)
    attn = Attention(32, 4, 2, bias=False, backend="sdpa", fused_qkv=True).double()
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    ref = attn(x)
    assert not calls
    for name in ("wq", "wk", "wv"):
        old = getattr(attn, name)
        new = Counting(old.in_features, old.out_features, bias=False, dtype=torch.float64)
        new.weight = old.weight
        setattr(attn, name, new)
    torch.testing.assert_close(attn(x), ref, atol=1e-12, rtol=0)
    assert len(calls) == 3


def test_loss_is_fp32_mean_cross_entropy():
    logits = torch.randn(2, 5, 11).to(torch.bfloat16)
    targets = torch.randint(0, 11, (2, 5))
    targets[0, 0] = -100
    loss = causal_lm_loss(logits, targets)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    ref = torch.nn.functional.cross_entropy(logits.float().view(-1, 11), targets.view(-1))
    torch.testing.assert_close(loss, ref)


def test_dense_aux_loss_is_zero():
    model = build_model(_gpt(), device="cpu")
    model(torch.randint(0, 61, (1, 4)))
    aux = moe_aux_loss(model)
    assert aux.dim() == 0 and aux.item() == 0.0


@pytest.mark.parametrize("activation,approximate", [("gelu", "tanh"), ("gelu_exact", "none")])
def test_gelu_forms(activation, approximate):
    """'gelu' is the tanh approximation (GPT-2's gelu_new), 'gelu_exact' the erf form
    (torch's nn.GELU(), nanoGPT's): each MLP equals its form exactly and parts from the other
    by far more than rounding at pre-activations of order 1 (the forms differ by up to ~5e-4)."""
    from scaletrain.models.moe import expert_mlp
    from scaletrain.models.transformer import FeedForward

    torch.manual_seed(0)
    ff = FeedForward(16, 64, activation=activation, bias=False)
    x = torch.randn(8, 16)
    with torch.no_grad():
        up = ff.w1(x)
        other = "none" if approximate == "tanh" else "tanh"
        want = ff.w2(torch.nn.functional.gelu(up, approximate=approximate))
        not_want = ff.w2(torch.nn.functional.gelu(up, approximate=other))
        got = ff(x)
        experts = expert_mlp(x, activation, ff.w1.weight, ff.w2.weight)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(experts, want, atol=0, rtol=0)  # the MoE experts' MLP too
    assert (got - not_want).abs().max().item() > 1e-5
