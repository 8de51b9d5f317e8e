"""Mistral's sliding-window attention: the mask, logits equal to transformers', the CP rule."""

from __future__ import annotations

import json

import pytest
import torch

from scaletrain.config import ConfigError, Layout, layout_problems, model_from_hf_config
from scaletrain.models import build_model
from scaletrain.models.transformer import sliding_window_mask


def test_the_window_holds_the_query_and_the_previous_w_minus_1_keys() -> None:
    m = sliding_window_mask(6, 3, torch.device("cpu"))
    for i in range(6):
        assert m[i].nonzero().flatten().tolist() == list(range(max(0, i - 2), i + 1))


@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_mistral_with_a_window_shorter_than_the_sequence_matches_transformers(
    tmp_path, attention
) -> None:
    """A Mistral config.json with sliding_window=8 at 32 tokens: our logits (fp64) equal
    transformers' eager ones, and differ from full causal attention (so the window acts)."""
    tf = pytest.importorskip("transformers")
    from scaletrain.checkpoint.hf import load_hf_state_dict

    cfg = tf.MistralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=8,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf = tf.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float64, attn_implementation="eager"
    ).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours_cfg = model_from_hf_config(tmp_path)
    assert ours_cfg.sliding_window == 8
    import dataclasses

    ours_cfg = dataclasses.replace(ours_cfg, attention=attention)
    model = build_model(ours_cfg, device="cpu").double()
    load_hf_state_dict(model, ours_cfg, tmp_path)
    x = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(x).logits
        got = model(x)
        full = build_model(dataclasses.replace(ours_cfg, sliding_window=0), device="cpu")
        full.load_state_dict(model.state_dict())
        unwindowed = full.double()(x)
    # float64 everywhere except the rotary math, which both sides do in fp32 (unit roundoff
    # 6e-8 on O(1) values through 2 layers): 1e-6 absolute is ~16 roundoffs of headroom
    tol = {"rtol": 0.0, "atol": 1e-6}
    torch.testing.assert_close(got, theirs, **tol)
    assert (unwindowed - theirs).abs().max() > 1e-3  # the window changes the answer
    # the first 8 positions see the same keys either way
    torch.testing.assert_close(unwindowed[:, :8], theirs[:, :8], **tol)
    if attention == "sdpa":  # the export keeps the window: transformers reloads it as Mistral
        from scaletrain.checkpoint.hf import export_hf

        out = export_hf(model, ours_cfg, tmp_path / "export")
        again = tf.AutoModelForCausalLM.from_pretrained(
            out, dtype=torch.float64, attn_implementation="eager"
        ).eval()
        assert again.config.model_type == "mistral" and again.config.sliding_window == 8
        with torch.no_grad():
            torch.testing.assert_close(again(x).logits, theirs, **tol)


def test_context_parallel_with_a_short_window_is_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "mistral",
                "vocab_size": 64,
                "hidden_size": 32,
                "intermediate_size": 48,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 4096,
                "sliding_window": 1024,
            }
        )
    )
    model = model_from_hf_config(tmp_path)
    problems = layout_problems(Layout(dp=1, cp=2), model, seq_len=2048)
    assert any(p.field == "parallel.cp" and "sliding window" in p.fix for p in problems)
    assert not layout_problems(Layout(dp=1, cp=2), model, seq_len=1024)  # window covers it


def test_a_bad_window_in_config_json_is_one_line(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "mistral",
                "vocab_size": 64,
                "hidden_size": 32,
                "intermediate_size": 48,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "sliding_window": "big",
            }
        )
    )
    with pytest.raises(ConfigError, match="'sliding_window' = 'big' must be an integer"):
        model_from_hf_config(tmp_path)
