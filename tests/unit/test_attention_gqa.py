"""Grouped-query attention keeps the g KV heads for backward, never nh expanded copies.

The cores are checked against the textbook expansion (`repeat_interleave` of K/V to all query
heads, then causal attention in float64) and the bytes autograd saves are counted with
`saved_tensors_hooks`: the exact ledger of each core is written out below.
"""

from __future__ import annotations

import math

import pytest
import torch

from scaletrain.models.attention import NaiveAttentionCore, SDPAAttentionCore

B, NH, G, T, HD = 2, 8, 2, 24, 16
E = 4  # fp32 bytes


def _inputs():
    g = torch.Generator().manual_seed(0)
    # q as the model makes it: a (B, T, nh, hd) projection transposed (not contiguous)
    q = torch.randn(B, T, NH, HD, generator=g).transpose(1, 2)
    k = torch.randn(B, G, T, HD, generator=g)
    v = torch.randn(B, G, T, HD, generator=g)
    return q, k, v


def _expanded_reference(q, k, v):
    rep = NH // G
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(HD)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def _saved_bytes(core, q, k, v) -> tuple[torch.Tensor, int]:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = core(q, k, v)
    return out, total


@pytest.mark.parametrize("core", [NaiveAttentionCore(), SDPAAttentionCore()], ids=["naive", "sdpa"])
def test_gqa_cores_match_the_expanded_reference(core):
    q, k, v = (x.double().requires_grad_() for x in _inputs())
    ref = _expanded_reference(q, k, v)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    q2, k2, v2 = (x.detach().float().requires_grad_() for x in (q, k, v))
    out = core(q2, k2, v2)
    grads = torch.autograd.grad(out.square().sum(), (q2, k2, v2))
    assert out.shape == (B, NH, T, HD)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_saved_bytes_hold_kv_heads_not_query_heads():
    q, k, v = (x.requires_grad_() for x in _inputs())
    qkv = B * T * HD * E * (NH + 2 * G)  # q at nh heads, k and v at g heads
    kv_expanded = 2 * B * T * HD * E * (NH - G)  # what the repeat_interleave copies added
    # SDPA (CPU flash kernel): q, k, v, the output (B, nh, T, hd) and the fp32 lse (B, nh, T)
    _, sdpa = _saved_bytes(SDPAAttentionCore(), q, k, v)
    assert sdpa == qkv + B * NH * T * HD * E + B * NH * T * 4
    # naive: q (grouped copy), k, v, fp32 scores and probabilities, the bool mask per group
    _, naive = _saved_bytes(NaiveAttentionCore(), q, k, v)
    assert naive == qkv + 2 * B * NH * T * T * 4 + (NH // G) * T * T

    # the previous recipe (K/V expanded by repeat_interleave before SDPA) saved the copies
    def expanded_sdpa(q, k, v):
        rep = NH // G
        return torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), is_causal=True
        )

    _, old = _saved_bytes(expanded_sdpa, q, k, v)
    assert old - sdpa == kv_expanded
