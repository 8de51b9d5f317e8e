"""A Hugging Face `config.json` (GPT-2, Llama, Mistral or Mixtral style) read into a
ModelConfig, every field checked for its JSON type and range, unsupported features refused."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ._errors import ConfigError
from .model import ModelConfig
from .user_files import read_user_file

__all__ = ["model_from_hf_config", "hf_export_problem"]


def model_from_hf_config(path: str | Path) -> ModelConfig:
    """Load a Hugging Face `config.json` (GPT-2, Llama, Mistral or Mixtral style) into a
    ModelConfig.

    Every field read is checked for its JSON type and range (`_HFReader`): a string where a
    number belongs, a boolean, a float for a count, a non-finite float (Python's json reads
    `NaN` and `Infinity`) or a missing required field is one `ConfigError` naming the file and
    the field, never a KeyError/TypeError later. Features this model code does not implement
    are refused (`_check_hf_supported`), never ignored.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    raw = read_user_file(path, "model.name", what="a Hugging Face config.json")
    try:
        hf = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            "model.name", str(path), f"give a readable UTF-8 JSON config.json ({_one_line(e)})"
        ) from None
    if not isinstance(hf, dict):
        raise ConfigError(
            "model.name", str(path), f"config.json must hold a JSON object, not {type(hf).__name__}"
        )
    r = _HFReader(hf, path)
    mtype = hf.get("model_type")
    if not isinstance(mtype, str) or mtype not in _HF_TYPES:
        from .strict import did_you_mean

        raise ConfigError(
            "model.name",
            str(path),
            f"model_type {mtype!r} is not supported"
            f"{did_you_mean(str(mtype), _HF_TYPES)}"
            "; use a gpt2, llama, mistral or mixtral config.json",
        )
    _check_hf_supported(hf, path)
    try:
        return _from_hf(hf, r, mtype, path)
    except ConfigError as e:  # a ModelConfig rule broken by the file's values: name its key
        if e.field == "model.name":
            raise
        ours = e.field.removeprefix("model.")
        key = (_GPT2_KEYS if mtype == "gpt2" else _LLAMA_KEYS).get(ours, ours)
        raise ConfigError(
            "model.name", str(path), f"config.json field {key!r} = {e.value!r}: {e.fix}"
        ) from None


_GPT2_KEYS = {
    "vocab_size": "vocab_size",
    "dim": "n_embd",
    "num_layers": "n_layer",
    "num_heads": "n_head",
    "ffn_dim": "n_inner",
    "max_seq_len": "n_positions",
    "norm_eps": "layer_norm_epsilon",
}
_LLAMA_KEYS = {
    "dim": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "ffn_dim": "intermediate_size",
    "max_seq_len": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
    "num_experts": "num_local_experts",
    "experts_per_token": "num_experts_per_tok",
    "moe_aux_loss_coef": "router_aux_loss_coef",
}
"""ModelConfig field -> the config.json key it is read from (for error messages)."""


def _from_hf(hf: dict[str, Any], r: _HFReader, mtype: str, path: Path) -> ModelConfig:
    if mtype == "gpt2":
        return ModelConfig(
            name=str(path),
            vocab_size=r.int("vocab_size"),
            dim=r.int("n_embd"),
            num_layers=r.int("n_layer"),
            num_heads=r.int("n_head"),
            ffn_dim=r.int("n_inner", None) or 0,
            max_seq_len=r.int("n_positions"),
            norm="layernorm",
            position="learned",
            # HF's "gelu" is the erf form; "gelu_new" / "gelu_pytorch_tanh" the tanh one
            activation="gelu_exact" if hf.get("activation_function") == "gelu" else "gelu",
            tie_embeddings=r.bool("tie_word_embeddings", True),
            bias=True,
            norm_eps=r.float("layer_norm_epsilon", 1e-5),
        )
    heads = r.int("num_attention_heads")
    max_seq = r.int("max_position_embeddings", 4096)
    window = r.int("sliding_window", None) if mtype != "llama" else None
    if not r.bool("use_sliding_window", True):  # Qwen-style switch, honoured if present
        window = None
    experts = r.int("num_local_experts", 0, lo=0) if mtype == "mixtral" else 0
    return ModelConfig(
        name=str(path),
        vocab_size=r.int("vocab_size"),
        dim=r.int("hidden_size"),
        num_layers=r.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=r.int("num_key_value_heads", None) or heads,
        ffn_dim=r.int("intermediate_size"),
        max_seq_len=max_seq,
        norm="rmsnorm",
        activation="swiglu",
        position="rope",
        rope_theta=_HFReader(_rope(hf), path).float("rope_theta", 10000.0),
        tie_embeddings=r.bool("tie_word_embeddings", False),
        bias=r.bool("attention_bias", False),
        norm_eps=r.float("rms_norm_eps", 1e-5),
        num_experts=experts,
        experts_per_token=r.int("num_experts_per_tok", 2) if experts else 2,
        moe_aux_loss_coef=r.float("router_aux_loss_coef", 0.01, lo=0.0),
        sliding_window=window or 0,
    )


_HF_TYPES = ("gpt2", "llama", "mistral", "mixtral")
_REQUIRED: Any = object()


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class _HFReader:
    """Typed reads of a config.json's fields; each failure names the file and the field."""

    def __init__(self, hf: dict[str, Any], path: Path):
        self.hf, self.path = hf, path

    def _get(self, key: str, default: Any) -> Any:
        if key not in self.hf or (self.hf[key] is None and default is not _REQUIRED):
            if default is _REQUIRED:
                self._fail(key, "missing", "is required")
            return default
        return self.hf[key]

    def _fail(self, key: str, v: Any, why: str) -> None:
        shown = v if v == "missing" else repr(v)
        raise ConfigError(
            "model.name", str(self.path), f"config.json field {key!r} = {shown} {why}"
        )

    def int(self, key: str, default: Any = _REQUIRED, lo: int = 1) -> Any:
        v = self._get(key, default)
        if v is default:
            return v
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            self._fail(key, v, f"must be an integer >= {lo}")
        return v

    def float(self, key: str, default: Any = _REQUIRED, lo: float | None = None) -> Any:
        v = self._get(key, default)
        if v is default:
            return v
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (v < lo if lo is not None else v <= 0):
            self._fail(
                key, v, "must be a finite number " + (f">= {lo}" if lo is not None else "> 0")
            )
        return float(v)

    def bool(self, key: str, default: Any = _REQUIRED) -> Any:
        v = self._get(key, default)
        if not isinstance(v, bool):
            self._fail(key, v, "must be true or false")
        return v


def _rope(hf: dict[str, Any]) -> dict[str, Any]:
    """RoPE settings: transformers 5 nests them in `rope_parameters`, 4.x kept `rope_theta`
    (and `rope_scaling`) at the top level."""
    return {**hf, **(hf.get("rope_parameters") or {})}


def _check_hf_supported(hf: dict[str, Any], path: Path) -> None:
    """Refuse config.json features this model code does not implement (one line each): they
    would change the model's arithmetic if ignored."""

    def refuse(what: str) -> None:
        raise ConfigError(
            "model.name",
            str(path),
            f"{what} is not supported; use a plain GPT-2, Llama, Mistral or Mixtral config.json",
        )

    r = _HFReader(hf, path)
    if hf.get("rope_parameters") is not None and not isinstance(hf["rope_parameters"], dict):
        r._fail("rope_parameters", hf["rope_parameters"], "must be a JSON object")
    if hf.get("rope_scaling") or _rope(hf).get("rope_type", "default") != "default":
        refuse(f"rope scaling {hf.get('rope_scaling') or _rope(hf).get('rope_type')!r}")
    if hf.get("quantization_config"):
        refuse("a quantized checkpoint (quantization_config)")
    gpt2 = hf["model_type"] == "gpt2"
    if gpt2:
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
            refuse(f"activation_function {act!r}")
        for key, plain in (
            ("scale_attn_by_inverse_layer_idx", False),
            ("reorder_and_upcast_attn", False),
            ("scale_attn_weights", True),
            ("add_cross_attention", False),
        ):
            if r.bool(key, plain) != plain:
                refuse(f"{key} = {not plain}")
    else:
        if hf.get("hidden_act", "silu") != "silu":
            refuse(f"hidden_act {hf['hidden_act']!r}")
        if r.bool("mlp_bias", False):
            refuse("mlp_bias = true")
    heads = r.int("n_head" if gpt2 else "num_attention_heads")
    width = r.int("n_embd" if gpt2 else "hidden_size")
    if r.int("head_dim", None) not in (None, width // heads):
        refuse(f"head_dim {hf['head_dim']} != hidden_size / num_attention_heads")


def hf_export_problem(cfg: ModelConfig) -> str | None:
    """Why `cfg` has no Hugging Face architecture to export as (None: it has one). The one
    home of these rules: checkpoint.hf refuses the export with them, and a job with
    checkpoint.export_hf = true is refused with them at config time, before training."""
    if cfg.is_moe and (cfg.family != "llama" or cfg.bias):
        return "MoE models export as Mixtral only (rmsnorm, swiglu, rope, bias=False)"
    if cfg.sliding_window and (cfg.family != "llama" or (cfg.bias and not cfg.is_moe)):
        return (
            "a sliding window exports as Mistral or Mixtral only (rmsnorm, swiglu, rope, "
            "bias=False)"
        )
    if cfg.family == "llama":
        if cfg.activation != "swiglu" or cfg.position != "rope":
            return "the Llama family needs activation='swiglu' and position='rope'"
    elif (
        cfg.norm != "layernorm"
        or cfg.activation == "swiglu"
        or cfg.position != "learned"
        or not cfg.bias
        or cfg.num_kv_heads != cfg.num_heads
    ):
        return (
            "the GPT-2 family needs layernorm, gelu, learned positions, bias=True and "
            "num_kv_heads == num_heads"
        )
    return None
