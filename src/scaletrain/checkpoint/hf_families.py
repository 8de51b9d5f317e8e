"""What Qwen3-MoE and Gemma 2 checkpoints add to `checkpoint.hf`'s Llama layout: their
config.json and their tensor names.

- Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen3's attention; router `mlp.gate`, experts as the
  published checkpoints store them, one Linear per expert `mlp.experts.{e}.gate_proj / up_proj
  / down_proj` (what transformers 5 writes with `save_pretrained` too; it fuses them into
  `mlp.experts.gate_up_proj` (E, 2f, h) and `down_proj` (E, h, f) in memory, also read).
- Gemma 2 (`Gemma2ForCausalLM`): four norms per block, `input_layernorm` (our
  attention_norm), `post_attention_layernorm` (post_attention_norm: on the attention's output,
  where Llama's name means the MLP's input norm), `pre_feedforward_layernorm` (ffn_norm),
  `post_feedforward_layernorm` (post_ffn_norm); a tied head. Gemma 3's text model
  (`Gemma3ForCausalLM`, model_type gemma3_text) the same, plus `self_attn.q_norm` / `k_norm`
  and one RoPE base per layer type in `rope_parameters`.
"""

from __future__ import annotations

from typing import Any

from scaletrain.config import ModelConfig

__all__ = ["family_config", "norm_names", "expert_names", "router_name"]

_LLAMA_NORMS = (("attention_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm"))
_GEMMA2_NORMS = (
    ("attention_norm", "input_layernorm"),
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffn_norm", "post_feedforward_layernorm"),
)


def norm_names(kind: str) -> tuple[tuple[str, str], ...]:
    """(our module, HF module) of a block's norms for HF model type `kind`."""
    return _GEMMA2_NORMS if kind in ("gemma2", "gemma3_text") else _LLAMA_NORMS


def router_name(kind: str) -> str:
    """The router's weight inside a block: Mixtral's published name, or Qwen3-MoE's."""
    return "mlp.gate.weight" if kind == "qwen3_moe" else "block_sparse_moe.gate.weight"


def expert_names(kind: str, e: int) -> dict[str, str]:
    """Our stacked expert weight -> HF's tensor of expert `e` inside a block (one Linear per
    expert: Mixtral's w1/w2/w3, Qwen3-MoE's gate/down/up projections)."""
    if kind == "qwen3_moe":
        p = f"mlp.experts.{e}."
        return {
            "w1": p + "gate_proj.weight",
            "w2": p + "down_proj.weight",
            "w3": p + "up_proj.weight",
        }
    p = f"block_sparse_moe.experts.{e}."
    return {w: f"{p}{w}.weight" for w in ("w1", "w2", "w3")}


def family_config(cfg: ModelConfig, kind: str, common: dict[str, Any]) -> dict[str, Any] | None:
    """config.json of a Qwen3-MoE or Gemma 2 export (`common`: the keys the Llama family
    shares, `checkpoint.hf.hf_config`); None for the other model types."""
    if kind == "qwen3_moe":
        window = cfg.sliding_window
        return {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            **common,
            # every layer is MoE: the dense width (`intermediate_size`) is not used
            "moe_intermediate_size": cfg.ffn_dim,
            "num_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.experts_per_token,
            "norm_topk_prob": cfg.moe_norm_topk,
            "router_aux_loss_coef": cfg.moe_aux_loss_coef,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "attention_bias": False,
            "use_sliding_window": bool(window),
            "sliding_window": window or None,
        }
    if kind in ("gemma2", "gemma3_text"):
        last = cfg.vocab_size - 1  # Gemma's special ids, clipped into small vocabularies
        kinds = [
            "sliding_attention" if cfg.layer_window(i) else "full_attention"
            for i in range(cfg.num_layers)
        ]
        out = {k: v for k, v in common.items() if k != "hidden_act"}
        if kind == "gemma3_text":  # one RoPE base per layer type
            del out["rope_theta"]
            local = cfg.rope_local_theta or cfg.rope_theta
            out["rope_parameters"] = {
                "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": local},
            }
            out["use_bidirectional_attention"] = False
        return {
            "architectures": ["Gemma2ForCausalLM" if kind == "gemma2" else "Gemma3ForCausalLM"],
            "model_type": kind,
            **out,
            "hidden_activation": "gelu_pytorch_tanh",
            "attention_bias": False,
            "query_pre_attn_scalar": cfg.attn_scale_dim or cfg.head_dim,
            "attn_logit_softcapping": cfg.attn_softcap or None,
            "final_logit_softcapping": cfg.logit_softcap or None,
            "sliding_window": cfg.sliding_window or cfg.max_seq_len,
            "layer_types": kinds,
            "pad_token_id": min(0, last),
            "eos_token_id": min(1, last),
            "bos_token_id": min(2, last),
        }
    return None
