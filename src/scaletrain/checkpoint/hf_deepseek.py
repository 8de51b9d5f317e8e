"""DeepSeek-V2 / V3 checkpoints (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`): names,
layouts and config.json.

Per block i (`model.layers.{i}.`), ours <- Hugging Face's:

- MLA: `attention.wq_a` / `q_norm` / `wq_b` <- `self_attn.q_a_proj` / `q_a_layernorm` /
  `q_b_proj` (or `attention.wq` <- `q_proj` without the q latent); `attention.wkv_a` and
  `attention.wk_rope` <- the rows [0, r) and [r, r + dr) of `self_attn.kv_a_proj_with_mqa`;
  `kv_norm` <- `kv_a_layernorm`; `wkv_b` <- `kv_b_proj`; `wo` <- `o_proj`.
- RoPE layout: DeepSeek's checkpoints rotate interleaved pairs (x0, x1), (x2, x3), ... of each
  head's RoPE part (V2's complex multiply; V3 with `rope_interleave`, transformers' default),
  ours the halves (x_j, x_{j + dr/2}) (`models.attention.apply_rotary`, Llama's layout). The
  RoPE rows of q (per head) and of the RoPE key are therefore read in the order
  0, 2, 4, ..., 1, 3, 5, ... (`rope_rows`): q . k is the same sum with both permuted alike,
  so the logits are equal (transformers: "bit-identical to the de-interleaved rotate_half
  formulation"). Export writes them back interleaved, with `rope_interleave: true`.
- dense blocks: `feed_forward.w1/w3/w2` <- `mlp.gate_proj/up_proj/down_proj`;
- MoE blocks: `moe.router` <- `mlp.gate`, the buffer `moe.expert_bias` <-
  `mlp.gate.e_score_correction_bias` (V3); experts (E, ., .) <- transformers 5's fused
  `mlp.experts.gate_up_proj` (E, 2f, h; gate rows then up) / `down_proj`, or DeepSeek's
  published one-Linear-per-expert `mlp.experts.{e}.gate_proj/up_proj/down_proj` (the layout
  exports write; transformers 5 merges it on load); `moe.shared_experts.w1/w3/w2` (1, fs, .)
  <- `mlp.shared_experts.gate_proj/up_proj/down_proj` (fs, .).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scaletrain.config import ModelConfig

__all__ = [
    "RowMap",
    "attention_rows",
    "rope_rows",
    "deepseek_hf_config",
    "deepseek_to_hf",
    "deepseek_from_hf",
    "rope_interleaved",
]


def rope_rows(dr: int, interleaved: bool) -> torch.Tensor:
    """Our RoPE dim i holds the checkpoint's dim `rope_rows(dr)[i]` (see the module docstring)."""
    if not interleaved:
        return torch.arange(dr)
    return torch.cat((torch.arange(0, dr, 2), torch.arange(1, dr, 2)))


def rope_interleaved(hf_config: dict) -> bool:
    """Whether a DeepSeek config.json's weights rotate interleaved pairs: always for V2 (its
    complex-number RoPE), V3 unless `rope_interleave` is false."""
    return hf_config.get("model_type") == "deepseek_v2" or bool(
        hf_config.get("rope_interleave", True)
    )


@dataclass(frozen=True)
class RowMap:
    """Our parameter `ours` (in block i) is the rows `rows` of the checkpoint's `hf` tensor,
    of `hf_rows` rows in all (row i of ours = row rows[i] of theirs)."""

    ours: str
    hf: str
    rows: torch.Tensor
    hf_rows: int


def attention_rows(cfg: ModelConfig, interleaved: bool) -> list[RowMap]:
    """The MLA tensors of one block as row maps (plain copies have rows = arange)."""
    a, r, rq = cfg.num_heads, cfg.kv_lora_rank, cfg.q_lora_rank
    dn, dr, dv, h = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.dim
    qk = dn + dr
    head = torch.cat((torch.arange(dn), dn + rope_rows(dr, interleaved)))  # one q head's rows
    q_rows = torch.cat([i * qk + head for i in range(a)])  # (a*qk,)
    out = []
    if rq:
        out += [
            RowMap("attention.wq_a.weight", "self_attn.q_a_proj.weight", torch.arange(rq), rq),
            RowMap(
                "attention.q_norm.weight", "self_attn.q_a_layernorm.weight", torch.arange(rq), rq
            ),
            RowMap("attention.wq_b.weight", "self_attn.q_b_proj.weight", q_rows, a * qk),
        ]
    else:
        out.append(RowMap("attention.wq.weight", "self_attn.q_proj.weight", q_rows, a * qk))
    kv_a = "self_attn.kv_a_proj_with_mqa.weight"
    return out + [
        RowMap("attention.wkv_a.weight", kv_a, torch.arange(r), r + dr),
        RowMap("attention.wk_rope.weight", kv_a, r + rope_rows(dr, interleaved), r + dr),
        RowMap("attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight", torch.arange(r), r),
        RowMap("attention.wkv_b.weight", "self_attn.kv_b_proj.weight", *_plain(a * (dn + dv))),
        RowMap("attention.wo.weight", "self_attn.o_proj.weight", *_plain(h)),
    ]


def _plain(rows: int) -> tuple[torch.Tensor, int]:
    return torch.arange(rows), rows


def block_maps(cfg: ModelConfig, i: int, interleaved: bool) -> list[RowMap]:
    """Every tensor of block i that maps by rows: attention, norms, dense MLP, router."""
    h = cfg.dim
    maps = attention_rows(cfg, interleaved) + [
        RowMap("attention_norm.weight", "input_layernorm.weight", *_plain(h)),
        RowMap("ffn_norm.weight", "post_attention_layernorm.weight", *_plain(h)),
    ]
    if not cfg.layer_is_moe(i):
        f = cfg.dense_ffn_dim or cfg.ffn_dim
        return maps + [
            RowMap("feed_forward.w1.weight", "mlp.gate_proj.weight", *_plain(f)),
            RowMap("feed_forward.w3.weight", "mlp.up_proj.weight", *_plain(f)),
            RowMap("feed_forward.w2.weight", "mlp.down_proj.weight", *_plain(h)),
        ]
    maps.append(RowMap("moe.router.weight", "mlp.gate.weight", *_plain(cfg.num_experts)))
    if cfg.router_scoring == "sigmoid":
        bias = "mlp.gate.e_score_correction_bias"
        maps.append(RowMap("moe.expert_bias", bias, *_plain(cfg.num_experts)))
    return maps


SHARED = (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))
"""Our shared / routed expert weights and the checkpoint's Linear names."""


def deepseek_hf_config(cfg: ModelConfig, dtype_name: str) -> dict:
    """config.json of `cfg` as DeepseekV2/V3ForCausalLM (transformers 5 reads it; the keys
    DeepSeek's own code reads are written too)."""
    v3 = cfg.hf_model_type == "deepseek_v3" or (
        cfg.hf_model_type == "auto" and cfg.router_scoring == "sigmoid"
    )
    grouped = cfg.router_groups > 1
    out = {
        "architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v3" if v3 else "deepseek_v2",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.dense_ffn_dim or cfg.ffn_dim,
        "moe_intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_heads,
        "n_shared_experts": cfg.num_shared_experts,
        "n_routed_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.experts_per_token,
        "first_k_dense_replace": cfg.num_dense_layers,
        "moe_layer_freq": 1,
        "routed_scaling_factor": cfg.router_scale,
        "n_group": cfg.router_groups if (v3 or grouped) else None,
        "topk_group": cfg.router_topk_groups if (v3 or grouped) else None,
        "norm_topk_prob": cfg.router_norm_topk,
        "scoring_func": "sigmoid" if v3 else "softmax",
        "topk_method": "noaux_tc" if v3 else ("group_limited_greedy" if grouped else "greedy"),
        "aux_loss_alpha": cfg.moe_aux_loss_coef,
        "seq_aux": True,
        "kv_lora_rank": cfg.kv_lora_rank,
        "q_lora_rank": cfg.q_lora_rank or None,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "torch_dtype": dtype_name,
    }
    if v3:
        out |= {"rope_interleave": True, "num_nextn_predict_layers": 0}
    else:
        out["mlp_bias"] = False
    last = cfg.vocab_size - 1  # the family's special ids, clipped into small vocabularies
    out |= {"bos_token_id": min(0 if v3 else 1, last), "eos_token_id": min(1 if v3 else 2, last)}
    return out


def deepseek_to_hf(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our blocks' (full, clean) tensors -> the checkpoint's names, interleaved RoPE rows,
    one Linear per expert. The embeddings, final norm and head are the caller's."""
    out: dict[str, torch.Tensor] = {}
    for i in range(cfg.num_layers):
        pre, mine = f"model.layers.{i}.", f"layers.{i}."
        parts: dict[str, torch.Tensor] = {}
        for m in block_maps(cfg, i, interleaved=True):
            rows = parts.setdefault(
                m.hf, sd[mine + m.ours].new_empty((m.hf_rows, *sd[mine + m.ours].shape[1:]))
            )
            rows[m.rows] = sd[mine + m.ours]
        out.update({pre + k: v for k, v in parts.items()})
        if not cfg.layer_is_moe(i):
            continue
        for ours, name in SHARED:
            if cfg.num_shared_experts:
                out[f"{pre}mlp.shared_experts.{name}.weight"] = sd[
                    f"{mine}moe.shared_experts.{ours}"
                ][0]
            for e in range(cfg.num_experts):
                out[f"{pre}mlp.experts.{e}.{name}.weight"] = sd[f"{mine}moe.experts.{ours}"][e]
    return out


def deepseek_from_hf(
    hf: dict[str, torch.Tensor], cfg: ModelConfig, *, interleaved: bool = True
) -> dict[str, torch.Tensor]:
    """The checkpoint's block tensors -> ours (either expert layout; see the module docstring).
    The embeddings, final norm and head are the caller's."""
    sd: dict[str, torch.Tensor] = {}
    for i in range(cfg.num_layers):
        pre, mine = f"model.layers.{i}.", f"layers.{i}."
        for m in block_maps(cfg, i, interleaved):
            sd[mine + m.ours] = hf[pre + m.hf][m.rows]
        if not cfg.layer_is_moe(i):
            continue
        if cfg.num_shared_experts:
            for ours, name in SHARED:
                sd[f"{mine}moe.shared_experts.{ours}"] = hf[
                    f"{pre}mlp.shared_experts.{name}.weight"
                ].unsqueeze(0)
        fused = hf.get(pre + "mlp.experts.gate_up_proj")
        experts = mine + "moe.experts."
        if fused is not None:  # transformers 5: (E, 2f, h) gate rows then up rows
            f = cfg.ffn_dim
            sd |= {
                experts + "w1": fused[:, :f],
                experts + "w3": fused[:, f:],
                experts + "w2": hf[pre + "mlp.experts.down_proj"],
            }
            continue
        for ours, name in SHARED:
            sd[experts + ours] = torch.stack(
                [hf[f"{pre}mlp.experts.{e}.{name}.weight"] for e in range(cfg.num_experts)]
            )
    return sd
