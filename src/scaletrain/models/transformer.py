"""Decoder-only transformer covering the GPT-2 and Llama families, Mixtral-style MoE, the
Llama-like Qwen2 / Qwen3 / Phi-3 (q/k/v biases, per-head q/k norms: `Attention`'s options) and
DeepSeek-V2/V3 (Multi-head Latent Attention, `mla.py`; DeepSeekMoE with dense first blocks,
`deepseek_moe.py`).

Plain single-device modules: parallelism is applied from outside (scaletrain.parallel), so the
module tree below is an interface:

    Transformer
      tok_embeddings  nn.Embedding | None        (None on non-first pipeline stages)
      pos_embeddings  nn.Embedding | None        (learned positions only)
      rope            RotaryEmbedding | None     (RoPE only; non-persistent cos/sin tables)
      rope_local      RotaryEmbedding | None     (Gemma 3's windowed layers' own base)
      layers          nn.ModuleDict "0".."L-1"   (keys survive pipeline splitting)
        TransformerBlock: attention_norm, attention (Attention [+ q_norm, k_norm] |
                          MLAttention), ffn_norm, feed_forward (FeedForward) | moe (MoE |
                          DeepSeekMoE [+ shared_experts])
      norm            LayerNorm | RMSNorm | None
      output          nn.Linear | None

Tied embeddings (GPT-2): `output` is None and `tie_embeddings` is True; the head is
`F.linear(h, tok_embeddings.weight)`, applied when the module holds both the embedding and the
final norm (a whole model, or a single pipeline stage). A pipeline split of a tied model must
give its last stage its own `output` Linear holding a copy of the embedding and keep the two
gradients in sync — the model cannot do that without a process group.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scaletrain.config import ModelConfig

from ..numerics import upcast
from .attention import Attention, RotaryEmbedding
from .deepseek_moe import DeepSeekMoE
from .documents import document_layout, document_mask
from .loss import linear_cross_entropy
from .mla import MLAttention
from .moe import MoE, gate_activation
from .norms import RMSNorm

__all__ = [
    "Transformer",
    "TransformerBlock",
    "FeedForward",
    "RMSNorm",
    "build_model",
    "causal_lm_loss",
    "sliding_window_mask",
]


def _norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.dim, cfg.norm_eps, plus_one=cfg.norm_plus_one)
    return nn.LayerNorm(cfg.dim, eps=cfg.norm_eps, bias=cfg.bias)


class FeedForward(nn.Module):
    """Dense MLP. GELU: `w1` up, `w2` down. SwiGLU (Shazeer 2020): `w1` gate, `w3` up, `w2` down;
    GeGLU (the same paper; Gemma) the same with tanh-GELU in place of SiLU.

    'gelu' is the tanh approximation, GPT-2's `gelu_new`, so HF GPT-2 logits match; 'gelu_exact'
    the erf form (HF's `gelu`, nanoGPT's `nn.GELU()`).
    """

    def __init__(self, dim: int, hidden_dim: int, *, activation: str, bias: bool) -> None:
        super().__init__()
        self.activation = activation
        gated = activation in ("swiglu", "geglu")
        self.w1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.w2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.w3 = nn.Linear(dim, hidden_dim, bias=bias) if gated else None
        self._gelu_approximate = "none" if activation == "gelu_exact" else "tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(gate_activation(self.w1(x), self.activation) * self.w3(x))
        return self.w2(F.gelu(self.w1(x), approximate=self._gelu_approximate))


def _attention(cfg: ModelConfig) -> Attention | MLAttention:
    if cfg.is_mla:
        return MLAttention(
            cfg.dim,
            cfg.num_heads,
            q_lora_rank=cfg.q_lora_rank,
            kv_lora_rank=cfg.kv_lora_rank,
            qk_nope_head_dim=cfg.qk_nope_head_dim,
            qk_rope_head_dim=cfg.qk_rope_head_dim,
            v_head_dim=cfg.v_head_dim,
            norm_eps=cfg.norm_eps,
            backend=cfg.attention,
        )
    return Attention(
        cfg.dim,
        cfg.num_heads,
        cfg.num_kv_heads,
        bias=cfg.bias,
        backend=cfg.attention,
        fused_qkv=cfg.fused_qkv,
        head_dim=cfg.head_dim,
        qkv_bias=cfg.qkv_bias,
        qk_norm=cfg.qk_norm,
        norm_eps=cfg.norm_eps,
        scale=cfg.attn_scale if cfg.attn_scale_dim else None,
        softcap=cfg.attn_softcap,
        norm_plus_one=cfg.norm_plus_one,
    )


def _moe(cfg: ModelConfig) -> MoE:
    if cfg.router_scoring == "topk_softmax" and not cfg.num_shared_experts:
        return MoE(
            cfg.dim,
            cfg.ffn_dim,
            cfg.num_experts,
            cfg.experts_per_token,
            activation=cfg.activation,
            bias=cfg.bias,
            aux_loss_coef=cfg.moe_aux_loss_coef,
            norm_topk=cfg.moe_norm_topk,
            **_capacity(cfg),
        )
    return DeepSeekMoE(
        cfg.dim,
        cfg.ffn_dim,
        cfg.num_experts,
        cfg.experts_per_token,
        activation=cfg.activation,
        bias=cfg.bias,
        aux_loss_coef=cfg.moe_aux_loss_coef,
        num_shared=cfg.num_shared_experts,
        scoring=cfg.router_scoring,
        groups=cfg.router_groups,
        topk_groups=cfg.router_topk_groups,
        norm_topk=cfg.router_norm_topk,
        scale=cfg.router_scale,
        bias_rate=cfg.router_bias_rate,
        **_capacity(cfg),
    )


def _capacity(cfg: ModelConfig) -> dict[str, Any]:
    """The expert-capacity arguments of `MoE` / `DeepSeekMoE` (models/moe_dispatch.py)."""
    return {
        "capacity_factor": cfg.moe_capacity_factor,
        "drop_policy": cfg.moe_drop_policy,
        "pad_to_capacity": cfg.moe_pad_to_capacity,
    }


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x)) (GPT-2 / Llama order).

    `post_norms` (Gemma 2): x + post_attention_norm(attn(norm(x))), then
    + post_ffn_norm(mlp(ffn_norm(x))): a norm on each sub-layer's output as well."""

    def __init__(self, cfg: ModelConfig, layer_id: int = 0) -> None:
        super().__init__()
        self.attention_norm = _norm(cfg)
        self.attention: Attention | MLAttention = _attention(cfg)
        self.ffn_norm = _norm(cfg)
        self.post_attention_norm: nn.Module | None = _norm(cfg) if cfg.post_norms else None
        self.post_ffn_norm: nn.Module | None = _norm(cfg) if cfg.post_norms else None
        if cfg.layer_is_moe(layer_id):
            self.moe = _moe(cfg)
        else:  # a dense model, or an MoE model's dense first blocks (DeepSeek)
            self.feed_forward = FeedForward(
                cfg.dim,
                cfg.dense_ffn_dim or cfg.ffn_dim,
                activation=cfg.activation,
                bias=cfg.bias,
            )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None = None,
        sin: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # keywords, only when set: TP input plans see 3 args
        attn_kw = {k: t for k, t in (("mask", mask), ("documents", documents)) if t is not None}
        a = self.attention(self.attention_norm(x), cos, sin, **attn_kw)
        if self.post_attention_norm is not None:
            a = self.post_attention_norm(a)
        x = x + a
        mlp = self.moe if hasattr(self, "moe") else self.feed_forward
        m = mlp(self.ffn_norm(x))
        if self.post_ffn_norm is not None:
            m = self.post_ffn_norm(m)
        return x + m


class Transformer(nn.Module):
    """The whole decoder (or a pipeline stage of it; see the module docstring)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tie_embeddings = cfg.tie_embeddings
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos_embeddings: nn.Embedding | None = (
            nn.Embedding(cfg.max_seq_len, cfg.dim) if cfg.position == "learned" else None
        )
        self.rope: RotaryEmbedding | None = (
            RotaryEmbedding(cfg.rope_dim, cfg.max_seq_len, cfg.rope_theta)
            if cfg.position == "rope"
            else None
        )
        local = cfg.rope_local_theta
        self.rope_local: RotaryEmbedding | None = (
            RotaryEmbedding(cfg.rope_dim, cfg.max_seq_len, local)
            if local and local != cfg.rope_theta
            else None
        )
        """Gemma 3: the sliding-window layers' own RoPE base (`model.rope_local_theta`)."""
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(cfg, i) for i in range(cfg.num_layers)}
        )
        self.norm: nn.Module | None = _norm(cfg)
        self.output: nn.Linear | None = (
            None if cfg.tie_embeddings else nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        )
        self.input_seq_shards = 1
        """Sequence parallelism sets this to tp: a pipeline stage's hidden-state input is then
        this rank's T/tp slice of the sequence, and positions must still cover all T."""
        self.document_sep_id: int | None = None
        """Set (by the trainer, `data.document_masking`) to the end-of-document id: attention
        then stays inside each packed document and positions restart at each (see
        `documents.py`)."""
        self.loss_chunk_tokens = 0
        """Tokens per chunk of the fused head + loss (`models.loss`); 0 = auto. The trainer
        sets it from `memory.loss_chunk_tokens`."""
        self.head_loss: Callable[..., torch.Tensor] = linear_cross_entropy
        """(hidden, head weight, targets, *, chunk_tokens) -> loss. Tensor parallelism
        replaces it with the vocabulary-parallel version (DTensor in, no logits gathered)."""

    def blocks(self) -> list[TransformerBlock]:
        """`layers`' blocks in order, for the strategies that edit them (TP, CP) and so must
        run before activation checkpointing wraps them (`parallelize`'s order)."""
        out = []
        for name, block in self.layers.items():
            if not isinstance(block, TransformerBlock):
                raise TypeError(
                    f"layers.{name} is a {type(block).__name__}, not a "
                    "TransformerBlock: apply tensor/context parallelism before "
                    "activation checkpointing (parallelize's order)"
                )
            out.append(block)
        return out

    def head_weight(self) -> torch.Tensor | None:
        """The (V, h) head weight applied by this module (tied: the embedding), else None."""
        if self.output is not None:
            return self.output.weight
        if self.tie_embeddings and self.tok_embeddings is not None and self.norm is not None:
            return self.tok_embeddings.weight
        return None

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        targets: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens: (B, T) ids, or (B, T, h) hidden states when `tok_embeddings` is None.

        positions: optional (T,) or (B, T) position ids (default 0..T-1); context parallelism
        passes the non-contiguous positions of its load-balanced shard. Returns (B, T, V)
        logits, or (B, T, h) hidden states on a stage without norm and head. With `targets`
        (B, T) on a module holding the head: the mean next-token cross-entropy instead,
        computed by `head_loss` without materializing the logits (the training path; the
        logits path stays for generation and evaluation tools).

        documents: with document masking, the (B, T_full) document index of every token of
        the *whole* sequence (`documents.document_ids`) with the restarted positions. Under
        context parallelism (this module computes a shard, T < T_full) the ring attention core
        masks with them; otherwise (pipeline stages, which see hidden states and cannot find
        the boundaries themselves) they give the block-causal mask.
        """
        t = tokens.shape[1] * (self.input_seq_shards if self.tok_embeddings is None else 1)
        layer_kw = {}
        if documents is not None and documents.shape[1] == t:  # this module runs all T
            layer_kw = {"mask": document_mask(documents)}
            documents = None
        elif documents is not None:  # a cp shard: ring attention masks with the whole T's ids
            layer_kw = {"documents": documents}
        elif self.document_sep_id is not None and self.tok_embeddings is not None:
            docs = document_layout(tokens, self.document_sep_id)
            positions, layer_kw = docs.positions, {"mask": docs.mask}
        window = self.config.sliding_window
        local_kw = layer_kw  # what the windowed layers take (all layers, or Gemma's local ones)
        if window and t > window and documents is None:  # cp x window: config/layout.py
            band = sliding_window_mask(t, window, tokens.device)  # (T, T)
            local_kw = {"mask": band if not layer_kw else layer_kw["mask"] & band}
        if positions is None:
            positions = torch.arange(t, device=tokens.device)
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)  # (B, T, h)
            if self.config.scale_embeddings:  # Gemma: sqrt(h), rounded to the table's dtype
                h = h * torch.tensor(math.sqrt(self.config.dim), dtype=h.dtype, device=h.device)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(positions)
        else:
            h = tokens
        cos, sin = self.rope(positions) if self.rope is not None else (None, None)
        cos_l, sin_l = self.rope_local(positions) if self.rope_local is not None else (cos, sin)
        for name, layer in self.layers.items():
            if self.config.layer_window(int(name)):
                h = layer(h, cos_l, sin_l, **local_kw)
            else:
                h = layer(h, cos, sin, **layer_kw)
        if self.norm is not None:
            h = self.norm(h)
        weight = self.head_weight()
        cap = self.config.logit_softcap
        if targets is not None and weight is not None:
            return self.head_loss(
                h, weight, targets, chunk_tokens=self.loss_chunk_tokens, softcap=cap
            )
        if self.output is not None:
            return _softcap(self.output(h), cap)  # (B, T, V)
        if self.tie_embeddings and self.tok_embeddings is not None and self.norm is not None:
            return _softcap(F.linear(h, self.tok_embeddings.weight), cap)  # (B, T, V)
        return h


def _softcap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(logits / cap) (Gemma 2's final-logit soft-capping); the logits for cap 0."""
    return torch.tanh(logits / cap) * cap if cap else logits


def sliding_window_mask(t: int, window: int, device: torch.device) -> torch.Tensor:
    """(T, T) bool, True = attend: key j is visible to query i when i - window < j <= i
    (the window holds the query itself and window - 1 earlier positions, as Mistral)."""
    i = torch.arange(t, device=device)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d < window)


def build_model(
    cfg: ModelConfig, *, device: str | torch.device = "meta", seed: int = 0
) -> Transformer:
    """Build on `device`; "meta" (default) allocates nothing (parallelize, then `materialize`).

    On a real device the model is built on meta and materialized with `seed`, so its weights
    are the same as those of any parallelized copy materialized with the same seed.
    """
    with torch.device("meta"):
        model = Transformer(cfg)
    if torch.device(device).type != "meta":
        from .init import materialize

        materialize(model, device=device, seed=seed)
    return model


def causal_lm_loss(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100
) -> torch.Tensor:
    """Mean next-token cross-entropy over targets != ignore_index, computed in fp32.

    logits: (B, T, V); targets: (B, T), already shifted (targets[:, i] follows tokens[:, i]).
    """
    loss = F.cross_entropy(
        upcast(logits).reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index
    )
    if hasattr(loss, "placements"):  # loss_parallel (a DTensor): left as computed
        return loss
    # SFT windows can hold prompt tokens only: no target, loss 0 and zero gradient instead of
    # the mean over nothing (NaN); `where` keeps it free of a host sync
    return torch.where((targets != ignore_index).any(), loss, torch.zeros_like(loss))
