"""Qwen3-MoE and Gemma 2 config.json faults: what these families can ask and the model code
does not implement is one line naming config.json and the field, before any work (for
plan / dryrun's --model.name and train's checkpoint.init_from alike); what they ask and it
implements is read, not refused."""

from __future__ import annotations

import pytest

from scaletrain.config import load_config

from .test_hf_config import LLAMA, _refused, _write

QWEN3_MOE = {
    **LLAMA,
    "model_type": "qwen3_moe",
    "head_dim": 32,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
GEMMA2 = {
    **{k: v for k, v in LLAMA.items() if k != "hidden_act"},
    "model_type": "gemma2",
    "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 16,
    "sliding_window": 32,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "tie_word_embeddings": True,
}
GEMMA3 = {
    **{k: v for k, v in GEMMA2.items() if k not in ("rope_theta",)},
    "model_type": "gemma3_text",
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "layer_types": ["sliding_attention", "full_attention"],
}
# (id, base, key, value, the field's name the one line must hold)
REFUSED = [
    ("qwen3-moe-dense-layers", QWEN3_MOE, "mlp_only_layers", [0]),
    ("qwen3-moe-sparse-step", QWEN3_MOE, "decoder_sparse_step", 2),
    ("qwen3-moe-attention-bias", QWEN3_MOE, "attention_bias", True),
    ("qwen3-moe-dropout", QWEN3_MOE, "attention_dropout", 0.1),
    ("qwen3-moe-act", QWEN3_MOE, "hidden_act", "gelu"),
    ("qwen3-moe-rope-yarn", QWEN3_MOE, "rope_scaling", {"rope_type": "yarn", "factor": 4.0}),
    ("gemma2-act", GEMMA2, "hidden_activation", "relu"),
    ("gemma2-hidden-act", GEMMA2, "hidden_act", "silu"),
    ("gemma2-attention-bias", GEMMA2, "attention_bias", True),
    ("gemma2-dropout", GEMMA2, "attention_dropout", 0.1),
    ("gemma2-bidirectional", GEMMA2, "use_bidirectional_attention", True),
    ("gemma2-softcap-string", GEMMA2, "attn_logit_softcapping", "50"),
    ("gemma2-softcap-negative", GEMMA2, "final_logit_softcapping", -1.0),
    ("gemma2-scalar", GEMMA2, "query_pre_attn_scalar", 0),
    # a window on layers 0 and 1 and full attention on 2 and 3: no "every N-th" pattern
    (
        "gemma2-layer-pattern",
        {**GEMMA2, "num_hidden_layers": 4},
        "layer_types",
        ["sliding_attention"] * 2 + ["full_attention"] * 2,
    ),
    ("gemma2-layer-count", GEMMA2, "layer_types", ["full_attention"]),
    ("gemma2-layer-kind", GEMMA2, "layer_types", ["chunked_attention"] * 2),
    # Gemma 3 4B and larger: linear RoPE scaling of the global layers (4.x and 5.x spellings)
    ("gemma3-rope-linear", GEMMA3, "rope_scaling", {"rope_type": "linear", "factor": 8.0}),
    (
        "gemma3-rope-nested",
        GEMMA3,
        "rope_parameters",
        {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
    ("gemma3-bidirectional", GEMMA3, "use_bidirectional_attention", True),
]


@pytest.mark.parametrize(
    ("base", "key", "value"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_feature_not_modelled_is_one_line_naming_the_field(tmp_path, base, key, value):
    d = _write(tmp_path, base, key, value)
    needle = "rope" if key.startswith("rope") else key
    _refused([f"--checkpoint.init_from={d}"], needle)
    _refused(["--model.name", str(d)], needle)  # plan / dryrun read it the same way


def test_qwen3_moe_and_gemma2_fields_are_read(tmp_path):
    (tmp_path / "q").mkdir()
    q = _write(tmp_path / "q", QWEN3_MOE, "norm_topk_prob", False)
    m = load_config(None, [f"--checkpoint.init_from={q}", "--batch.seq_len=64"]).model
    assert (m.num_experts, m.experts_per_token, m.ffn_dim) == (8, 2, 32)
    assert m.qk_norm and not m.moe_norm_topk and m.hf_model_type == "qwen3_moe"
    (tmp_path / "g").mkdir()
    g = _write(tmp_path / "g", GEMMA2, "layer_types", ["sliding_attention", "full_attention"])
    m = load_config(None, [f"--checkpoint.init_from={g}", "--batch.seq_len=64"]).model
    assert (m.sliding_window, m.full_attention_every, m.attn_scale_dim) == (32, 2, 16)
    assert (m.attn_softcap, m.logit_softcap, m.attention) == (50.0, 30.0, "naive")
    assert m.activation == "geglu" and m.post_norms and m.norm_plus_one and m.scale_embeddings
    # null turns a cap off; without the attention cap the SDPA core serves
    (tmp_path / "n").mkdir()
    n = _write(tmp_path / "n", GEMMA2, "attn_logit_softcapping", None)
    m = load_config(None, [f"--model.name={n}"]).model
    assert m.attn_softcap == 0.0 and m.attention == "sdpa" and m.logit_softcap == 30.0
    # Gemma 3, transformers 4.x spelling: the local base at the top level
    (tmp_path / "g3").mkdir()
    g3 = _write(tmp_path / "g3", {**GEMMA3, "rope_theta": 1e6}, "rope_local_base_freq", 1e4)
    m = load_config(None, [f"--model.name={g3}"]).model
    assert (m.rope_theta, m.rope_local_theta, m.full_attention_every) == (1e6, 1e4, 2)
    assert m.qk_norm and m.hf_model_type == "gemma3_text" and m.attention == "sdpa"


def test_ring_attention_refuses_gemma2_soft_capping_in_one_line(tmp_path, capsys):
    """The window (32) covers the sequence, so only the soft-capping stops ring attention: the
    layout is refused naming --cp and model.attn_softcap; cp=1 plans."""
    from scaletrain.cli import main

    d = _write(tmp_path, GEMMA2, "architectures", ["Gemma2ForCausalLM"])
    assert main(["plan", "--gpus=2", "--cp=2", "--seq-len=32", f"--model={d}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cp" in err[0] and "model.attn_softcap" in err[0], err
    assert main(["plan", "--gpus=2", "--seq-len=32", f"--model={d}"]) == 0
