"""The HBM traffic a compiled torchtitan block still moves (elementwise.compiled_elementwise_bytes)
and FSDP2's copies on the compute stream (time.fsdp_copies.fsdp2_copy_bytes), each against a
recount written out here tensor by tensor."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset, model_preset
from scaletrain.planner.time.comm import CommInputs
from scaletrain.planner.time.elementwise import compiled_elementwise_bytes
from scaletrain.planner.time.fsdp_copies import fsdp2_copy_bytes

from ._recipe_step import one_llama_block

E = 2  # bytes of a 16-bit activation


def _regions(h: int, kv: int, f: int) -> dict[str, list[tuple[list[int], list[int]]]]:
    """The fused regions of a compiled torchtitan Llama block per token: (elements read,
    elements written) per region, by tensor; q/k/v reach SDPA at n_heads width (h), except v
    under MHA (kv == h), which repeat_kv hands over as it is."""
    gqa = kv < h
    rope_reads = [h, kv] + ([kv] if gqa else [])  # q, k (and v to repeat)
    rope_writes = [h, h] + ([h] if gqa else [])  # q, k repeated (and v repeated)
    fwd = [
        ([h], [h]),  # attention_norm: x -> xn
        (rope_reads, rope_writes),  # RoPE + repeat_kv
        ([h, h], [h, h]),  # x + wo(.) -> h1, ffn_norm(h1) -> hn
        ([f, f], [f]),  # silu(w1) * w3
        ([h, h], [h]),  # h1 + w2(.) -> out
    ]
    bwd = [
        ([f, f, f], [f, f]),  # dg, w1, w3 -> dw1, dw3
        ([h, h, h, h], [h]),  # ffn_norm bwd: 2 matmul grads, h1, dout -> dh1
        ([h, h], []),  # ffn_norm weight grad: dy, h1
        ([h, h] + ([h] if gqa else []), [h, kv] + ([kv] if gqa else [])),  # SDPA grads -> q, k, v
        ([h, h, h, h, h], [h]),  # attention_norm bwd: 3 matmul grads, x, dh1 -> dx
        ([h, h], []),  # attention_norm weight grad
    ]
    if not gqa:  # dv is read by wv's backward matmul directly
        bwd[3] = ([h, h], [h, kv])
    recompute = [
        ([h], [h]),  # xn again
        (rope_reads, rope_writes),  # q, k, v for SDPA's backward
        ([h, h], [h, h]),  # h1, hn again
        ([], [f]),  # silu(w1) * w3 for w2's weight gradient, in the SiLU backward's kernel
    ]
    return {"fwd": fwd, "bwd": bwd, "recompute": recompute}


def _recount(h: int, kv: int, f: int, recompute: bool) -> float:
    phases = ("fwd", "bwd", "recompute") if recompute else ("fwd", "bwd")
    regions = _regions(h, kv, f)
    return E * sum(sum(r) + sum(w) for p in phases for r, w in regions[p])


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("shape", [(4096, 32, 8, 14336), (768, 12, 4, 2048), (5120, 40, 40, 13824)])
def test_compiled_elementwise_bytes_recounted(
    shape: tuple[int, int, int, int], recompute: bool
) -> None:
    """COMPILED_* against the region-by-region recount above, GQA (Llama 3.1 8B, a small GQA
    block) and MHA (Llama 2 13B: no copy of v)."""
    m = one_llama_block(*shape)
    want = _recount(m.dim, m.kv_dim, m.ffn_dim, recompute)
    assert compiled_elementwise_bytes(m, recompute=recompute) == pytest.approx(want, rel=1e-12)


def test_compiled_llama3_8b_figure() -> None:
    """Llama 3.1 8B under SAC: 84h + 12kv + 18f = 614,400 B per token per block, under a
    quarter of the eager kernels' 2.54 MB."""
    m = model_preset("llama3-8b")
    assert compiled_elementwise_bytes(m, recompute=True) == 614_400
    assert compiled_elementwise_bytes(m, recompute=False) == 64 * 4096 + 8 * 1024 + 16 * 14336


def _inputs(layout: Layout, *, params: float, m: int = 1, fp8: float = 0.0) -> CommInputs:
    return CommInputs(
        layout=layout,
        hardware=hardware_preset("h100-sxm"),
        stage_params=params,
        layers=32,
        moe_layers=0,
        tokens=8192.0,
        hidden=4096,
        kv_dim=1024,
        experts_per_token=0.0,
        micro_batches=m,
        fp8_gather_params=fp8,
    )


def test_fsdp2_copy_bytes_counts() -> None:
    """Per step: ZeRO-3 gathers twice per micro-batch (forward, backward re-gather), each
    copied out (read + write, 2 x 2 B/param in bf16), and reduce-scatters once (read the bf16
    gradient, write fp32: 6 B/param); ZeRO-2 gathers once per micro-batch; fp8-gathered
    weights move 1 B each way; nothing below ZeRO-2 or with one shard."""
    p = 1e9
    assert fsdp2_copy_bytes(_inputs(Layout(dp=8, zero=3), params=p), param_bytes=2) == 14 * p
    assert fsdp2_copy_bytes(_inputs(Layout(dp=8, zero=3), params=p, m=4), param_bytes=2) == (
        4 * 14 * p
    )
    assert fsdp2_copy_bytes(_inputs(Layout(dp=8, zero=2), params=p), param_bytes=2) == 10 * p
    fp8 = fsdp2_copy_bytes(_inputs(Layout(dp=8, zero=3), params=p, fp8=0.5 * p), param_bytes=2)
    assert fp8 == 2 * 2 * (0.5 * p * 2 + 0.5 * p) + 6 * p
    assert fsdp2_copy_bytes(_inputs(Layout(dp=8, zero=1), params=p), param_bytes=2) == 0.0
    assert fsdp2_copy_bytes(_inputs(Layout(dp=1, zero=3), params=p), param_bytes=2) == 0.0


def test_fsdp2_copy_bytes_pipeline() -> None:
    """Under pp: m + 1 gathers and one reduce-scatter per step (comm._fsdp_terms); a recipe
    that keeps units gathered through the step (torchtitan) gathers once and its copy-in reads
    the fp32 accumulation."""
    p, L = 1e9, Layout(dp=8, zero=3, pp=4)
    assert fsdp2_copy_bytes(_inputs(L, params=p, m=8), param_bytes=2) == 9 * 4 * p + 6 * p
    assert fsdp2_copy_bytes(_inputs(L, params=p, m=8), param_bytes=2, pp_unsharded=True) == (
        4 * p + 8 * p
    )


def test_torchtitan_step_pays_fsdp2_copies() -> None:
    """step_time with torchtitan's recipe against the same recipe without fsdp2_copies: the
    step differs by the copies' bytes over memory bandwidth; the scaletrain recipe does not
    charge them (its calibrated efficiency stands for its kernels)."""
    from scaletrain.planner import PlanInput
    from scaletrain.planner.memory.rank_terms import ModelTerms
    from scaletrain.planner.recipes.registry import recipe_named
    from scaletrain.planner.recipes.schema import Recipe
    from scaletrain.planner.time.step_time import comm_arguments, step_time

    m, hw = model_preset("llama3-8b"), hardware_preset("h100-sxm")
    plan = PlanInput(
        m, hw, 8, Layout(dp=8, zero=3), 8192, 16, 2, "bf16", "selective", recipe="torchtitan"
    )
    terms, params = ModelTerms(m), 8.0e9
    tt = recipe_named("torchtitan")
    assert tt.fsdp2_copies and not recipe_named("scaletrain").fsdp2_copies

    def step(recipe: Recipe) -> float:
        return step_time(
            plan, params, terms=terms, causal=True, gpus_per_node=8, zero_bubble="h1", recipe=recipe
        ).step_s

    inputs = comm_arguments(plan, params, None, terms.counts, tt)
    want = fsdp2_copy_bytes(inputs, param_bytes=2) / hw.memory_bw
    assert want == pytest.approx(14 * params / hw.memory_bw)
    got = step(tt) - step(dataclasses.replace(tt, fsdp2_copies=False))
    assert got == pytest.approx(want, rel=1e-9)
