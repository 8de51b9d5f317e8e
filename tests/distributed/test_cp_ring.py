import pytest
import torch
import torch.nn.functional as F

from scaletrain.parallel.context_parallel import cp_positions, cp_shard, cp_unshard
from scaletrain.parallel.launch import spawn

from ._cp_fns import (
    document_model_grads,
    document_tokens,
    ring_attention_document_shards,
    ring_attention_shards,
)

# (B, nh, nkv, T, hd, seed): MHA and GQA (4 query heads on 2 KV heads)
CASES = [(2, 4, 4, 16, 8, 0), (1, 4, 2, 32, 16, 1)]


def test_shard_unshard_roundtrip_and_positions():
    x = torch.arange(2 * 16).view(2, 16)
    for size in (1, 2, 4):
        shards = [cp_shard(x, r, size) for r in range(size)]
        assert torch.equal(cp_unshard(shards), x)
    # cp=2, T=8: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert cp_positions(8, 0, 2).tolist() == [0, 1, 6, 7]
    assert cp_positions(8, 1, 2).tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="2\\*cp"):
        cp_shard(torch.zeros(1, 6), 0, 2)


def _reference(b, nh, nkv, t, hd, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, t, hd, generator=g).requires_grad_() for n in (nh, nkv, nkv))
    dout = torch.randn(b, nh, t, hd, generator=g)
    rep = nh // nkv
    out = F.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True
    )
    out.backward(dout)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_matches_full_causal_sdpa(cp):
    per_rank = spawn(ring_attention_shards, cp, CASES)
    for i, case in enumerate(CASES):
        ref = _reference(*case)
        for name in ("out", "dq", "dk", "dv"):
            got = cp_unshard([per_rank[r][i][name] for r in range(cp)], dim=2)
            torch.testing.assert_close(
                got, ref[name], atol=1e-5, rtol=1e-5, msg=f"{name} case {case} cp={cp}"
            )


def _document_reference(b, nh, nkv, t, hd, seed):
    """One process, float64, block-causal mask of `document_layout` (the non-cp path)."""
    from scaletrain.models.documents import document_layout

    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(b, n, t, hd, generator=g).double().requires_grad_() for n in (nh, nkv, nkv)
    )
    dout = torch.randn(b, nh, t, hd, generator=g).double()
    rep = nh // nkv
    mask = document_layout(document_tokens(b, t, seed), 0).mask
    out = F.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask
    )
    out.backward(dout)
    return {
        n: x.float()
        for n, x in {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}.items()
    }


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_with_documents_matches_block_causal(cp):
    from scaletrain.models.documents import document_ids

    per_rank = spawn(ring_attention_document_shards, cp, CASES)
    for i, case in enumerate(CASES):
        b, nh, nkv, t, hd, seed = case
        docs, _ = document_ids(document_tokens(b, t, seed), 0)
        # documents cross the shard chunk boundaries (chunks of t / 2cp tokens)
        bounds = range(t // (2 * cp), t, t // (2 * cp))
        assert any(bool((docs[:, c - 1] == docs[:, c]).any()) for c in bounds)
        ref = _document_reference(*case)
        # fp32 ring vs float64 reference: each output is a softmax-weighted mean of <= T
        # unit-normal values, fp32 rounding ~1e-7 per op over O(T) terms: 1e-5 as above
        for name in ("out", "dq", "dk", "dv"):
            got = cp_unshard([per_rank[r][i][name] for r in range(cp)], dim=2)
            torch.testing.assert_close(
                got, ref[name], atol=1e-5, rtol=1e-5, msg=f"{name} case {case} cp={cp}"
            )
        unmasked = cp_unshard([per_rank[r][i]["unmasked"] for r in range(cp)], dim=2)
        assert (unmasked - ref["out"]).abs().max() > 0.1  # the mask acts


def _one_process_document_grads(b, t, seed):
    """The non-cp path: tiny-llama with `document_sep_id` = 0 on the whole (B, T) batch."""
    from scaletrain.config import resolve_model
    from scaletrain.models import build_model

    model = build_model(resolve_model("tiny-llama"), device="cpu", seed=0)
    model.document_sep_id = 0
    tokens = document_tokens(b, t + 1, seed)
    loss = model(tokens[:, :-1], targets=tokens[:, 1:])
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.distributed
@pytest.mark.slow
def test_cp2_document_masked_model_matches_one_process():
    b, t, seed = 2, 32, 3
    ref_loss, ref_grads = _one_process_document_grads(b, t, seed)
    (loss, grads), _ = spawn(document_model_grads, 2, b, t, seed, True)
    (plain_loss, _), _ = spawn(document_model_grads, 2, b, t, seed, False)
    # fp32 both sides, the same ops up to the attention's summation order (LSE merge of ring
    # blocks vs one softmax) and the cp mean of two shard means: a few fp32 ulps. Measured
    # (seeds 3 and 4, 1 and 2 threads): loss 1 ulp (rel 8e-8), gradients at most 1.2e-7 abs
    # (2 ulps of the largest, ~0.6); 8x and 20x margins below
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    for n, g in ref_grads.items():
        torch.testing.assert_close(grads[n], g, atol=1e-6, rtol=1e-5, msg=n)
    # unmasked cp2 attends across documents: 0.011 off here, 1e4x the parity tolerance
    assert abs(plain_loss - ref_loss) > 1e-3


def test_degree_one_is_a_no_op():
    from scaletrain.config import resolve_model
    from scaletrain.models import build_model
    from scaletrain.parallel.context_parallel import apply_cp
    from scaletrain.parallel.expert_parallel import apply_ep

    model = build_model(resolve_model("tiny-moe"), device="meta")
    before = [(n, type(m)) for n, m in model.named_modules()]
    assert apply_cp(model, None) is model and apply_ep(model, None) is model
    assert [(n, type(m)) for n, m in model.named_modules()] == before


@pytest.mark.parametrize("causal", [True, False])
def test_math_block_kernels_match_the_cpu_flash_kernels(causal):
    # the math blocks serve non-CPU devices; check them against the aten CPU kernels here
    from scaletrain.parallel import context_parallel as cp

    g = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(2, 3, 8, 16, generator=g) for _ in range(4))
    scale = 0.25
    out, lse = cp._block_fwd(q, k, v, causal, scale)
    m_out, m_lse = cp._math_block_fwd(q, k, v, causal, scale)
    torch.testing.assert_close(m_out, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m_lse, lse, atol=1e-5, rtol=1e-5)
    for a, b in zip(
        cp._math_block_bwd(dout, q, k, v, out, lse, causal, scale),
        cp._block_bwd(dout, q, k, v, out, lse, causal, scale),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
