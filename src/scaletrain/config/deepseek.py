"""The DeepSeek pieces of `ModelConfig` (V2 / V2-Lite / V3): Multi-head Latent Attention, the
DeepSeekMoE layer (shared experts, dense first layers, softmax or sigmoid routing with
group-limited top-k, the routed-weight scale, the auxiliary-loss-free bias), their rules and
their parameter counts. Pure Python: the planner imports this without torch.

Sources: DeepSeek-V2 (DeepSeek-AI 2024, arXiv:2405.04434) sec. 2.1 (MLA, decoupled RoPE) and
2.2 (DeepSeekMoE, device-limited routing); DeepSeek-V3 (arXiv:2412.19437) sec. 2.1.2 (sigmoid
affinities, the auxiliary-loss-free bias, the sequence-wise balance loss); the published
config.json files of deepseek-ai/DeepSeek-V3 and deepseek-ai/DeepSeek-V2-Lite.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ._errors import require

if TYPE_CHECKING:
    from .model import ModelConfig

__all__ = ["validate_deepseek", "mla_attention_params", "mla_replicated_params"]


def validate_deepseek(m: ModelConfig) -> None:
    """The rules of the MLA and DeepSeekMoE fields (one `ConfigError` naming the field)."""
    p = "model."
    for f in (
        "kv_lora_rank",
        "q_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "num_dense_layers",
        "dense_ffn_dim",
        "num_shared_experts",
        "router_groups",
        "router_topk_groups",
    ):
        v = getattr(m, f)
        require(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0, p + f, v, "use 0 or more"
        )
    if m.is_mla:
        _validate_mla(m)
    else:
        for f in ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            require(
                getattr(m, f) == 0,
                p + f,
                getattr(m, f),
                "is a Multi-head Latent Attention width: set model.kv_lora_rank > 0 too, or 0",
            )
    _validate_moe(m)


def _validate_mla(m: ModelConfig) -> None:
    p = "model."
    require(
        m.qk_rope_head_dim >= 2 and m.qk_rope_head_dim % 2 == 0,
        p + "qk_rope_head_dim",
        m.qk_rope_head_dim,
        "MLA needs an even, positive RoPE width per head (DeepSeek: 64)",
    )
    require(m.v_head_dim >= 1, p + "v_head_dim", m.v_head_dim, "use the value head width (128)")
    require(
        m.position == "rope", p + "position", m.position, "Multi-head Latent Attention uses rope"
    )
    require(
        m.num_kv_heads == m.num_heads,
        p + "num_kv_heads",
        m.num_kv_heads,
        "MLA has one key/value per query head: use num_kv_heads = num_heads (or 0)",
    )
    for f, off in (
        ("bias", False),
        ("qkv_bias", False),
        ("qk_norm", False),
        ("fused_qkv", False),
        ("head_dim_override", 0),
        ("sliding_window", 0),
        # Gemma's attention pieces: MLAttention has no score scale, soft-cap or (1 + w) latent
        # norms of its own, so they would be silently ignored there
        ("attn_scale_dim", 0),
        ("attn_softcap", 0.0),
        ("norm_plus_one", False),
    ):
        require(
            getattr(m, f) == off,
            p + f,
            getattr(m, f),
            f"is not part of Multi-head Latent Attention (model.kv_lora_rank > 0): use {off}",
        )


def _validate_moe(m: ModelConfig) -> None:
    p = "model."
    if not m.is_moe:  # (router_scoring is a choice left inert, as experts_per_token is)
        for f, off in (
            ("num_dense_layers", 0),
            ("num_shared_experts", 0),
            ("dense_ffn_dim", 0),
            ("router_groups", 1),
            ("router_topk_groups", 1),
            ("router_norm_topk", False),
            ("router_scale", 1.0),
            ("router_bias_rate", 0.0),
        ):
            require(
                getattr(m, f) == off,
                p + f,
                getattr(m, f),
                f"belongs to an MoE model (model.num_experts > 0): use {off!r}",
            )
        return
    require(
        m.num_dense_layers < m.num_layers,
        p + "num_dense_layers",
        m.num_dense_layers,
        f"use fewer than num_layers={m.num_layers} (the rest are MoE blocks)",
    )
    require(
        math.isfinite(m.router_scale) and m.router_scale > 0,
        p + "router_scale",
        m.router_scale,
        "use a finite positive factor (DeepSeek-V3: 2.5, V2-Lite: 1.0)",
    )
    require(
        math.isfinite(m.router_bias_rate) and m.router_bias_rate >= 0,
        p + "router_bias_rate",
        m.router_bias_rate,
        "use 0 (bias frozen) or a small update speed such as 0.001",
    )
    if m.router_scoring == "topk_softmax":  # Mixtral: none of the DeepSeek routing options
        for f, off in (
            ("router_groups", 1),
            ("router_topk_groups", 1),
            ("router_norm_topk", False),
            ("router_scale", 1.0),
        ):
            require(
                getattr(m, f) == off,
                p + f,
                getattr(m, f),
                f"needs router_scoring 'softmax' or 'sigmoid' (Mixtral's 'topk_softmax' "
                f"normalizes over the top k itself): use {off!r}",
            )
    require(
        m.moe_norm_topk or m.router_scoring == "topk_softmax",
        p + "moe_norm_topk",
        m.moe_norm_topk,
        "is Mixtral-style routing's ('topk_softmax'); DeepSeek's 'softmax'/'sigmoid' routing "
        "normalizes its k weights with model.router_norm_topk: use true here",
    )
    require(
        m.num_shared_experts == 0 or m.router_scoring != "topk_softmax",
        p + "num_shared_experts",
        m.num_shared_experts,
        "shared experts come with DeepSeek's routing: set router_scoring to 'softmax' or "
        "'sigmoid', or use 0",
    )
    require(
        m.router_bias_rate == 0 or m.router_scoring == "sigmoid",
        p + "router_bias_rate",
        m.router_bias_rate,
        "the auxiliary-loss-free bias is DeepSeek-V3's (router_scoring = 'sigmoid'): use 0",
    )
    g = m.router_groups
    require(
        g >= 1 and m.num_experts % g == 0,
        p + "router_groups",
        g,
        f"use a divisor of num_experts={m.num_experts} (1: no group limit)",
    )
    require(
        1 <= m.router_topk_groups <= g,
        p + "router_topk_groups",
        m.router_topk_groups,
        f"use 1..router_groups={g}",
    )
    reachable = m.router_topk_groups * (m.num_experts // g)
    require(
        m.experts_per_token <= reachable,
        p + "experts_per_token",
        m.experts_per_token,
        f"the {m.router_topk_groups} chosen group(s) hold {reachable} experts: use at most that",
    )
    if m.router_scoring == "sigmoid" and g > 1:
        require(
            m.num_experts // g >= 2,
            p + "router_groups",
            g,
            "sigmoid routing scores a group by its two best experts: use groups of 2 or more",
        )


def mla_attention_params(m: ModelConfig) -> int:
    """Parameters of one MLA block's attention: q (h*rq + rq + rq*a*(dn + dr), or h*a*(dn + dr)
    without the q latent), the compressed kv h*(r + dr) + r (its norm), the up-projection
    r*a*(dn + dv) and the output a*dv*h (DeepSeek-V2 sec. 2.1, eqs. 9-14; no biases)."""
    h, a, r, rq = m.dim, m.num_heads, m.kv_lora_rank, m.q_lora_rank
    dn, dr, dv = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    q = h * rq + rq + rq * a * (dn + dr) if rq else h * a * (dn + dr)
    return q + h * (r + dr) + r + r * a * (dn + dv) + a * dv * h


def mla_replicated_params(m: ModelConfig) -> int:
    """The part of `mla_attention_params` every tensor-parallel rank holds whole: the
    down-projections to the latents and their norms (h*rq + rq, h*(r + dr) + r); the rest is
    split over the heads (parallel/tensor_parallel_mla.py)."""
    h, r, rq, dr = m.dim, m.kv_lora_rank, m.q_lora_rank, m.qk_rope_head_dim
    return (h * rq + rq if rq else 0) + h * (r + dr) + r
