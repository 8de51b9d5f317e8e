"""A DeepSeek-V2 / V2-Lite / V3 `config.json` (model_type deepseek_v2 / deepseek_v3, as
transformers 5 and DeepSeek's own releases write it) read into a ModelConfig, and the rules of
what is refused (one line naming the field). `hf_model.py` calls these; the field meanings are
config/deepseek.py's.

Defaults for a missing key are transformers' (`DeepseekV3Config`, `DeepseekV2Config`). Read
from elsewhere: `aux_loss_alpha` (DeepSeek's configuration_deepseek.py; absent from
transformers', which trains without it) as the balance-loss weight, default the papers' values
(V3 sec. 4.2: 0.0001; V2-Lite's config: 0.001); the bias update speed is not in any config.json
(DeepSeek-V3 sec. 4.2: 0.001; set `model.router_bias_rate`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .model import ModelConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from .hf_model import _HFReader

__all__ = [
    "DEEPSEEK_TYPES",
    "DEEPSEEK_KEYS",
    "deepseek_from_hf",
    "check_deepseek_supported",
    "deepseek_export_problem",
]

DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3")

DEEPSEEK_KEYS = {
    "dim": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "ffn_dim": "moe_intermediate_size",
    "dense_ffn_dim": "intermediate_size",
    "max_seq_len": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
    "num_experts": "n_routed_experts",
    "experts_per_token": "num_experts_per_tok",
    "num_shared_experts": "n_shared_experts",
    "num_dense_layers": "first_k_dense_replace",
    "router_groups": "n_group",
    "router_topk_groups": "topk_group",
    "router_scale": "routed_scaling_factor",
    "moe_aux_loss_coef": "aux_loss_alpha",
    "kv_lora_rank": "kv_lora_rank",
    "q_lora_rank": "q_lora_rank",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
}
"""ModelConfig field -> the config.json key it is read from (for error messages)."""


def deepseek_from_hf(
    hf: dict[str, Any], r: _HFReader, mtype: str, path: Path, rope_theta: float
) -> ModelConfig:
    """The ModelConfig of a DeepSeek config.json already past `check_deepseek_supported`."""
    v3 = mtype == "deepseek_v3"
    heads = r.int("num_attention_heads", 128 if v3 else 32)
    grouped = v3 or hf.get("topk_method", "greedy") == "group_limited_greedy"
    return ModelConfig(
        name=str(path),
        vocab_size=r.int("vocab_size", 129280 if v3 else 102400),
        dim=r.int("hidden_size", 7168 if v3 else 4096),
        num_layers=r.int("num_hidden_layers", 61 if v3 else 32),
        num_heads=heads,
        num_kv_heads=heads,
        ffn_dim=r.int("moe_intermediate_size", 2048 if v3 else 1407),
        dense_ffn_dim=r.int("intermediate_size", 18432 if v3 else 11008),
        max_seq_len=r.int("max_position_embeddings", 4096 if v3 else 2048),
        norm="rmsnorm",
        activation="swiglu",
        position="rope",
        rope_theta=rope_theta,
        tie_embeddings=r.bool("tie_word_embeddings", False),
        bias=False,
        norm_eps=r.float("rms_norm_eps", 1e-6),
        kv_lora_rank=r.int("kv_lora_rank", 512),
        q_lora_rank=r.int("q_lora_rank", 1536 if v3 else None) or 0,
        qk_nope_head_dim=r.int("qk_nope_head_dim", 128),
        qk_rope_head_dim=r.int("qk_rope_head_dim", 64),
        v_head_dim=r.int("v_head_dim", 128),
        num_experts=r.int("n_routed_experts", 256 if v3 else 64),
        experts_per_token=r.int("num_experts_per_tok", 8 if v3 else 6),
        num_shared_experts=r.int("n_shared_experts", 1 if v3 else 2, lo=0) or 0,
        num_dense_layers=r.int("first_k_dense_replace", 3 if v3 else 0, lo=0) or 0,
        router_scoring="sigmoid" if v3 else "softmax",
        router_groups=(r.int("n_group", 8 if v3 else None) or 1) if grouped else 1,
        router_topk_groups=(r.int("topk_group", 4 if v3 else None) or 1) if grouped else 1,
        router_norm_topk=r.bool("norm_topk_prob", True) if v3 else False,
        router_scale=r.float("routed_scaling_factor", 2.5 if v3 else 1.0),
        router_bias_rate=0.001 if v3 else 0.0,
        moe_aux_loss_coef=r.float("aux_loss_alpha", 0.0001 if v3 else 0.001, lo=0.0),
        hf_model_type=mtype,  # type: ignore[arg-type]  # one of DEEPSEEK_TYPES
    )


def check_deepseek_supported(hf: dict[str, Any], r: _HFReader, refuse: Callable[..., None]) -> None:
    """Refuse, one line each, what this model code does not build (the rest of the family's
    fields are read by `deepseek_from_hf`)."""
    v3 = hf["model_type"] == "deepseek_v3"
    mtp = hf.get("num_nextn_predict_layers", hf.get("num_mtp_layers", 0))
    if mtp:
        refuse(
            f"multi-token prediction (num_nextn_predict_layers = {mtp})",
            "set it to 0 in config.json to train the main model alone (the MTP module's "
            "weights, model.layers.<num_hidden_layers>.*, are then not read)",
        )
    if r.bool("attention_bias", False):
        refuse("attention_bias = true on Multi-head Latent Attention")
    if r.float("attention_dropout", 0.0, lo=0.0) != 0.0:
        refuse(f"attention_dropout = {hf['attention_dropout']} (dropout)")
    kv = r.int("num_key_value_heads", None)
    if kv is not None and kv != r.int("num_attention_heads", kv):
        refuse(f"num_key_value_heads = {kv} != num_attention_heads (MLA has one per head)")
    if r.int("moe_layer_freq", 1) != 1:
        refuse(f"moe_layer_freq = {hf['moe_layer_freq']} (MoE on every other block)")
    if not r.bool("seq_aux", True):
        refuse("seq_aux = false (a batch-wise balance loss; the sequence-wise one is built)")
    if hf.get("n_routed_experts", 1) is None:
        refuse("n_routed_experts = null (a DeepSeek model without routed experts)")
    want = ("sigmoid", ("noaux_tc",)) if v3 else ("softmax", ("greedy", "group_limited_greedy"))
    if hf.get("scoring_func", want[0]) != want[0]:
        refuse(f"scoring_func {hf['scoring_func']!r} on {hf['model_type']}")
    method = hf.get("topk_method")
    if method is not None and method not in want[1]:
        refuse(f"topk_method {method!r} on {hf['model_type']}")
    if not v3 and r.bool("norm_topk_prob", False):
        # DeepSeek's own V2 code honours it, transformers' DeepseekV2 router ignores it
        refuse("norm_topk_prob = true on deepseek_v2 (its implementations disagree)")


def deepseek_export_problem(cfg: ModelConfig, kind: str) -> str | None:
    """Why `cfg` does not export as `kind` (deepseek_v2 / deepseek_v3); None when it does."""
    v3 = kind == "deepseek_v3"
    if not (cfg.is_mla and cfg.is_moe):
        return f"{kind} needs Multi-head Latent Attention and experts (kv_lora_rank, num_experts)"
    if cfg.norm != "rmsnorm" or cfg.activation != "swiglu" or cfg.position != "rope" or cfg.bias:
        return f"{kind} needs rmsnorm, swiglu, rope and bias=False"
    if cfg.router_scoring != ("sigmoid" if v3 else "softmax"):
        return f"{kind} routes with router_scoring = {'sigmoid' if v3 else 'softmax'!r}"
    if not v3 and cfg.router_norm_topk:
        return "deepseek_v2 has no normalized top-k weights (router_norm_topk)"
    return None
