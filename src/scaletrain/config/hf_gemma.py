"""Gemma 2's `config.json` (model_type 'gemma2') read into a ModelConfig, and the fields this
model code does not implement refused (one line each). The reader and the refusal format are
`hf_model`'s; this module holds what only Gemma has.

Gemma 2 (Gemma Team 2024; transformers' `Gemma2Config`): GeGLU with tanh-GELU
(`hidden_activation`), embeddings times sqrt(hidden_size), (1 + w) RMSNorms before and after
each sub-layer, attention scores scaled by 1/sqrt(`query_pre_attn_scalar`) and soft-capped
(`attn_logit_softcapping`), final logits soft-capped (`final_logit_softcapping`), sliding-window
and global layers alternating (`layer_types`, or every other layer from a sliding first one
when absent), a tied head.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .model import ModelConfig

__all__ = ["gemma2_from_hf", "gemma2_problems", "full_attention_every"]

_GELU_TANH = ("gelu_pytorch_tanh", "gelu_new")
"""transformers' names of the tanh-approximated GELU (ACT2FN: the same function)."""


def gemma2_from_hf(hf: dict[str, Any], r: Any, path: Path) -> ModelConfig:
    """The ModelConfig of a gemma2 config.json (already checked by `gemma2_problems`); `r`
    is hf_model's typed reader over `hf`."""
    heads, width = r.int("num_attention_heads"), r.int("hidden_size")
    layers = r.int("num_hidden_layers")
    head_dim = r.int("head_dim", 256)
    window, every = _windows(hf, r, layers)
    attn_cap = _cap(hf, r, "attn_logit_softcapping", 50.0)
    from .hf_model import _rope  # (hf_model imports this module inside a function)

    return ModelConfig(
        name=str(path),
        vocab_size=r.int("vocab_size"),
        dim=width,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=r.int("num_key_value_heads", None) or heads,
        head_dim_override=head_dim if head_dim * heads != width else 0,
        ffn_dim=r.int("intermediate_size"),
        max_seq_len=r.int("max_position_embeddings", 8192),
        norm="rmsnorm",
        activation="geglu",
        position="rope",
        rope_theta=type(r)(_rope(hf), path).float("rope_theta", 10000.0),
        tie_embeddings=r.bool("tie_word_embeddings", True),
        bias=False,
        norm_eps=r.float("rms_norm_eps", 1e-6),
        # SDPA has no soft-capping: the naive core caps its S x S scores
        attention="naive" if attn_cap else "sdpa",
        attn_scale_dim=r.int("query_pre_attn_scalar", 256),
        attn_softcap=attn_cap,
        logit_softcap=_cap(hf, r, "final_logit_softcapping", 30.0),
        sliding_window=window,
        full_attention_every=every,
        norm_plus_one=True,
        post_norms=True,
        scale_embeddings=True,
        hf_model_type="gemma2",
    )


def _cap(hf: dict[str, Any], r: Any, key: str, default: float) -> float:
    """A soft-cap field: its value, `default` when absent (transformers' default), 0 (off)
    for null."""
    return 0.0 if key in hf and hf[key] is None else r.float(key, default)


def _windows(hf: dict[str, Any], r: Any, layers: int) -> tuple[int, int]:
    """(sliding_window, full_attention_every) from `layer_types` (transformers 5) or, when
    absent, Gemma 2's default: sliding on even layers, global on odd ones."""
    kinds = hf.get("layer_types")
    if kinds is None:
        kinds = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
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


def gemma2_problems(hf: dict[str, Any], r: Any, refuse: Callable[[str], None]) -> None:
    """Refuse what a gemma2 config.json asks that this model code does not implement."""
    for key in ("hidden_activation", "hidden_act"):
        act = hf.get(key)
        if act is not None and act not in _GELU_TANH:
            refuse(f"{key} {act!r} (Gemma 2's MLP is GeGLU with gelu_pytorch_tanh)")
    if r.bool("attention_bias", False):
        refuse("attention_bias = true on gemma2")
    if r.float("attention_dropout", 0.0, lo=0.0) != 0.0:
        refuse(f"attention_dropout = {hf['attention_dropout']} (dropout)")
    if hf.get("use_bidirectional_attention"):
        refuse("use_bidirectional_attention = true (the model is a causal decoder)")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        _cap(hf, r, key, 1.0)  # a finite number > 0, or null (off)
