"""Hugging Face export: logits parity with `transformers`, and the import round trip."""

from __future__ import annotations

import json

import pytest
import torch

from scaletrain.checkpoint.hf import export_hf, from_hf_state_dict, load_hf_state_dict
from scaletrain.config import ModelConfig, model_from_hf_config, model_preset
from scaletrain.models import build_model

transformers = pytest.importorskip("transformers")

CFGS = {
    "gpt2": lambda: ModelConfig(vocab_size=97, dim=32, num_layers=2, num_heads=4, max_seq_len=64),
    "gpt2-untied": lambda: ModelConfig(
        vocab_size=97, dim=32, num_layers=2, num_heads=4, max_seq_len=64, tie_embeddings=False
    ),
    # the erf GELU (nanoGPT's): exported as HF's "gelu", read back as gelu_exact
    "gpt2-gelu-exact": lambda: ModelConfig(
        vocab_size=97, dim=32, num_layers=2, num_heads=4, max_seq_len=64, activation="gelu_exact"
    ),
    "llama-gqa": lambda: model_preset(
        "tiny-llama",
        vocab_size=97,
        dim=32,
        ffn_dim=48,
        num_heads=4,
        num_kv_heads=2,
        rope_theta=500.0,
    ),
    "mixtral": lambda: model_preset("tiny-moe", vocab_size=97, dim=32, ffn_dim=40, max_seq_len=64),
}


@pytest.mark.parametrize("name", list(CFGS))
def test_export_matches_transformers_logits(name, tmp_path):
    cfg = CFGS[name]()
    model = build_model(cfg, device="cpu", seed=1)
    export_hf(model, cfg, tmp_path)
    arch = json.loads((tmp_path / "config.json").read_text())["architectures"][0]
    assert arch == (
        "MixtralForCausalLM"
        if cfg.is_moe
        else "LlamaForCausalLM"
        if cfg.family == "llama"
        else "GPT2LMHeadModel"
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokens = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    assert (ours - theirs).abs().max().item() <= 1e-4
    # the GELU form survives the round trip (at this init the two forms' logits differ by
    # ~1e-6: the forward itself is told apart in tests/unit/test_models.py)
    assert model_from_hf_config(tmp_path).activation == cfg.activation

    # Import is the inverse: a differently seeded model loads back to identical logits.
    other = build_model(cfg, device="cpu", seed=9)
    load_hf_state_dict(other, cfg, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(other(tokens), ours, atol=0, rtol=0)
    # ... and so is reading the state dict of the transformers model itself (for Mixtral on
    # transformers 5: its fused gate_up_proj layout).
    third = build_model(cfg, device="cpu", seed=11)
    third.load_state_dict(from_hf_state_dict(hf.state_dict(), cfg))
    with torch.no_grad():
        torch.testing.assert_close(third(tokens), ours, atol=0, rtol=0)


def test_export_refuses_unsupported_architectures(tmp_path):
    cfg = ModelConfig(vocab_size=97, dim=32, num_layers=1, num_heads=4, num_experts=2)
    with pytest.raises(ValueError, match="Mixtral"):
        export_hf(build_model(cfg, device="cpu"), cfg, tmp_path)
    cfg = ModelConfig(vocab_size=97, dim=32, num_layers=1, num_heads=4, position="rope")
    with pytest.raises(ValueError, match="GPT-2"):
        export_hf(build_model(cfg, device="cpu"), cfg, tmp_path)
