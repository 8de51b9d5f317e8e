"""Qwen2 / Qwen2.5, Qwen3 (dense) and Phi-3: presets with the published parameter counts, and
a small random `transformers` model of each family loaded through `checkpoint.init_from`'s
reader gives transformers' logits and loss in float64, and exports back to the same
`model_type` with equal logits."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from scaletrain.checkpoint.hf import export_hf, from_hf_state_dict
from scaletrain.config import model_from_hf_config, model_preset
from tests._hf_models import float64_model_from_hf

transformers = pytest.importorskip("transformers")

# Published totals: the model cards on the Hugging Face hub (their "Model size", the
# safetensors parameter count) of Qwen/Qwen2.5-7B, Qwen/Qwen2.5-72B, Qwen/Qwen3-8B,
# Qwen/Qwen3-32B and microsoft/Phi-3-mini-4k-instruct; the cards' prose rounds further (Qwen3-8B
# "8.2B", Phi-3-mini "3.8B"). Non-embedding counts: the Qwen cards' "Number of Parameters
# (Non-Embedding)". The exact counts are in config/model.py's preset comments.
PUBLISHED = {
    "qwen2.5-7b": 7.62e9,
    "qwen2.5-72b": 72.7e9,
    "qwen3-8b": 8.19e9,
    "qwen3-32b": 32.8e9,
    "phi-3-mini": 3.82e9,
}
NON_EMBEDDING = {"qwen2.5-7b": 6.53e9, "qwen3-8b": 6.95e9, "qwen3-32b": 31.2e9}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_parameter_counts_match_the_model_cards(name):
    cfg = model_preset(name)
    assert cfg.num_params() == pytest.approx(PUBLISHED[name], rel=5e-3)
    if name in NON_EMBEDDING:  # the split between embeddings (input and head) and blocks
        pc = cfg.param_counts()
        body = pc.total - pc.embedding - pc.head
        assert body == pytest.approx(NON_EMBEDDING[name], rel=5e-3)


def test_preset_counts_include_qkv_biases_and_qk_norms():
    q = model_preset("qwen2.5-7b").param_counts()
    plain = model_preset("qwen2.5-7b", qkv_bias=False).param_counts()
    assert q.attention - plain.attention == 28 * 128 + 2 * 4 * 128  # a*d + 2*g*d
    n = model_preset("qwen3-8b").param_counts()
    assert n.attention - model_preset("qwen3-8b", qk_norm=False).param_counts().attention == 256
    # Qwen3-32B: 64 heads x 128 = an 8192-wide q on a 5120-wide residual stream
    assert model_preset("qwen3-32b").q_dim == 8192


VOCAB = 97
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "attention_dropout": 0.0,
}
FAMILIES = {
    # Llama with both of LlamaConfig's bias fields: biases on q/k/v/o and the MLP (our `bias`)
    "llama-bias": lambda: transformers.LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, rope_theta=1e6),
    # the small Qwen2.5 sizes tie the head; a window on every layer (max_window_layers 0)
    "qwen2-tied-window": lambda: transformers.Qwen2Config(
        **COMMON,
        tie_word_embeddings=True,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=0,
    ),
    # head_dim 16 != 32 / 4: q is 64 wide on a 32-wide residual stream (as Qwen3-32B)
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=16, rope_theta=1e6),
    "phi3": lambda: transformers.Phi3Config(
        **COMMON, sliding_window=8, bos_token_id=1, eos_token_id=2, pad_token_id=2
    ),
}


def _hf_model(kind, out_dir):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        FAMILIES[kind](), dtype=torch.float64, attn_implementation="eager"
    ).eval()
    with torch.no_grad():  # off the init: norms (and q/k norms) away from one, biases from 0
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(out_dir, safe_serialization=True)
    return model


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_family_loads_with_transformers_logits_and_exports_back(kind, tmp_path):
    hf = _hf_model(kind, tmp_path / "hf")
    cfg = model_from_hf_config(tmp_path / "hf")
    ours = float64_model_from_hf(cfg, tmp_path / "hf")
    assert next(ours.parameters()).dtype == torch.float64
    # 40 tokens: past the 8-token windows
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(0))
    targets = torch.roll(tokens, -1, dims=1)
    with torch.no_grad():
        theirs = hf(tokens).logits
        diff = (ours(tokens) - theirs).abs().max().item()
        loss = ours(tokens, targets=targets).item()
        ref = torch.nn.functional.cross_entropy(theirs.flatten(0, 1), targets.flatten()).item()
    print(f"{kind}: max |logit diff| {diff:.2e}, loss {loss:.12f} vs {ref:.12f}")
    assert diff <= 1e-6
    assert loss == pytest.approx(ref, abs=1e-6)

    # the in-memory converter reads the same tensors (Phi-3: the fused ones split)
    again = float64_model_from_hf(cfg, tmp_path / "hf")
    again.load_state_dict(from_hf_state_dict(hf.state_dict(), cfg))
    with torch.no_grad():
        torch.testing.assert_close(again(tokens), ours(tokens), atol=0, rtol=0)

    export_hf(ours, cfg, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == hf.config.model_type
    back = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", dtype=torch.float64, attn_implementation="eager"
    ).eval()
    assert set(back.state_dict()) == set(hf.state_dict())
    with torch.no_grad():
        assert (back(tokens).logits - theirs).abs().max().item() <= 1e-6
    # the exported config.json reads back as the imported one (all but the name: its path)
    assert replace(model_from_hf_config(tmp_path / "out"), name="") == replace(cfg, name="")
