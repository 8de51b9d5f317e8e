"""Qwen3-MoE, Gemma 2 and Gemma 3 (text): presets with the published parameter counts; a small
random `transformers` model of each family, loaded through `checkpoint.init_from`'s reader, gives
transformers' float64 logits and loss and exports back to the same `model_type` with equal
logits; the pieces they add (top-k weights without renormalization, soft-capped fused loss,
the (1 + w) norm's 16-bit path) checked against plain autograd."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from scaletrain.checkpoint.hf import export_hf, from_hf_state_dict
from scaletrain.config import ConfigError, Layout, model_from_hf_config, model_preset
from scaletrain.config.layout import layout_problems
from scaletrain.models.loss import linear_cross_entropy
from scaletrain.models.norms import rms_norm16
from tests._hf_models import float64_model_from_hf

transformers = pytest.importorskip("transformers")

# Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B model cards: "30.5B in total and 3.3B
# activated", "Number of Parameters (Non-Embedding): 29.9B"; "235B in total and 22B
# activated", "(Non-Embedding): 234B". The cards round to their last digit (3.35B activated
# is written 3.3B), hence the tolerances: 0.5% on totals, 2% on the activated counts.
QWEN_MOE = {
    "qwen3-30b-a3b": (30.5e9, 29.9e9, 3.3e9),
    "qwen3-235b-a22b": (235e9, 234e9, 22e9),
}
# Gemma 2 (Gemma Team 2024, Table 1): non-embedding parameters exactly; the embedding there is
# 256,128 x d (the tokenizer's padded table), the released checkpoints' 256,000 rows here;
# totals: the hub's safetensors sizes of google/gemma-2-9b and -27b, 9.24B and 27.2B.
GEMMA2 = {"gemma-2-9b": (9.24e9, 8_324_201_984), "gemma-2-27b": (27.2e9, 26_047_480_320)}


@pytest.mark.parametrize("name", list(QWEN_MOE))
def test_qwen3_moe_presets_match_the_model_cards(name):
    cfg = model_preset(name)
    total, body, active = QWEN_MOE[name]
    pc = cfg.param_counts()
    assert pc.total == pytest.approx(total, rel=5e-3)
    assert pc.total - pc.embedding - pc.head == pytest.approx(body, rel=5e-3)
    activated = (
        pc.embedding
        + pc.head
        + pc.final_norm
        + cfg.num_layers * pc.active_per_layer(cfg.experts_per_token)
    )
    assert activated == pytest.approx(active, rel=2e-2)
    assert cfg.num_experts == 128 and cfg.experts_per_token == 8 and cfg.q_dim == 2 * cfg.dim


@pytest.mark.parametrize("name", list(GEMMA2))
def test_gemma2_presets_match_the_paper(name):
    cfg = model_preset(name)
    total, body = GEMMA2[name]
    pc = cfg.param_counts()
    assert pc.total - pc.embedding - pc.head == body  # exactly: Table 1's figure
    assert pc.total == pytest.approx(total, rel=5e-3)
    assert pc.head == 0 and pc.norms == 4 * cfg.dim  # tied; four norms per block


VOCAB = 97
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "attention_dropout": 0.0,
}
MOE = {"moe_intermediate_size": 24, "num_experts": 8, "num_experts_per_tok": 3}
FAMILIES = {
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**COMMON, **MOE, norm_topk_prob=True),
    "qwen3_moe-unnormalized": lambda: transformers.Qwen3MoeConfig(
        **COMMON, **MOE, norm_topk_prob=False
    ),
    # 40 tokens past the window of 8 on layers 0 and 2; q.k / sqrt(12) on 16-wide heads
    "gemma2": lambda: transformers.Gemma2Config(
        **COMMON,
        query_pre_attn_scalar=12,
        sliding_window=8,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0,
    ),
    # soft-capping off (null), every third layer global: the SDPA core, another pattern
    "gemma2-no-caps": lambda: transformers.Gemma2Config(
        **COMMON,
        sliding_window=8,
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 1
        + ["sliding_attention"],
    ),
    # Gemma 3: (1 + w) q/k norms, the local layers' own RoPE base (100 beside 1e6), no caps;
    # three local layers for one global
    "gemma3_text": lambda: transformers.Gemma3TextConfig(
        **COMMON,
        query_pre_attn_scalar=12,
        sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        },
    ),
}


def _hf_model(kind, out_dir):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        FAMILIES[kind](),
        dtype=torch.float64,
        attn_implementation="eager",
        experts_implementation="eager",
    ).eval()
    with torch.no_grad():  # off the init: norms away from their start, biases from 0
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_family_loads_with_transformers_logits_and_exports_back(kind, tmp_path):
    hf = _hf_model(kind, tmp_path / "hf")
    cfg = model_from_hf_config(tmp_path / "hf")
    if kind == "gemma2-no-caps":
        assert cfg.attention == "sdpa" and cfg.full_attention_every == 3
    if kind == "gemma3_text":
        assert cfg.qk_norm and cfg.rope_local_theta == 100.0 and cfg.rope_theta == 1e6
    ours = float64_model_from_hf(cfg, tmp_path / "hf")
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(0))
    targets = torch.roll(tokens, -1, dims=1)
    with torch.no_grad():
        theirs = hf(tokens).logits
        diff = (ours(tokens) - theirs).abs().max().item()
        loss = ours(tokens, targets=targets).item()  # the fused head + loss
        ref = F.cross_entropy(theirs.flatten(0, 1), targets.flatten()).item()
    print(f"{kind}: max |logit diff| {diff:.2e}, loss {loss:.12f} vs {ref:.12f}")
    # not 1e-15: transformers' float64 model computes its RoPE tables and its eager softmax in
    # fp32 and Gemma's RMSNorms too (`x.float()`): ~1e-7 per op of it; Gemma 3's six norms
    # per block (q/k ones included) reach 7e-7 over 4 blocks, hence 2e-6 for the Gemmas
    assert diff <= (2e-6 if kind.startswith("gemma") else 1e-6)
    assert loss == pytest.approx(ref, abs=1e-6)

    # the in-memory converter reads transformers 5's fused experts (gate_up_proj)
    again = float64_model_from_hf(cfg, tmp_path / "hf")
    again.load_state_dict(from_hf_state_dict(hf.state_dict(), cfg))
    with torch.no_grad():
        torch.testing.assert_close(again(tokens), ours(tokens), atol=0, rtol=0)

    export_hf(ours, cfg, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == hf.config.model_type
    back = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out",
        dtype=torch.float64,
        attn_implementation="eager",
        experts_implementation="eager",
    ).eval()
    assert set(back.state_dict()) == set(hf.state_dict())
    with torch.no_grad():
        assert (back(tokens).logits - theirs).abs().max().item() <= 1e-12  # the same weights
    assert replace(model_from_hf_config(tmp_path / "out"), name="") == replace(cfg, name="")


@pytest.mark.parametrize("softcap", [0.0, 2.5])
def test_fused_loss_soft_cap_matches_autograd(softcap):
    """linear_cross_entropy's chunked forward and hand-written backward through the cap
    (d(c tanh(z / c))/dz = 1 - tanh^2), with an ignored target, == autograd on the capped
    logits, in float64."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    t = torch.randint(0, 11, (7,), generator=g)
    t[3] = -100
    loss = linear_cross_entropy(h, w, t, chunk_tokens=3, softcap=softcap)
    gh, gw = torch.autograd.grad(loss, (h, w))
    z = h @ w.t()
    z = softcap * torch.tanh(z / softcap) if softcap else z
    ref = F.cross_entropy(z, t, ignore_index=-100)
    rh, rw = torch.autograd.grad(ref, (h, w))
    torch.testing.assert_close(loss, ref, rtol=1e-13, atol=0)
    torch.testing.assert_close(gh, rh, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(gw, rw, rtol=1e-12, atol=1e-15)


def test_plus_one_norm_16bit_path_matches_float_autograd():
    """The (1 + w) RMSNorm's memory-lean 16-bit path (models/norms.py) against autograd in
    float64 on the same bf16 values: forward within one bf16 rounding, gradients within the
    bf16 rounding of the incoming gradient."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 64, generator=g).to(torch.bfloat16).requires_grad_()
    w = (0.1 * torch.randn(64, generator=g)).requires_grad_()
    dy = torch.randn(3, 4, 64, generator=g).to(torch.bfloat16)
    out = rms_norm16(x, w, 1e-6, plus_one=True)
    assert out.dtype == torch.bfloat16
    gx, gw = torch.autograd.grad(out, (x, w), dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = F.rms_norm(x64, (64,), eps=1e-6) * (1 + w64)
    rx, rw = torch.autograd.grad(ref, (x64, w64), dy.double())
    torch.testing.assert_close(out.double(), ref, rtol=8e-3, atol=0)  # bf16: 2^-8 relative
    torch.testing.assert_close(gx.double(), rx, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(gw.double(), rw, rtol=1e-5, atol=1e-5)


def test_gemma_pieces_refused_where_they_cannot_run():
    gemma = model_preset("gemma-2-9b")
    with pytest.raises(ConfigError, match="model.attn_softcap"):
        replace(gemma, attention="sdpa")
    with pytest.raises(ConfigError, match="model.full_attention_every"):
        replace(gemma, sliding_window=0)
    with pytest.raises(ConfigError, match="model.norm_plus_one"):
        model_preset("tiny", norm_plus_one=True)  # a LayerNorm
    # ring attention has neither the window (seq 8192 > 4096) nor soft-capping: one line each
    long = [p.fix for p in layout_problems(Layout(cp=2), gemma, seq_len=8192)]
    assert len(long) == 2
    assert "model.sliding_window" in long[0] and "model.attn_softcap" in long[1]
    short = [p.fix for p in layout_problems(Layout(cp=2), gemma, seq_len=4096)]
    assert len(short) == 1 and "model.attn_softcap" in short[0]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        # Multi-head Latent Attention has its own core and latent norms: Gemma's score scale,
        # score soft-cap and (1 + w) norms would not reach them
        ({"attn_scale_dim": 24}, "model.attn_scale_dim"),
        ({"attention": "naive", "attn_softcap": 20.0}, "model.attn_softcap"),
        ({"norm_plus_one": True}, "model.norm_plus_one"),
        # DeepSeek's routing normalizes its k weights with router_norm_topk; Qwen3-MoE's
        # switch belongs to the Mixtral-style router
        ({"moe_norm_topk": False}, "model.moe_norm_topk"),
    ],
)
def test_gemma_and_qwen3_moe_switches_refused_on_deepseek(fields, named):
    with pytest.raises(ConfigError, match=named):
        model_preset("tiny-deepseek", **fields)


def test_qwen3_moe_switch_kept_on_mixtral_style_routing():
    cfg = model_preset("tiny-moe", moe_norm_topk=False)
    assert not cfg.moe_norm_topk and cfg.router_scoring == "topk_softmax"
