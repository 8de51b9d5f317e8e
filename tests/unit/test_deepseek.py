"""DeepSeek-V3 and V2(-Lite): presets with the published parameter counts, a small random
`transformers` model of each loaded through `checkpoint.init_from`'s reader gives transformers'
float64 logits and loss, exports back with equal logits; the routing rule, the balance loss,
the auxiliary-loss-free bias update and the refusals of what is not built."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from scaletrain.checkpoint.hf import export_hf, from_hf_state_dict
from scaletrain.config import ConfigError, model_from_hf_config, model_preset
from scaletrain.models.deepseek_moe import DeepSeekMoE, deepseek_route, sequence_balance_loss
from tests._hf_models import float64_model_from_hf

transformers = pytest.importorskip("transformers")


def test_deepseek_v3_preset_is_671b_total_36_7b_active():
    m = model_preset("deepseek-v3")
    pc = m.param_counts()
    # DeepSeek-V3 report (arXiv:2412.19437) abstract: 671B total; README_WEIGHTS.md of
    # deepseek-ai/DeepSeek-V3: the main model (no MTP module) 671B total, 36.7B activated
    # (the report's "37B", rounded): every matrix a token multiplies by, head included, the
    # embedding table (a lookup) not
    assert pc.total == pytest.approx(671e9, rel=5e-3)
    assert pc.active(m.experts_per_token) == pytest.approx(36.7e9, rel=5e-3)
    assert pc.total == 671_026_404_352  # config/model.py's preset comment, to the parameter
    # its pieces: 3 dense blocks, 58 MoE blocks of 256 routed + 1 shared expert
    assert pc.dense_layers == 3 and m.num_moe_layers == 58
    assert pc.mlp == 256 * 3 * 7168 * 2048 and pc.shared_mlp == 3 * 7168 * 2048
    assert pc.dense_mlp == 3 * 7168 * 18432
    # MLA: q latent 1536, kv latent 512 (+64 RoPE key), 128 heads of 128 + 64 / 128
    assert pc.attention == 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + (
        512 * 128 * 256 + 128 * 128 * 7168
    )
    assert pc.attention_replicated == 7168 * 1536 + 1536 + 7168 * 576 + 512


def test_deepseek_v2_lite_preset_is_15_7b_total_2_4b_active():
    m = model_preset("deepseek-v2-lite")
    pc = m.param_counts()
    # DeepSeek-V2 paper (arXiv:2405.04434) App. B / the model card: 15.7B total, 2.4B activated
    # (two significant figures: 2.45B counted as above lies inside their rounding, +-0.05B)
    assert pc.total == pytest.approx(15.7e9, rel=5e-3)
    assert abs(pc.active(m.experts_per_token) - 2.4e9) <= 0.055e9


def _route(logits, **kw):
    return deepseek_route(logits, **kw)


def test_group_limited_sigmoid_routing_with_bias():
    # 8 experts in 4 groups of 2; the token may use 2 groups, 2 experts
    logits = torch.tensor([[3.0, 2.9, -1.0, -2.0, 0.5, 0.4, 1.0, -5.0]], dtype=torch.float64)
    w, idx, s = _route(logits, top_k=2, scoring="sigmoid", groups=4, topk_groups=2)
    # group scores (sum of the two best): g0 best, then g2 (0.5+0.4) vs g3 (1.0-5.0): g2
    assert sorted(idx[0].tolist()) == [0, 1]
    assert torch.allclose(w, s.gather(1, idx))
    # a bias on expert 6 (group 3) moves the choice, not the weights (affinities without b)
    bias = torch.zeros(8, dtype=torch.float64)
    bias[6] = 10.0
    w2, idx2, s2 = _route(
        logits, top_k=2, scoring="sigmoid", groups=4, topk_groups=2, bias=bias, norm_topk=True
    )
    assert 6 in idx2[0].tolist()
    assert torch.allclose(w2.sum(-1), torch.ones(1, dtype=torch.float64))
    got = dict(zip(idx2[0].tolist(), w2[0].tolist(), strict=True))
    assert got[6] == pytest.approx(s2[0, 6].item() / s2[0, idx2[0]].sum().item())
    # routed_scaling_factor multiplies the weights
    w3, _, _ = _route(logits, top_k=2, scoring="sigmoid", scale=2.5)
    w4, _, _ = _route(logits, top_k=2, scoring="sigmoid")
    assert torch.allclose(w3, 2.5 * w4)


def test_softmax_routing_is_deepseek_v2s():
    logits = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    w, idx, s = _route(logits, top_k=2, scoring="softmax")
    assert torch.allclose(s.sum(-1), torch.ones(5, dtype=torch.float64))
    assert torch.equal(idx.sort(-1).values, logits.topk(2).indices.sort(-1).values)
    assert torch.allclose(w, s.gather(1, idx))  # not renormalized over the top k


def test_sequence_balance_loss_is_one_when_uniform():
    # every sequence routes its tokens evenly over the experts with uniform affinities
    e, t = 4, 4  # experts, tokens per sequence; k = 2
    idx = torch.tensor([[0, 1], [2, 3], [0, 1], [2, 3]] * 2)  # (2*T, k)
    scores = torch.full((2 * t, e), 0.5, dtype=torch.float64)
    loss = sequence_balance_loss(scores, idx, batch=2, sigmoid=True)
    assert loss.item() == pytest.approx(1.0)
    # all tokens of a sequence on experts 0 and 1: f = (2, 2, 0, 0), P uniform -> 1 again,
    # unless the affinities follow: P = (0.5, 0.5, 0, 0) -> 2
    idx = torch.tensor([[0, 1]] * (2 * t))
    skew = torch.tensor([[1.0, 1.0, 0.0, 0.0]] * (2 * t), dtype=torch.float64)
    assert sequence_balance_loss(skew, idx, batch=2, sigmoid=True).item() == pytest.approx(2.0)


def test_bias_update_moves_toward_balance():
    moe = DeepSeekMoE(
        8,
        4,
        4,
        1,
        activation="swiglu",
        bias=False,
        aux_loss_coef=0.0,
        num_shared=1,
        scoring="sigmoid",
        groups=1,
        topk_groups=1,
        norm_topk=False,
        scale=1.0,
        bias_rate=0.01,
    )
    moe.reset_state()
    # gamma * sign(mean - load): overloaded experts fall, underloaded rise, balanced stay
    moe.update_expert_bias(torch.tensor([4.0, 0.0, 2.0, 2.0]))
    assert moe.expert_bias is not None
    assert moe.expert_bias.tolist() == pytest.approx([-0.01, 0.01, 0.0, 0.0])
    # a training forward accumulates its counts; eval (no grad) does not
    torch.nn.init.normal_(moe.router.weight)
    for p in (moe.experts.w1, moe.experts.w2, moe.experts.w3):
        torch.nn.init.normal_(p)
    x = torch.randn(2, 3, 8)
    moe(x)
    moe(x)
    with torch.no_grad():
        moe(x)
    load = moe.take_load()
    assert load.sum().item() == 2 * 6 and moe.expert_load is None


VOCAB = 97


def _v3(**over):
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=6,
        max_position_embeddings=64,
        num_nextn_predict_layers=0,
    )
    return transformers.DeepseekV3Config(**{**kw, **over})


def _v2(**over):
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_shared_experts=2,
        first_k_dense_replace=1,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
        max_position_embeddings=64,
        topk_method="greedy",
    )
    return transformers.DeepseekV2Config(**{**kw, **over})


FAMILIES = {
    "deepseek_v3": _v3,
    # the un-interleaved RoPE layout transformers also reads
    "deepseek_v3-halves": lambda: _v3(rope_interleave=False),
    "deepseek_v2-lite": _v2,
    "deepseek_v2-grouped": lambda: _v2(
        topk_method="group_limited_greedy", n_group=4, topk_group=2, q_lora_rank=24
    ),
}


# eager attention and experts: transformers' grouped-mm experts kernel has no float64
EAGER = {"attn_implementation": "eager", "experts_implementation": "eager"}


def _hf_model(kind, out_dir):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        FAMILIES[kind](), dtype=torch.float64, **EAGER
    ).eval()
    with torch.no_grad():  # off the init: norms away from one, a non-zero balancing bias
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


# transformers keeps the DeepSeek router (gate weight, e_score_correction_bias) in fp32 in a
# float64 model (`_keep_in_fp32_modules_strict`) and V2 rotates in fp32: its logits carry fp32
# rounding, ~1e-7 relative; ours are float64 throughout
LOGIT_ATOL = 1e-5


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_deepseek_loads_with_transformers_logits_and_exports_back(kind, tmp_path):
    hf = _hf_model(kind, tmp_path / "hf")
    cfg = model_from_hf_config(tmp_path / "hf")
    assert cfg.is_mla and cfg.num_dense_layers == 1
    ours = float64_model_from_hf(cfg, tmp_path / "hf")
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(0))
    targets = torch.roll(tokens, -1, dims=1)
    with torch.no_grad():
        theirs = hf(tokens).logits
        diff = (ours(tokens) - theirs).abs().max().item()
        loss = ours(tokens, targets=targets).item()
        ref = torch.nn.functional.cross_entropy(theirs.flatten(0, 1), targets.flatten()).item()
    print(f"{kind}: max |logit diff| {diff:.2e}, loss {loss:.12f} vs {ref:.12f}")
    assert diff <= LOGIT_ATOL
    assert loss == pytest.approx(ref, abs=1e-6)

    # the in-memory converter reads the same tensors (the fused experts of transformers 5)
    again = float64_model_from_hf(cfg, tmp_path / "hf")
    interleave = not kind.endswith("halves")
    again.load_state_dict(from_hf_state_dict(hf.state_dict(), cfg, rope_interleave=interleave))
    with torch.no_grad():
        torch.testing.assert_close(again(tokens), ours(tokens), atol=0, rtol=0)

    export_hf(ours, cfg, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == hf.config.model_type
    back = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", dtype=torch.float64, **EAGER
    ).eval()
    assert set(back.state_dict()) == set(hf.state_dict())
    with torch.no_grad():
        assert (back(tokens).logits - theirs).abs().max().item() <= LOGIT_ATOL
    # the exported config.json reads back as the imported one (all but the name: its path)
    assert replace(model_from_hf_config(tmp_path / "out"), name="") == replace(cfg, name="")


REFUSED = {
    "num_nextn_predict_layers": ({"num_nextn_predict_layers": 1}, "multi-token prediction"),
    "yarn": (
        {"rope_parameters": {"rope_type": "yarn", "factor": 40.0, "rope_theta": 1e4}},
        "rope scaling",
    ),
    "rope_scaling": ({"rope_scaling": {"type": "yarn", "factor": 40.0}}, "rope scaling"),
    "attention_bias": ({"attention_bias": True}, "attention_bias"),
    "topk_method": ({"topk_method": "greedy"}, "topk_method"),
    "scoring_func": ({"scoring_func": "softmax"}, "scoring_func"),
    "moe_layer_freq": ({"moe_layer_freq": 2}, "moe_layer_freq"),
    "num_key_value_heads": ({"num_key_value_heads": 2}, "num_key_value_heads"),
    "quantization_config": ({"quantization_config": {"quant_method": "fp8"}}, "quantized"),
    "v_head_dim": ({"v_head_dim": 0}, "v_head_dim"),
    "n_group": ({"n_group": 3}, "n_group"),
}


@pytest.mark.parametrize("field", list(REFUSED))
def test_unsupported_deepseek_fields_are_one_line(field, tmp_path):
    base = _v3().to_dict()
    change, words = REFUSED[field]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **change}))
    with pytest.raises(ConfigError) as e:
        model_from_hf_config(path)
    msg = str(e.value)
    assert "\n" not in msg and words in msg, msg
