"""The fp8 GEMM emulation (`scaling.emulated_scaled_mm`) against `torch._scaled_mm`."""

from __future__ import annotations

import pytest
import torch

from scaletrain.precision import E4M3, E5M2, quantize
from scaletrain.precision.scaling import emulated_scaled_mm, tiled_scaled_mm

U32 = 2.0**-24  # fp32 unit roundoff
U_BF16 = 2.0**-8  # bf16 unit roundoff: round to nearest, 8 significant bits

# The GEMMs fp8.py runs, as (a's dtype, b's dtype, out dtype, scale mode): tensorwise forward
# (E4M3 x E4M3 -> the compute dtype: bf16 under autocast, fp32 without), dgrad (E5M2 dy x E4M3
# W -> x's dtype), wgrad (E5M2 dy^T x E4M3 x -> fp32); tilewise's per-128-slice rowwise GEMMs
# (E4M3 x E4M3 forward, E5M2 x E4M3 backward -> bf16 partials). E5M2 x E5M2 never runs.
CASES = [
    (E4M3, E4M3, torch.bfloat16, "tensorwise"),
    (E4M3, E4M3, torch.float32, "tensorwise"),
    (E5M2, E4M3, torch.bfloat16, "tensorwise"),
    (E5M2, E4M3, torch.float32, "tensorwise"),
    (E4M3, E4M3, torch.bfloat16, "rowwise"),
    (E5M2, E4M3, torch.bfloat16, "rowwise"),
]


def _operands(a_dtype, b_dtype, mode, m=32, k=128, n=48, seed=0):
    """fp8 a (m, k) row-major and b (k, n) column-major with scales as fp8.py makes them:
    `quantize` per tensor (0-dim scales) or per row of a and column of b (a (m, 1) and a
    (1, n) scale: the 1x128 / 128x128 tiles of one 128-wide K-slice). Heavy-tailed values
    (a few 30x outliers) so the scales and both formats' ranges are exercised."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g))
    w = torch.randn(n, k, generator=g)
    x[0, :4] *= 30.0
    tile = (1, k) if mode == "rowwise" else None
    a, sa = quantize(x, a_dtype, tile)
    wq, sw = quantize(w, b_dtype, tile)
    if mode == "rowwise":
        return a, wq.t(), sa.contiguous(), sw.t().contiguous()  # (m, 1), (1, n)
    return a, wq.t(), sa, sw


def _bound(a, b, sa, sb, ref, out_dtype):
    """How far two correct fp32-accumulating kernels may land apart, elementwise.

    Each computes S = sum_k (a_ik sa_i)(b_kj sb_j) in fp32 with K-1 additions in its own order
    (the emulation: a blocked BLAS sum of dequantized products; a fused fp8 GEMM: a sum of the
    exact fp8 products, then the scales). Rounding operands, products, K-1 partial sums and
    the scaling costs at most (K+2) roundings per term, so each result is within
    gamma_{K+2} * sum_k |a_ik sa_i||b_kj sb_j| of S (Higham, Accuracy and Stability of
    Numerical Algorithms, eq. 3.5; gamma_n = n u / (1 - n u)), whatever the summation order,
    blocking or thread count; the two results within twice that of each other. Not one ulp of
    fp32: cancellation can make S tiny next to sum |a||b|. A bf16 output rounds each result
    once more (half a bf16 ulp, <= u_bf16 |value|, each): within one bf16 ulp on top.
    """
    n = a.shape[1] + 2
    gamma = n * U32 / (1 - n * U32)
    abs_sum = (a.float().abs() * sa.abs()) @ (b.float().abs() * sb.abs())  # (M, N)
    e = 2 * gamma * abs_sum
    if out_dtype == torch.bfloat16:
        e = e + 2 * U_BF16 * (ref.float().abs() + e)
    return e


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize(("a_dtype", "b_dtype", "out_dtype", "mode"), CASES)
def test_emulation_matches_scaled_mm(a_dtype, b_dtype, out_dtype, mode, threads):
    """`emulated_scaled_mm` vs `torch._scaled_mm`: within `_bound` (fp32 output: the K-term fp32
    summation bound; bf16 output: that plus one bf16 ulp), not asserted bitwise. The two are
    bitwise equal where the CPU's `_scaled_mm` is torch's reference path (dequantize, fp32
    matmul: AMD EPYC / AVX-512 without AMX, measured), but oneDNN's fp8 GEMM (AMX hosts) and
    cuBLASLt accumulate in their own order, so bitwise cannot be promised. The bound holds for
    any order, so 1, 2 and 4 threads (different blockings) must all pass."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b, sa, sb = _operands(a_dtype, b_dtype, mode)
        ref = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
        emu = emulated_scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    finally:
        torch.set_num_threads(before)
    assert emu.dtype == ref.dtype == out_dtype and emu.shape == ref.shape
    err = (emu.float() - ref.float()).abs()
    bound = _bound(a, b, sa, sb, ref, out_dtype)
    assert bool((err <= bound).all()), f"worst excess {(err - bound).max().item():.3g}"


def test_the_bound_is_not_vacuous():
    """The tolerance rejects a wrong kernel: dropping one operand's scale, or one K-term."""
    a, b, sa, sb = _operands(E4M3, E4M3, "tensorwise")
    ref = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    bound = _bound(a, b, sa, sb, ref, torch.float32)
    wrong = emulated_scaled_mm(a[:, 1:], b[1:], scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    assert bool(((wrong - ref).abs() > bound).any())
    unscaled = emulated_scaled_mm(a, b, scale_a=sa, scale_b=sb * 0 + 1, out_dtype=torch.float32)
    assert bool(((unscaled - ref).abs() > bound).any())


def test_tiled_emulation_matches_tiled_scaled_mm():
    """Tile-wise: the same bf16 partial per K-slice within `_bound`, summed in the same fp32
    order: within K/128 partial bounds plus the sums' own rounding."""
    a, b, sa, sb = _operands(E4M3, E4M3, "tensorwise", k=256)
    del sa, sb
    xa, sxa = quantize(a.float(), E4M3, (1, 128))  # (32, 256), (32, 2)
    wq, sw = quantize(b.t().float(), E4M3, (1, 128))  # (48, 256), (48, 2)
    ref = tiled_scaled_mm(xa, sxa, wq.t(), sw.t().contiguous())
    emu = tiled_scaled_mm(xa, sxa, wq.t(), sw.t().contiguous(), emulate=True)
    bound = torch.zeros_like(ref)
    for i in range(2):
        sl = slice(i * 128, (i + 1) * 128)
        part = emulated_scaled_mm(
            xa[:, sl],
            wq.t()[sl],
            scale_a=sxa[:, i : i + 1].contiguous(),
            scale_b=sw[:, i : i + 1].t().contiguous(),
            out_dtype=torch.bfloat16,
        )
        bound += _bound(
            xa[:, sl], wq.t()[sl], sxa[:, i : i + 1], sw[:, i : i + 1].t(), part, torch.bfloat16
        )
    bound += 2 * U32 * (ref.abs() + bound)  # the partials' fp32 sum, rounded in both
    assert bool(((emu - ref).abs() <= bound).all())
