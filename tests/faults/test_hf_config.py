"""Hugging Face config.json faults (checkpoint.init_from directories and --model.name=*.json):
a missing or mistyped field, a non-finite number, an unsupported architecture or feature is one
line naming config.json and the field, never a traceback and never silently ignored."""

from __future__ import annotations

import json
import os

import pytest

from scaletrain.config import ConfigError, load_config

_DEL = object()

LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 128,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
GPT2 = {
    "model_type": "gpt2",
    "vocab_size": 256,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 128,
    "layer_norm_epsilon": 1e-5,
    "activation_function": "gelu_new",
}
MIXTRAL = {**LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}

LLAMA_INTS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "num_key_value_heads",
)
GPT2_INTS = ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions")
BAD_INTS = ("64", 64.5, True, [64], -1, {"v": 1})

CASES: list[tuple[str, dict, str, object]] = []  # (id, base, key, value or _DEL)
for k in (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
):
    CASES.append((f"llama-missing-{k}", LLAMA, k, _DEL))
for k in GPT2_INTS:
    CASES.append((f"gpt2-missing-{k}", GPT2, k, _DEL))
for k in LLAMA_INTS:
    CASES += [(f"llama-{k}={v!r}", LLAMA, k, v) for v in BAD_INTS]
for k in GPT2_INTS:
    CASES += [(f"gpt2-{k}={v!r}", GPT2, k, v) for v in ("64", 1.5, False, 0)]
for k, base in (("rope_theta", LLAMA), ("rms_norm_eps", LLAMA), ("layer_norm_epsilon", GPT2)):
    CASES += [
        (f"{base['model_type']}-{k}={v!r}", base, k, v)
        for v in (float("nan"), float("inf"), -1.0, 0, "1e4", True)
    ]
for k, base in (
    ("tie_word_embeddings", LLAMA),
    ("attention_bias", LLAMA),
    ("tie_word_embeddings", GPT2),
    ("mlp_bias", LLAMA),
):
    CASES += [(f"{base['model_type']}-{k}={v!r}", base, k, v) for v in ("yes", 1)]
CASES += [
    ("mixtral-experts=-1", MIXTRAL, "num_local_experts", -1),
    ("mixtral-experts='8'", MIXTRAL, "num_local_experts", "8"),
    ("mixtral-per-token=0", MIXTRAL, "num_experts_per_tok", 0),
    ("mixtral-per-token>experts", MIXTRAL, "num_experts_per_tok", 9),
    ("mixtral-per-token=1.5", MIXTRAL, "num_experts_per_tok", 1.5),
    ("mixtral-aux=nan", MIXTRAL, "router_aux_loss_coef", float("nan")),
    ("mixtral-aux=-1", MIXTRAL, "router_aux_loss_coef", -1.0),
    ("llama-kv-heads=3", LLAMA, "num_key_value_heads", 3),
    ("llama-heads=5", LLAMA, "num_attention_heads", 5),
    ("gpt2-heads=5", GPT2, "n_head", 5),
    ("llama-head_dim=0", LLAMA, "head_dim", 0),
    ("llama-head_dim-str", LLAMA, "head_dim", "16"),
    ("mistral-window-str", {**LLAMA, "model_type": "mistral"}, "sliding_window", "4096"),
]
# unsupported architectures and features: refused, never ignored
UNSUPPORTED = [
    ("bert", LLAMA, "model_type", "bert"),
    ("jamba", LLAMA, "model_type", "jamba"),
    ("deepseek-v3", LLAMA, "model_type", "deepseek_v3"),
    ("gemma", LLAMA, "model_type", "gemma"),
    ("type-empty", LLAMA, "model_type", ""),
    ("type-int", LLAMA, "model_type", 5),
    ("type-missing", LLAMA, "model_type", _DEL),
    ("lama-typo", LLAMA, "model_type", "lama"),
    ("rope-linear", LLAMA, "rope_scaling", {"type": "linear", "factor": 2.0}),
    ("rope-yarn", LLAMA, "rope_scaling", {"rope_type": "yarn", "factor": 4.0}),
    ("rope-llama3", LLAMA, "rope_scaling", {"rope_type": "llama3", "factor": 8.0}),
    ("rope-params-dynamic", LLAMA, "rope_parameters", {"rope_type": "dynamic"}),
    ("rope-params-list", LLAMA, "rope_parameters", [1, 2]),
    ("act-gelu", LLAMA, "hidden_act", "gelu"),
    ("act-relu", LLAMA, "hidden_act", "relu"),
    ("act-int", LLAMA, "hidden_act", 5),
    ("mixtral-act", MIXTRAL, "hidden_act", "gelu_pytorch_tanh"),
    ("gpt2-relu", GPT2, "activation_function", "relu"),
    ("gpt2-inverse-layer-scale", GPT2, "scale_attn_by_inverse_layer_idx", True),
    ("gpt2-upcast", GPT2, "reorder_and_upcast_attn", True),
    ("gpt2-unscaled", GPT2, "scale_attn_weights", False),
    ("gpt2-cross", GPT2, "add_cross_attention", True),
    ("mlp-bias", LLAMA, "mlp_bias", True),
    ("quantized", LLAMA, "quantization_config", {"quant_method": "gptq", "bits": 4}),
]


def _write(tmp_path, base, key, value):
    hf = dict(base)
    if value is _DEL:
        hf.pop(key, None)
    else:
        hf[key] = value
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(hf))
    return d


def _refused(args, *needles):
    with pytest.raises(ConfigError) as e:
        load_config(None, args)
    msg = str(e.value)
    assert "\n" not in msg and "config.json" in msg, msg
    for n in needles:
        assert n in msg, (n, msg)


@pytest.mark.parametrize(
    ("base", "key", "value"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_field_is_one_line_naming_file_and_field(tmp_path, base, key, value):
    d = _write(tmp_path, base, key, value)
    _refused(
        [f"--checkpoint.init_from={d}"],
        key if value is _DEL or key in ("rope_theta", "rms_norm_eps", "layer_norm_epsilon") else "",
    )


@pytest.mark.parametrize(
    ("base", "key", "value"), [c[1:] for c in UNSUPPORTED], ids=[c[0] for c in UNSUPPORTED]
)
def test_unsupported_architecture_or_feature_is_refused(tmp_path, base, key, value):
    d = _write(tmp_path, base, key, value)
    _refused(["--model.name", str(d / "config.json")])


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b"", "empty"),
        (b"{", "truncated"),
        (b"[1, 2]", "array"),
        (b'"llama"', "string"),
        (b"null", "null"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"{'model_type': 'llama'}", "quotes"),
    ],
)
def test_unreadable_config_json(tmp_path, content, what):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_bytes(content)
    _refused([f"--checkpoint.init_from={d}"])


def test_config_json_that_is_a_directory(tmp_path):
    (tmp_path / "hf" / "config.json").mkdir(parents=True)
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"--checkpoint.init_from={tmp_path / 'hf'}"])
    assert "config.json" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "oversized"])
def test_config_json_that_is_not_a_small_regular_file_is_never_read(tmp_path, kind):
    # a named pipe would block the reader forever, /dev/zero never ends, and a mistyped path
    # to a weights file would be read whole: each is refused from its stat() alone
    d = tmp_path / "hf"
    d.mkdir()
    f = d / "config.json"
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "dev-zero":
        f.symlink_to("/dev/zero")
    else:
        f.write_bytes(b" " * (16 * 2**20 + 1))
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"--model.name={d}"])
    msg = str(e.value)
    assert e.value.field == "model.name" and "\n" not in msg, msg
    assert ("too large" if kind == "oversized" else "not a regular file") in msg, msg


QWEN2 = {**LLAMA, "model_type": "qwen2", "use_sliding_window": False, "max_window_layers": 2}
QWEN3 = {**LLAMA, "model_type": "qwen3", "head_dim": 32}
PHI3 = {**LLAMA, "model_type": "phi3", "resid_pdrop": 0.0, "embd_pdrop": 0.0}
# (id, base, key, value, the words the one line must hold: the field's name)
FAMILY_REFUSED = [
    ("qwen2-mixed-layers", QWEN2, "layer_types", ["full_attention", "sliding_attention"]),
    ("qwen2-layer-kind", QWEN2, "layer_types", ["chunked_attention"] * 2),
    ("qwen2-partial-window", {**QWEN2, "use_sliding_window": True}, "max_window_layers", 1),
    ("qwen3-attention-bias", QWEN3, "attention_bias", True),
    # Llama's two bias fields are our `bias` together (q/k/v/o and MLP); one alone is refused
    ("llama-attention-bias-alone", LLAMA, "attention_bias", True),
    ("llama-mlp-bias-alone", LLAMA, "mlp_bias", True),
    ("llama-mlp-bias-without-attention", {**LLAMA, "attention_bias": False}, "mlp_bias", True),
    # families whose transformers model reads neither field: the file's biases would be lost
    ("mistral-attention-bias", {**LLAMA, "model_type": "mistral"}, "attention_bias", True),
    ("mixtral-attention-bias", MIXTRAL, "attention_bias", True),
    ("qwen2-mlp-bias", QWEN2, "mlp_bias", True),
    ("phi3-attention-bias", PHI3, "attention_bias", True),
    ("qwen3-dropout", QWEN3, "attention_dropout", 0.1),
    ("phi3-partial-rotary", PHI3, "partial_rotary_factor", 0.75),
    ("phi3-longrope", PHI3, "rope_scaling", {"type": "longrope", "short_factor": [1.0]}),
    (
        "phi3-longrope-params",
        PHI3,
        "rope_parameters",
        {"rope_type": "longrope", "rope_theta": 1e4},
    ),
    ("phi3-resid-dropout", PHI3, "resid_pdrop", 0.1),
    ("phi3-embd-dropout", PHI3, "embd_pdrop", 0.1),
]


@pytest.mark.parametrize(
    ("base", "key", "value"), [c[1:] for c in FAMILY_REFUSED], ids=[c[0] for c in FAMILY_REFUSED]
)
def test_qwen_and_phi3_features_not_modelled_are_one_line_naming_the_field(
    tmp_path, base, key, value
):
    d = _write(tmp_path, base, key, value)
    needle = "rope_type" if key == "rope_parameters" else key
    _refused([f"--checkpoint.init_from={d}"], needle)
    _refused(["--model.name", str(d)], needle)  # plan / dryrun read it the same way


@pytest.mark.parametrize(
    ("base", "key", "value", "window"),
    [
        (QWEN2, "use_sliding_window", False, 0),
        ({**QWEN2, "sliding_window": 16}, "use_sliding_window", True, 0),  # all layers < 2
        ({**QWEN2, "use_sliding_window": True, "sliding_window": 16}, "max_window_layers", 0, 16),
        ({**QWEN2, "sliding_window": 16}, "layer_types", ["sliding_attention"] * 2, 16),
        ({**QWEN2, "sliding_window": 16}, "layer_types", ["full_attention"] * 2, 0),
        ({**PHI3, "sliding_window": 16}, "architectures", ["Phi3ForCausalLM"], 16),
    ],
    ids=["qwen2-off", "qwen2-no-layer", "qwen2-all-layers", "types-sliding", "types-full", "phi3"],
)
def test_qwen_and_phi3_windows_apply_to_every_layer_or_none(tmp_path, base, key, value, window):
    d = _write(tmp_path, base, key, value)
    assert load_config(None, [f"--checkpoint.init_from={d}"]).model.sliding_window == window


def test_sliding_window_is_read_and_runs_past_the_window(tmp_path):
    """Mistral's window is modelled (a band mask, tests/integration/test_sliding_window.py):
    sequences longer than it train; `use_sliding_window: false` turns it off."""
    d = _write(tmp_path, {**LLAMA, "model_type": "mistral"}, "sliding_window", 32)
    job = load_config(None, [f"--checkpoint.init_from={d}", "--batch.seq_len=64"])
    assert job.model.sliding_window == 32 and job.model.max_seq_len >= 64
    (tmp_path / "off").mkdir()
    off = _write(
        tmp_path / "off",
        {**LLAMA, "model_type": "mistral", "sliding_window": 32},
        "use_sliding_window",
        False,
    )
    assert load_config(None, [f"--checkpoint.init_from={off}"]).model.sliding_window == 0


@pytest.mark.parametrize("base", [LLAMA, GPT2, MIXTRAL], ids=["llama", "gpt2", "mixtral"])
def test_good_configs_still_load(tmp_path, base):
    d = _write(tmp_path, base, "architectures", ["X"])
    job = load_config(None, [f"--checkpoint.init_from={d}", "--batch.seq_len=64"])
    assert job.model.dim == 64 and job.model.vocab_size == 256


@pytest.mark.parametrize(
    "act,ours", [("gelu_new", "gelu"), ("gelu_pytorch_tanh", "gelu"), ("gelu", "gelu_exact")]
)
def test_gpt2_gelu_forms_map_to_ours(tmp_path, act, ours):
    """HF's "gelu" is the erf form (our gelu_exact); its tanh forms are our "gelu"."""
    d = _write(tmp_path, GPT2, "activation_function", act)
    job = load_config(None, [f"--checkpoint.init_from={d}", "--batch.seq_len=64"])
    assert job.model.activation == ours


EXPORT_BAD = [
    ("tiny-llama", {"activation": "gelu_exact"}, "the Llama family"),  # rope + gelu: no HF arch
    ("tiny-llama", {"activation": "gelu"}, "the Llama family"),
    ("tiny", {"activation": "swiglu"}, "the GPT-2 family"),
    ("tiny", {"position": "rope"}, "the GPT-2 family"),
    ("tiny", {"bias": False}, "the GPT-2 family"),
]


@pytest.mark.parametrize(
    ("name", "fields", "needle"), EXPORT_BAD, ids=[f"{n}-{f}" for n, f, _ in EXPORT_BAD]
)
def test_export_hf_of_a_model_with_no_hf_architecture_is_refused_before_training(
    name, fields, needle
):
    """checkpoint.export_hf = true with a model HF has no architecture for: one ConfigError
    naming checkpoint.export_hf at config time (it was a ValueError traceback after training)."""
    overrides = {"model": {"name": name, **fields}, "checkpoint": {"export_hf": True}}
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert e.value.field == "checkpoint.export_hf" and needle in str(e.value)
    assert "\n" not in str(e.value)
    load_config(None, {**overrides, "checkpoint": {"export_hf": False}})  # trains as before


@pytest.mark.parametrize(
    "model",
    [{"name": "tiny"}, {"name": "tiny", "activation": "gelu_exact"}, {"name": "tiny-llama"}],
    ids=lambda m: "-".join(map(str, m.values())),
)
def test_export_hf_of_exportable_models_still_loads(model):
    job = load_config(None, {"model": model, "checkpoint": {"export_hf": True}})
    assert job.checkpoint.export_hf and job.model.activation == model.get(
        "activation", job.model.activation
    )
