"""Multi-head Latent Attention (DeepSeek-V2, arXiv:2405.04434 sec. 2.1; DeepSeek-V3 sec. 2.1.1).

Keys and values of every head are expanded from one compressed latent per token, which is what
an inference cache keeps (kv_lora_rank + qk_rope_head_dim numbers per token and layer instead
of 2 x heads x head_dim); queries optionally go through a latent of their own:

    c_q  = q_norm(wq_a x)                      (B, T, r_q)        [or q = wq x, no q latent]
    q    = wq_b c_q -> (nope | rope) per head  (B, T, nh, dn + dr)
    c_kv = kv_norm(wkv_a x)                    (B, T, r_kv)
    k_r  = rope(wk_rope x)                     (B, T, dr), one for all heads (decoupled RoPE)
    k, v = wkv_b c_kv -> (k_nope | v) per head (B, T, nh, dn), (B, T, nh, dv)
    out  = wo attention([q_nope, rope(q_rope)], [k_nope, k_r], v)

The checkpoint's `kv_a_proj_with_mqa` holds wkv_a's rows and then wk_rope's; they are two
Linears here so that tensor parallelism can treat the RoPE key (whose gradient every rank's
heads contribute to) apart from the latent (checkpoint/hf.py splits and joins the rows, as
Phi-3's fused tensors). Training materializes the per-head keys and values (as Hugging Face's
and DeepSeek's training code do); the latent is what inference would cache.

The core is the same module as `Attention.core` (SDPA or naive). Values narrower than the
query/key heads (dv < dn + dr) are zero-padded to that width before SDPA and the output cut
back: torch's flash kernels (CPU and CUDA) need one head width for q, k and v, and without it
SDPA falls back to its math path, which materializes the (T, T) scores. Zero columns of v give
zero output columns and change no other (torchtitan's DeepSeek-V3 does the same).

`n_heads` is the local head count: tensor parallelism splits wq / wq_b, wkv_b (column-wise, by
heads) and wo (row-wise) and divides it; the down-projections and latent norms stay whole on
every rank (parallel/tensor_parallel_mla.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import NaiveAttentionCore, apply_rotary, make_attention_core
from .norms import RMSNorm

__all__ = ["MLAttention"]


class MLAttention(nn.Module):
    """Multi-head Latent Attention; see the module docstring."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        *,
        q_lora_rank: int,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        norm_eps: float,
        backend: str,
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_heads  # (what tensor parallelism divides alongside n_heads)
        self.fused_qkv = False
        self.nope, self.rope_dim, self.v_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.qk_dim = qk_nope_head_dim + qk_rope_head_dim
        self.wq: nn.Linear | None = None
        self.wq_a: nn.Linear | None = None
        self.q_norm: RMSNorm | None = None
        self.wq_b: nn.Linear | None = None
        if q_lora_rank:
            self.wq_a = nn.Linear(dim, q_lora_rank, bias=False)
            self.q_norm = RMSNorm(q_lora_rank, norm_eps)
            self.wq_b = nn.Linear(q_lora_rank, n_heads * self.qk_dim, bias=False)
        else:
            self.wq = nn.Linear(dim, n_heads * self.qk_dim, bias=False)
        self.wkv_a = nn.Linear(dim, kv_lora_rank, bias=False)
        self.kv_norm = RMSNorm(kv_lora_rank, norm_eps)
        self.wk_rope = nn.Linear(dim, qk_rope_head_dim, bias=False)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_head_dim, dim, bias=False)
        self.core = make_attention_core(backend)

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.wq is not None:
            return self.wq(x)
        assert self.wq_a is not None and self.q_norm is not None and self.wq_b is not None
        return self.wq_b(self.q_norm(self.wq_a(x)))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None = None,
        sin: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if cos is None or sin is None:
            raise ValueError("Multi-head Latent Attention needs the RoPE tables (cos, sin)")
        b, t, _ = x.shape
        nh, dn, dv = self.n_heads, self.nope, self.v_dim
        q = self._queries(x).view(b, t, nh, self.qk_dim).transpose(1, 2)  # (B, nh, T, dn+dr)
        q_nope, q_rope = q.split([dn, self.rope_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(self.wkv_a(x)))  # (B, T, nh*(dn+dv))
        kv = kv.view(b, t, nh, dn + dv).transpose(1, 2)  # (B, nh, T, dn+dv)
        k_nope, v = kv.split([dn, dv], dim=-1)
        k_rope = self.wk_rope(x).unsqueeze(1)  # (B, 1, T, dr): one for all heads
        q_rope, k_rope = apply_rotary(q_rope, cos, sin), apply_rotary(k_rope, cos, sin)
        q = torch.cat((q_nope, q_rope), dim=-1)  # (B, nh, T, dn+dr)
        k = torch.cat((k_nope, k_rope.expand(-1, nh, -1, -1)), dim=-1)  # (B, nh, T, dn+dr)
        pad = self.qk_dim - dv
        if pad > 0 and not isinstance(self.core, NaiveAttentionCore):
            v = F.pad(v, (0, pad))  # (B, nh, T, dn+dr): one head width for the flash kernels
        kw = {k: t for k, t in (("mask", mask), ("documents", documents)) if t is not None}
        out = self.core(q, k, v, **kw)[..., :dv]  # (B, nh, T, dv)
        out = out.transpose(1, 2).reshape(b, t, nh * dv)  # (B, T, nh*dv)
        return self.wo(out)
