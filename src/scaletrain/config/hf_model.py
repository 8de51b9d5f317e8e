"""A Hugging Face `config.json` (GPT-2, Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, Phi-3,
Gemma 2 or DeepSeek-V2/V3 style) read into a ModelConfig, every field checked for its JSON type
and range, unsupported features refused. Gemma 2's own fields are read in `hf_gemma`,
DeepSeek's in `hf_deepseek`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ._errors import ConfigError
from .hf_deepseek import (
    DEEPSEEK_KEYS,
    DEEPSEEK_TYPES,
    check_deepseek_supported,
    deepseek_export_problem,
    deepseek_from_hf,
)
from .model import ModelConfig
from .user_files import read_user_file

__all__ = ["model_from_hf_config", "hf_export_problem", "hf_model_type"]


def model_from_hf_config(path: str | Path) -> ModelConfig:
    """Load a Hugging Face `config.json` (GPT-2, Llama, Mistral, Mixtral, Qwen2 / Qwen2.5,
    Qwen3 dense, Qwen3-MoE, Phi-3 or Gemma 2 style) into a ModelConfig.

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
            f"; use a {_TYPES_IN_WORDS} config.json",
        )
    _check_hf_supported(hf, path)
    try:
        return _from_hf(hf, r, mtype, path)
    except ConfigError as e:  # a ModelConfig rule broken by the file's values: name its key
        if e.field == "model.name":
            raise
        ours = e.field.removeprefix("model.")
        keys = _GPT2_KEYS if mtype == "gpt2" else _LLAMA_KEYS
        if mtype in DEEPSEEK_TYPES:
            keys = DEEPSEEK_KEYS
        key = _TYPE_KEYS.get(mtype, {}).get(ours) or keys.get(ours, ours)
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
    "head_dim_override": "head_dim",
}
"""ModelConfig field -> the config.json key it is read from (for error messages)."""
_GEMMA_KEYS = {
    "attn_scale_dim": "query_pre_attn_scalar",
    "attn_softcap": "attn_logit_softcapping",
    "logit_softcap": "final_logit_softcapping",
    "rope_local_theta": "rope_local_base_freq",
}
_TYPE_KEYS = {
    "qwen3_moe": {"ffn_dim": "moe_intermediate_size", "num_experts": "num_experts"},
    "gemma2": _GEMMA_KEYS,
    "gemma3_text": _GEMMA_KEYS,
}
"""Where a model type reads a field from another key than `_LLAMA_KEYS` says."""


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
    if mtype in DEEPSEEK_TYPES:
        theta = _HFReader(_rope(hf), path).float("rope_theta", 10000.0)
        return deepseek_from_hf(hf, r, mtype, path, theta)
    if mtype in ("gemma2", "gemma3_text"):
        from .hf_gemma import gemma_from_hf

        return gemma_from_hf(hf, r, path)
    heads, width = r.int("num_attention_heads"), r.int("hidden_size")
    head_dim = r.int("head_dim", None)
    # an explicit head width only where it differs from hidden / heads (Qwen3-32B: 128 vs 80)
    override = head_dim if head_dim and (width % heads or head_dim != width // heads) else 0
    max_seq = r.int("max_position_embeddings", 4096)
    experts = r.int("num_local_experts", 0, lo=0) if mtype == "mixtral" else 0
    ffn = r.int("intermediate_size")
    if mtype == "qwen3_moe":  # every layer MoE (`_check_hf_supported`): experts of this width
        # (absent fields take transformers' Qwen3MoeConfig defaults: 128 experts of 768, top 8)
        experts = r.int("num_experts", None, lo=0)
        experts = r.int("num_local_experts", 128, lo=0) if experts is None else experts
        ffn = r.int("moe_intermediate_size", 768) if experts else ffn
    return ModelConfig(
        name=str(path),
        vocab_size=r.int("vocab_size"),
        dim=width,
        num_layers=r.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=r.int("num_key_value_heads", None) or heads,
        ffn_dim=ffn,
        max_seq_len=max_seq,
        norm="rmsnorm",
        activation="swiglu",
        position="rope",
        rope_theta=_HFReader(_rope(hf), path).float("rope_theta", 10000.0),
        tie_embeddings=r.bool("tie_word_embeddings", False),
        # Llama: attention_bias and mlp_bias both true is our `bias` (q/k/v/o and MLP; one
        # alone is refused); Qwen2 has q/k/v biases always (no field); the others none
        bias=r.bool("attention_bias", False) if mtype == "llama" else False,
        qkv_bias=mtype == "qwen2",
        qk_norm=mtype in ("qwen3", "qwen3_moe"),
        head_dim_override=override,
        # Phi-3 and Qwen3-MoE need naming: the others are told apart by their pieces ('auto')
        hf_model_type="phi3"
        if mtype == "phi3"
        else "qwen3_moe"
        if mtype == "qwen3_moe"
        else "auto",
        norm_eps=r.float("rms_norm_eps", 1e-6 if mtype.startswith("qwen") else 1e-5),
        num_experts=experts,
        experts_per_token=(
            r.int("num_experts_per_tok", 8 if mtype == "qwen3_moe" else 2) if experts else 2
        ),
        moe_aux_loss_coef=r.float(
            "router_aux_loss_coef", 0.001 if mtype == "qwen3_moe" else 0.01, lo=0.0
        ),
        # Qwen3-MoE's default is false (transformers' Qwen3MoeConfig); Mixtral renormalizes
        moe_norm_topk=r.bool("norm_topk_prob", False) if mtype == "qwen3_moe" else True,
        sliding_window=_window(hf, r, mtype) or 0,
    )


def _window(hf: dict[str, Any], r: _HFReader, mtype: str) -> int | None:
    """The sliding window every layer uses (None: full attention). Mistral, Mixtral and Phi-3
    apply `sliding_window` to every layer; Qwen2/Qwen3 only to the layers `layer_types` marks
    (transformers 5; older files: `use_sliding_window` and the layers from
    `max_window_layers` on). Our window is one for all layers: a mix is refused."""
    if mtype == "llama":
        return None
    if mtype == "qwen3_moe":  # one window for every layer, off unless use_sliding_window
        return r.int("sliding_window", None) if r.bool("use_sliding_window", False) else None
    if mtype not in ("qwen2", "qwen3"):
        window = r.int("sliding_window", None)
        return window if r.bool("use_sliding_window", True) else None
    kinds = hf.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or not set(kinds) <= {"full_attention", "sliding_attention"}:
            r._fail("layer_types", kinds, "must list 'full_attention' / 'sliding_attention'")
        if set(kinds) == {"full_attention", "sliding_attention"}:
            r._fail("layer_types", kinds, "mixes sliding and full attention layers: unsupported")
        return r.int("sliding_window") if "sliding_attention" in kinds else None
    if not r.bool("use_sliding_window", False):
        return None
    first = r.int("max_window_layers", 28, lo=0)
    if first >= r.int("num_hidden_layers"):
        return None
    if first > 0:
        r._fail("max_window_layers", first, "leaves some layers without the window: unsupported")
    return r.int("sliding_window")


_HF_TYPES = (
    "gpt2",
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "phi3",
    "gemma2",
    "gemma3_text",
    *DEEPSEEK_TYPES,
)
_TYPES_IN_WORDS = (
    "gpt2, llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, phi3, gemma2, gemma3_text, "
    "deepseek_v2 or deepseek_v3"
)
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

    def refuse(what: str, fix: str = "") -> None:
        raise ConfigError(
            "model.name",
            str(path),
            f"{what} is not supported; {fix or f'use a plain {_TYPES_IN_WORDS} config.json'}",
        )

    r = _HFReader(hf, path)
    if hf.get("rope_parameters") is not None and not isinstance(hf["rope_parameters"], dict):
        r._fail("rope_parameters", hf["rope_parameters"], "must be a JSON object")
    # DeepSeek-V3's YaRN (its 128K extension): not built; without it the model trains at
    # its 4K pre-training length
    yarn_fix = (
        "remove it from config.json to train with plain RoPE at max_position_embeddings"
        if hf.get("model_type") in DEEPSEEK_TYPES
        else ""
    )
    if hf.get("rope_scaling"):  # transformers 4.x spelling (Phi-3-128k's longrope, YaRN, ...)
        refuse(f"rope scaling (rope_scaling = {hf['rope_scaling']!r})", yarn_fix)
    if _rope(hf).get("rope_type", "default") != "default":
        kind = _rope(hf)["rope_type"]
        refuse(f"rope scaling (rope_parameters.rope_type = {kind!r})", yarn_fix)
    rotary = _HFReader(_rope(hf), path).float("partial_rotary_factor", 1.0)
    if rotary != 1.0:  # RoPE on a part of each head (Phi-3.5 / Phi-4-mini): not modelled
        refuse(f"partial_rotary_factor = {rotary} (RoPE on part of each head)")
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
    elif hf["model_type"] in ("gemma2", "gemma3_text"):
        from .hf_gemma import gemma_problems

        gemma_problems(hf, r, refuse)
    else:
        if hf.get("hidden_act", "silu") != "silu":
            refuse(f"hidden_act {hf['hidden_act']!r}")
        attn_bias, mlp_bias = r.bool("attention_bias", False), r.bool("mlp_bias", False)
        if hf["model_type"] == "llama" and attn_bias != mlp_bias:  # our `bias` is both or none
            on, off = (
                ("attention_bias", "mlp_bias") if attn_bias else ("mlp_bias", "attention_bias")
            )
            where = "q/k/v/o" if attn_bias else "the MLP"
            refuse(f"{on} = true with {off} = false (biases on {where} only)")
        if hf["model_type"] != "llama" and (attn_bias or mlp_bias):
            # transformers' Mistral, Mixtral, Qwen2 and Phi-3 read neither field (their files'
            # biases would be dropped); Qwen3's and Qwen3-MoE's attention_bias biases q/k/v/o
            # without the MLP, which `bias` cannot express
            refuse(f"{'attention_bias' if attn_bias else 'mlp_bias'} = true on {hf['model_type']}")
        if hf["model_type"] == "qwen3_moe":
            _qwen3_moe_problems(hf, r, refuse)
        if hf["model_type"] in ("qwen2", "qwen3", "qwen3_moe", "phi3"):
            for key in ("attention_dropout", "resid_pdrop", "embd_pdrop"):
                if r.float(key, 0.0, lo=0.0) != 0.0:  # dropout is not modelled
                    refuse(f"{key} = {hf[key]} (dropout)")
    if gpt2 and r.int("head_dim", None) not in (None, r.int("n_embd") // r.int("n_head")):
        refuse(f"head_dim {hf['head_dim']} != n_embd / n_head")
    if hf["model_type"] in DEEPSEEK_TYPES:
        check_deepseek_supported(hf, r, refuse)


def _deepseek_pieces(cfg: ModelConfig) -> bool:
    """Whether `cfg` has a piece only the DeepSeek architectures hold."""
    return bool(
        cfg.is_mla
        or cfg.num_shared_experts
        or cfg.num_dense_layers
        or (cfg.is_moe and cfg.router_scoring != "topk_softmax")
    )


def _qwen3_moe_problems(hf: dict[str, Any], r: _HFReader, refuse: Any) -> None:
    """Qwen3-MoE's dense/sparse layer mix: every layer here is MoE (the published sizes), so
    `mlp_only_layers` must be empty and `decoder_sparse_step` 1."""
    dense = hf.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(type(i) is int for i in dense):
        r._fail("mlp_only_layers", dense, "must be a list of layer indices")
    if dense:
        refuse(f"mlp_only_layers = {dense} (dense MLP layers among the MoE ones)")
    step = r.int("decoder_sparse_step", 1)
    if step != 1 and r.int("num_experts", 1, lo=0):
        refuse(f"decoder_sparse_step = {step} (MoE on every {step}-th layer only)")


def hf_model_type(cfg: ModelConfig) -> str:
    """The Hugging Face `model_type` `cfg` exports as: `cfg.hf_model_type`, or for 'auto'
    the one its pieces name (DeepSeek MLA or routing: deepseek_v2 or v3, sigmoid
    scoring naming v3; Gemma's post-norms: gemma2, with q/k norms gemma3_text; experts
    with q/k norms: qwen3_moe;
    experts: mixtral; q/k norms: qwen3; q/k/v biases alone: qwen2; a sliding window:
    mistral; else llama; LayerNorm: gpt2)."""
    if cfg.hf_model_type != "auto":
        return cfg.hf_model_type
    if _deepseek_pieces(cfg):
        return "deepseek_v3" if cfg.router_scoring == "sigmoid" else "deepseek_v2"
    if cfg.post_norms:
        return "gemma3_text" if cfg.qk_norm else "gemma2"
    if cfg.is_moe:
        return "qwen3_moe" if cfg.qk_norm else "mixtral"
    if cfg.family == "gpt2":
        return "gpt2"
    if cfg.qk_norm:
        return "qwen3"
    if cfg.qkv_bias:
        return "qwen2"
    return "mistral" if cfg.sliding_window else "llama"


def hf_export_problem(cfg: ModelConfig) -> str | None:
    """Why `cfg` has no Hugging Face architecture to export as (None: it has one). The one
    home of these rules: checkpoint.hf refuses the export with them, and a job with
    checkpoint.export_hf = true is refused with them at config time, before training."""
    kind = hf_model_type(cfg)
    if kind in DEEPSEEK_TYPES:
        return deepseek_export_problem(cfg, kind)
    if _deepseek_pieces(cfg):
        return (
            "Multi-head Latent Attention, DeepSeek routing, shared experts and dense first "
            "blocks export as deepseek_v2 or deepseek_v3 only"
        )
    gemma = kind in ("gemma2", "gemma3_text")
    if not gemma and (why := _gemma_pieces(cfg)):
        return f"{why} export as gemma2 or gemma3_text only"
    if kind == "gpt2":
        if (
            cfg.norm != "layernorm"
            or cfg.gated_mlp
            or cfg.position != "learned"
            or not cfg.bias
            or cfg.num_kv_heads != cfg.num_heads
            or cfg.is_moe
            or cfg.sliding_window
            or cfg.qkv_bias
            or cfg.qk_norm
            or cfg.head_dim_override not in (0, cfg.dim // cfg.num_heads)
        ):
            return (
                "the GPT-2 family needs layernorm, gelu, learned positions, bias=True, "
                "num_kv_heads == num_heads and none of experts, sliding_window, qkv_bias, "
                "qk_norm, head_dim_override"
            )
        return None
    if gemma:
        return _gemma_export_problem(cfg, kind)
    plain = cfg.norm == "rmsnorm" and cfg.activation == "swiglu" and cfg.position == "rope"
    moe_kinds = ("mixtral", "qwen3_moe")
    if cfg.is_moe != (kind in moe_kinds) or (kind in moe_kinds and (cfg.bias or not plain)):
        return "MoE models export as Mixtral or Qwen3-MoE only (rmsnorm, swiglu, rope, no bias)"
    if kind == "mixtral" and not cfg.moe_norm_topk:
        return "Mixtral renormalizes its top-k weights (moe_norm_topk=false exports as qwen3_moe)"
    if not plain:
        return f"the Llama family ({kind}) needs activation='swiglu' and position='rope'"
    if cfg.bias and kind != "llama":
        return f"{kind} has no biases on every linear (bias=True exports as llama only)"
    if cfg.qkv_bias != (kind == "qwen2"):
        return "q/k/v biases alone (qkv_bias) export as qwen2 only, and qwen2 needs them"
    if cfg.qk_norm != (kind in ("qwen3", "qwen3_moe")):
        return "per-head q/k norms (qk_norm) export as qwen3 / qwen3_moe only, and those need them"
    if cfg.sliding_window and kind == "llama":
        return "a sliding window exports as Mistral, Mixtral, Qwen2, Qwen3 or Phi-3, not Llama"
    if kind == "phi3" and cfg.head_dim_override not in (0, cfg.dim // cfg.num_heads):
        return "phi3 has no head_dim of its own (head_dim_override)"
    return None


def _gemma_pieces(cfg: ModelConfig) -> str | None:
    """The Gemma-only pieces `cfg` uses, in words (None: none)."""
    fields = (
        "post_norms",
        "norm_plus_one",
        "scale_embeddings",
        "attn_softcap",
        "logit_softcap",
        "full_attention_every",
        "rope_local_theta",
    )
    used = [f for f in fields if getattr(cfg, f)]
    if cfg.activation == "geglu":
        used.append("activation='geglu'")
    if cfg.attn_scale_dim not in (0, cfg.head_dim):
        used.append("attn_scale_dim")
    return ", ".join(used) or None


def _gemma_export_problem(cfg: ModelConfig, kind: str) -> str | None:
    """Gemma 2's block: GeGLU, RoPE, (1 + w) RMSNorms before and after each sub-layer, scaled
    embeddings, no biases, no q/k norms, no experts, one RoPE base; Gemma 3's adds the q/k
    norms and may give its windowed layers their own base."""
    if not (
        cfg.norm == "rmsnorm"
        and cfg.norm_plus_one
        and cfg.post_norms
        and cfg.scale_embeddings
        and cfg.activation == "geglu"
        and cfg.position == "rope"
    ):
        return (
            f"{kind} needs norm='rmsnorm', norm_plus_one, post_norms, scale_embeddings, "
            "activation='geglu' and position='rope'"
        )
    if cfg.bias or cfg.qkv_bias or cfg.is_moe:
        return f"{kind} has no biases or experts"
    if kind == "gemma2" and (cfg.qk_norm or cfg.rope_local_theta):
        return "q/k norms and a local RoPE base (rope_local_theta) export as gemma3_text"
    if kind == "gemma3_text" and not cfg.qk_norm:
        return "gemma3_text has q/k norms (qk_norm)"
    return None
