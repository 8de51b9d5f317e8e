import pytest
import torch
import torch.nn.functional as F

from scaletrain.parallel.context_parallel import cp_positions, cp_shard, cp_unshard
from scaletrain.parallel.launch import spawn

from ._cp_fns import ring_attention_shards

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
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1),
                                         v.repeat_interleave(rep, 1), is_causal=True)
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
            torch.testing.assert_close(got, ref[name], atol=1e-5, rtol=1e-5,
                                       msg=f"{name} case {case} cp={cp}")


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
    for a, b in zip(cp._math_block_bwd(dout, q, k, v, out, lse, causal, scale),
                    cp._block_bwd(dout, q, k, v, out, lse, causal, scale), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
