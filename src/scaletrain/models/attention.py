"""Causal self-attention: projections, rotary embeddings and two interchangeable cores.

The attention *core* (softmax(QK^T/sqrt(d)) V, causal) is its own submodule, `Attention.core`,
so that context parallelism can swap it for ring attention and selective activation
checkpointing can wrap exactly it. Both cores take K/V with the (possibly fewer) KV heads of
grouped-query attention and never store expanded copies for backward: SDPA reads the g KV
heads itself (`enable_gqa=True`), the naive core broadcasts them (an expand view, not a copy).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..numerics import upcast
from .norms import RMSNorm

__all__ = [
    "Attention",
    "NaiveAttentionCore",
    "SDPAAttentionCore",
    "RotaryEmbedding",
    "apply_rotary",
    "make_attention_core",
]


def _group_queries(q: torch.Tensor, num_kv: int) -> torch.Tensor:
    # (B, nh, T, hd) -> (B, g, nh/g * T, hd): query head i reads KV head i // (nh/g), the
    # grouping of Ainslie et al. 2023 (GQA) and of Hugging Face's `repeat_kv`. A group's
    # query heads are stacked along the rows, so plain batched matmuls against the g KV
    # heads need no broadcasting (a broadcast matmul would save expanded K/V copies).
    b, nh, t, hd = q.shape
    return q.reshape(b, num_kv, nh // num_kv * t, hd)


class NaiveAttentionCore(nn.Module):
    """Textbook causal attention: materializes the (T, T) scores, softmax in fp32.

    Memory is quadratic in T; kept as the readable reference the fused kernel is tested against
    and as the backend whose activations match the Korthikanti et al. 2022 accounting.

    `softcap` c > 0 (Gemma 2's attention logit soft-capping): the fp32 scores become
    c * tanh(scores / c) before the mask and the softmax, as HF's Gemma2 eager attention
    (which caps in the compute dtype); the tanh output is one more saved S x S fp32 tensor
    (the divide and tanh run in place, so the forward holds no more S x S buffers at once than
    without the cap).
    """

    def __init__(self, softcap: float = 0.0) -> None:
        super().__init__()
        self.softcap = softcap

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        # q: (B, nh, T, hd); k, v: (B, nkv, S, hd) with nh a multiple of nkv; causal with the
        # last query aligned to the last key (S == T here). `mask`: (B, 1, T, S) or (T, S) bool,
        # True = attend; replaces the causal mask (document masking passes a block-causal one).
        # Grouped, so autograd saves the g KV heads, not nh expanded copies.
        b, nh, t, hd = q.shape
        g, s = k.shape[1], k.shape[-2]
        qg = _group_queries(q, g)  # (B, g, nh/g*T, hd)
        scores = (qg @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, g, nh/g*T, S)
        if mask is None:
            mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)
        # (..., nh/g*T, S): row j is query position j % T
        mask = mask.repeat(*([1] * (mask.dim() - 2)), nh // g, 1)
        scores = upcast(scores)
        if self.softcap:
            # in place on the fp32 scores (no backward reads them): one S x S buffer less at
            # once than tanh(scores / c) * c, the saved tanh and the capped scores only
            scores = scores.div_(self.softcap).tanh_() * self.softcap
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        return (probs @ v).view(b, nh, t, v.shape[-1])  # (B, nh, T, hd_v)


class SDPAAttentionCore(nn.Module):
    """`F.scaled_dot_product_attention(is_causal=True)`: flash / memory-efficient kernels."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        # enable_gqa: the kernel reads the g KV heads itself, so backward keeps K and V at
        # (B, g, T, hd) instead of expanded (B, nh, T, hd) copies (CPU flash and CUDA flash
        # kernels; a kernel without GQA support falls back to math, which expands inside).
        gqa = q.shape[1] != k.shape[1]
        if mask is not None:  # block-causal (document masking): no flash kernel takes it
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=gqa
            )  # (B, nh, T, hd)
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=gqa
        )  # (B, nh, T, hd)


def make_attention_core(backend: str, softcap: float = 0.0) -> nn.Module:
    if backend == "naive":
        return NaiveAttentionCore(softcap)
    if softcap:  # (config.ModelConfig refuses this pair first)
        raise ValueError("attention soft-capping needs the 'naive' backend (SDPA has none)")
    if backend == "sdpa":
        return SDPAAttentionCore()
    raise ValueError(f"attention backend {backend!r}: use 'sdpa' or 'naive'")


class RotaryEmbedding(nn.Module):
    """cos/sin tables of rotary position embeddings (Su et al. 2021), Hugging Face layout.

    Layout: the frequencies are duplicated, `cat(freqs, freqs)`, and pairs are (i, i + hd/2)
    (`rotate_half`), as in HF `LlamaRotaryEmbedding` — so Llama checkpoints from HF copy over
    without permuting wq/wk. Tables are non-persistent buffers (not in the state dict);
    `reset_tables()` recomputes them after meta-device materialization.
    """

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.max_seq_len, self.theta = head_dim, max_seq_len, theta
        self.register_buffer("cos", torch.empty(max_seq_len, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_seq_len, head_dim), persistent=False)
        if self.cos.device.type != "meta":
            self.reset_tables()

    @torch.no_grad()
    def reset_tables(self) -> None:
        device = self.cos.device
        # inv_freq_j = theta^(-2j/hd), j < hd/2; computed in fp32 like HF so logits match.
        inv_freq = 1.0 / (
            self.theta
            ** (
                torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float()
                / self.head_dim
            )
        )
        pos = torch.arange(self.max_seq_len, device=device).float()
        freqs = torch.outer(pos, inv_freq)  # (S, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (S, hd)
        self.cos.copy_(emb.cos())
        self.sin.copy_(emb.sin())

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: (T,) or (B, T) integer ids -> cos, sin of shape (T, hd) or (B, T, hd)
        return self.cos[positions], self.sin[positions]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x: (B, nh, T, hd) by cos/sin: (T, hd) or (B, T, hd); math in fp32."""
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, hd)
    xf = upcast(x)
    return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)


class Attention(nn.Module):
    """Multi-head / grouped-query causal self-attention.

    `n_heads` and `n_kv_heads` are the *local* head counts: tensor parallelism shards wq/wk/wv
    column-wise and wo row-wise, then divides these attributes; forward reads them, never the
    config.

    `fused_qkv` (`model.fused_qkv`): q, k and v come from one matmul against the three weights
    concatenated (`cat([wq, wk, wv])`, as nanoGPT's `c_attn`), split after; the parameters stay
    three Linears, so names, checkpoints and Hugging Face export do not change. Used only where
    all three are plain `nn.Linear` (fp8 swaps them for its own modules); tensor parallelism,
    whose hooks sit on each Linear, turns it off.

    `head_dim` (default dim // n_heads) may make the query width n_heads * head_dim differ
    from dim (Qwen3-32B). `qkv_bias` gives wq/wk/wv biases when `bias` is off (Qwen2).
    `qk_norm` adds `q_norm` and `k_norm`, RMSNorms over head_dim applied to every query and
    key head before RoPE (Qwen3); their (head_dim,) weights are shared by all heads, so
    tensor parallelism keeps them whole on every rank.

    `scale` (default 1/sqrt(head_dim)): the factor of q.k; another one (Gemma 2's
    1/sqrt(query_pre_attn_scalar)) is applied to q before the core, as Gemma's reference
    implementation scales its queries, so every core (SDPA, naive, ring attention) keeps its
    own 1/sqrt(head_dim). `softcap`: the naive core's score soft-capping.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        *,
        bias: bool,
        backend: str,
        fused_qkv: bool = False,
        head_dim: int | None = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        norm_eps: float = 1e-5,
        scale: float | None = None,
        softcap: float = 0.0,
        norm_plus_one: bool = False,
    ) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.fused_qkv = fused_qkv
        self.head_dim = head_dim or dim // n_heads
        hd, in_bias = self.head_dim, bias or qkv_bias
        self.wq = nn.Linear(dim, n_heads * hd, bias=in_bias)
        self.wk = nn.Linear(dim, n_kv_heads * hd, bias=in_bias)
        self.wv = nn.Linear(dim, n_kv_heads * hd, bias=in_bias)
        self.wo = nn.Linear(n_heads * hd, dim, bias=bias)
        plus = norm_plus_one
        self.q_norm: RMSNorm | None = RMSNorm(hd, norm_eps, plus_one=plus) if qk_norm else None
        self.k_norm: RMSNorm | None = RMSNorm(hd, norm_eps, plus_one=plus) if qk_norm else None
        # q is multiplied by this before the core (1.0: the core's own 1/sqrt(hd) is the scale)
        self.q_factor = 1.0 if scale is None else scale * math.sqrt(hd)
        self.core = make_attention_core(backend, softcap)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) of x: (B, T, h), each (B, T, heads * hd)."""
        lins = (self.wq, self.wk, self.wv)
        if not (self.fused_qkv and all(type(m) is nn.Linear for m in lins)):
            return self.wq(x), self.wk(x), self.wv(x)
        # backward: one matmul for the input's gradient and one for the three weights'
        # (the split's gradients meet in one (B, T, q + 2 kv) tensor), instead of three each
        weight = torch.cat(tuple(m.weight for m in lins))
        biases = tuple(m.bias for m in lins if m.bias is not None)
        bias = torch.cat(biases) if len(biases) == 3 else None
        q, k, v = F.linear(x, weight, bias).split([m.out_features for m in lins], dim=-1)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None = None,
        sin: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        q, k, v = self._project(x)
        q = q.view(b, t, self.n_heads, hd)  # (B, T, nh, hd)
        k = k.view(b, t, self.n_kv_heads, hd)  # (B, T, nkv, hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # per head, over hd
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, nh, T, hd), (B, nkv, T, hd)
        v = v.view(b, t, self.n_kv_heads, hd).transpose(1, 2)  # (B, nkv, T, hd)
        if cos is not None and sin is not None:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.q_factor != 1.0:
            q = q * self.q_factor
        # mask / documents go by keyword only when set: the ring attention core takes no mask,
        # and only it takes the whole sequence's document ids (cp + document masking)
        kw = {k: t for k, t in (("mask", mask), ("documents", documents)) if t is not None}
        out = self.core(q, k, v, **kw)
        out = out.transpose(1, 2).reshape(b, t, self.n_heads * hd)  # (B, T, nh*hd)
        return self.wo(out)
