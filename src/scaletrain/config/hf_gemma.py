"""Gemma 2's and Gemma 3's text `config.json` (model_type 'gemma2', 'gemma3_text') read into a
ModelConfig, and the fields this model code does not implement refused (one line each). The
reader and the refusal format are `hf_model`'s; this module holds what only Gemma has.

Gemma 2 (Gemma Team 2024; transformers' `Gemma2Config`): GeGLU with tanh-GELU
(`hidden_activation`), embeddings times sqrt(hidden_size), (1 + w) RMSNorms before and after
each sub-layer, attention scores scaled by 1/sqrt(`query_pre_attn_scalar`) and soft-capped
(`attn_logit_softcapping`), final logits soft-capped (`final_logit_softcapping`), sliding-window
and global layers alternating (`layer_types`, or every other layer from a sliding first one
when absent), a tied head.

Gemma 3 (transformers' `Gemma3TextConfig`): the same block without soft-capping, plus (1 + w)
RMSNorms of each query and key head (Qwen3's `qk_norm`), five local layers for one global
(`layer_types`, or `sliding_window_pattern`), and the local layers' own RoPE base
(`rope_parameters.sliding_attention.rope_theta`, transformers 4's `rope_local_base_freq`).
RoPE scaling of the global layers (the 4B and larger sizes' linear factor 8) is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .model import ModelConfig

__all__ = ["gemma_from_hf", "gemma_problems", "full_attention_every", "GEMMA_TYPES"]

GEMMA_TYPES = ("gemma2", "gemma3_text")

_GELU_TANH = ("gelu_pytorch_tanh", "gelu_new")
"""transformers' names of the tanh-approximated GELU (ACT2FN: the same function)."""


def gemma_from_hf(hf: dict[str, Any], r: Any, path: Path) -> ModelConfig:
    """The ModelConfig of a gemma2 / gemma3_text config.json (already checked by
    `gemma_problems`); `r` is hf_model's typed reader over `hf`."""
    gemma3 = hf["model_type"] == "gemma3_text"
    heads, width = r.int("num_attention_heads"), r.int("hidden_size")
    layers = r.int("num_hidden_layers")
    head_dim = r.int("head_dim", 256)
    window, every = _windows(hf, r, layers, 6 if gemma3 else 2)
    # transformers' defaults: Gemma 2 caps scores at 50 and logits at 30, Gemma 3 neither
    attn_cap = _cap(hf, r, "attn_logit_softcapping", 0.0 if gemma3 else 50.0)
    theta, local = _thetas(hf, r, path, gemma3)

    return ModelConfig(
        name=str(path),
        vocab_size=r.int("vocab_size"),
        dim=width,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=r.int("num_key_value_heads", None) or heads,
        head_dim_override=head_dim if head_dim * heads != width else 0,
        ffn_dim=r.int("intermediate_size"),
        max_seq_len=r.int("max_position_embeddings", 131072 if gemma3 else 8192),
        norm="rmsnorm",
        activation="geglu",
        position="rope",
        rope_theta=theta,
        rope_local_theta=local if window and local != theta else 0.0,
        qk_norm=gemma3,
        tie_embeddings=r.bool("tie_word_embeddings", True),
        bias=False,
        norm_eps=r.float("rms_norm_eps", 1e-6),
        # SDPA has no soft-capping: the naive core caps its S x S scores
        attention="naive" if attn_cap else "sdpa",
        attn_scale_dim=r.int("query_pre_attn_scalar", 256),
        attn_softcap=attn_cap,
        logit_softcap=_cap(hf, r, "final_logit_softcapping", 0.0 if gemma3 else 30.0),
        sliding_window=window,
        full_attention_every=every,
        norm_plus_one=True,
        post_norms=True,
        scale_embeddings=True,
        hf_model_type="gemma3_text" if gemma3 else "gemma2",
    )


def _thetas(hf: dict[str, Any], r: Any, path: Path, gemma3: bool) -> tuple[float, float]:
    """(global, local) RoPE bases. Gemma 2: one, `rope_theta` (default 10,000). Gemma 3:
    transformers 5 nests them per layer type in `rope_parameters`, 4.x kept `rope_theta`
    (default 1e6) and `rope_local_base_freq` (default 1e4) at the top level."""
    from .hf_model import _rope  # (hf_model imports this module inside a function)

    if not gemma3:
        theta = type(r)(_rope(hf), path).float("rope_theta", 10000.0)
        return theta, theta
    nested = hf.get("rope_parameters") or {}
    out = []
    for kind, key, default in (
        ("full_attention", "rope_theta", 1e6),
        ("sliding_attention", "rope_local_base_freq", 1e4),
    ):
        params = nested.get(kind)
        if params is not None:
            out.append(type(r)(params, path).float("rope_theta", default))
        else:
            out.append(type(r)(_rope(hf), path).float(key, default))
    return out[0], out[1]


def _cap(hf: dict[str, Any], r: Any, key: str, default: float) -> float:
    """A soft-cap field: its value, `default` when absent (transformers' default), 0 (off)
    for null."""
    return 0.0 if key in hf and hf[key] is None else r.float(key, default)


def _windows(hf: dict[str, Any], r: Any, layers: int, pattern: int) -> tuple[int, int]:
    """(sliding_window, full_attention_every) from `layer_types` (transformers 5) or, when
    absent, `sliding_window_pattern` (default `pattern`: Gemma 2 2, Gemma 3 6): layer i
    global when (i + 1) % pattern == 0."""
    kinds = hf.get("layer_types")
    if kinds is None:
        every = r.int("sliding_window_pattern", pattern)
        kinds = [
            "sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)
        ]
    if (
        not isinstance(kinds, list)
        or len(kinds) != layers
        or not set(kinds) <= {"full_attention", "sliding_attention"}
    ):
        r._fail(
            "layer_types",
            kinds,
            f"must list {layers} 'full_attention' / 'sliding_attention' entries",
        )
    if "sliding_attention" not in kinds:
        return 0, 0
    window = r.int("sliding_window")
    every = full_attention_every(kinds)
    if every is None:
        r._fail(
            "layer_types",
            kinds,
            "is not 'full attention on every N-th layer, the window on the others': "
            "unsupported (model.full_attention_every)",
        )
    return window, every or 0


def full_attention_every(kinds: list[str]) -> int | None:
    """N such that layer i is 'full_attention' exactly when (i + 1) % N == 0 (0: none is),
    or None when `kinds` follows no such pattern.

    >>> full_attention_every(["sliding_attention", "full_attention"] * 2)
    2
    """
    if "full_attention" not in kinds:
        return 0
    every = kinds.index("full_attention") + 1
    want = [
        "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(len(kinds))
    ]
    return every if kinds == want else None


def gemma_problems(hf: dict[str, Any], r: Any, refuse: Callable[[str], None]) -> None:
    """Refuse what a gemma2 / gemma3_text config.json asks that this model code does not
    implement."""
    kind = hf["model_type"]
    for key in ("hidden_activation", "hidden_act"):
        act = hf.get(key)
        if act is not None and act not in _GELU_TANH:
            refuse(f"{key} {act!r} (Gemma's MLP is GeGLU with gelu_pytorch_tanh)")
    if r.bool("attention_bias", False):
        refuse(f"attention_bias = true on {kind}")
    nested = hf.get("rope_parameters") or {}
    for layer_kind in ("full_attention", "sliding_attention"):
        params = nested.get(layer_kind)
        if params is None:
            continue
        if not isinstance(params, dict):
            r._fail(f"rope_parameters.{layer_kind}", params, "must be a JSON object")
        if params.get("rope_type", "default") != "default":
            refuse(
                f"rope scaling (rope_parameters.{layer_kind}.rope_type = {params['rope_type']!r})"
            )
    if r.float("attention_dropout", 0.0, lo=0.0) != 0.0:
        refuse(f"attention_dropout = {hf['attention_dropout']} (dropout)")
    if hf.get("use_bidirectional_attention"):
        refuse("use_bidirectional_attention = true (the model is a causal decoder)")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        _cap(hf, r, key, 1.0)  # a finite number > 0, or null (off)
