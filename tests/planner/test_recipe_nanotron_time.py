"""Nanotron's step-time mechanisms read off its source (nanotron c252843, time/recipe_terms.py
and recipe_exposed), each pinned on a small case against a hand computation: the
async REDUCE_SCATTER linears' exposed collectives, ZeRO-1's gradient all-reduce after the
backward, the tied embedding's gradient all-reduce across pipeline stages, the fp32
accumulation pass per micro-batch, the post-backward passes, ZeRO-1's gather assembled and
copied back on the host, and the second persistent gather buffer of the row linears."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from scaletrain.config import Layout, ModelConfig
from scaletrain.planner.recipes.memory import recipe_rank_memory, recipe_worst_rank
from scaletrain.planner.recipes.registry import recipe_named
from scaletrain.planner.recipes.schema import Recipe
from scaletrain.planner.recipes.stages import recipe_stage_layers
from scaletrain.planner.time.comm import NVLS_LATENCY_S, allreduce_time, axis_link, gather_time
from scaletrain.planner.time.efficiency import allreduce_latency
from scaletrain.planner.time.recipe_terms import (
    COPY_CALL_S,
    CXX_OP_S,
    VIEW_CALL_S,
    async_tp_terms,
)
from scaletrain.planner.time.step_time import plan_efficiency
from scaletrain.planner.types import PlanInput

from ._recipe_step import recipe_plan, recipe_step

TINY = ModelConfig(
    name="tiny-llama",
    vocab_size=1024,
    dim=256,
    num_layers=4,
    num_heads=4,
    ffn_dim=512,
    max_seq_len=512,
    norm="rmsnorm",
    activation="swiglu",
    position="rope",
    bias=False,
)


def _plan(layout: Layout, *, mb: int = 2, gb: int = 8, seq: int = 512) -> PlanInput:
    return recipe_plan("nanotron", layout, TINY, seq=seq, gb=gb, mb=mb, gpu="h100-sxm")


def _without(recipe: Recipe, **fields: Any) -> Recipe:
    """`recipe` with some of its mechanisms switched off (a variant for comparison)."""
    return dataclasses.replace(recipe, **fields)


def test_async_linears_expose_what_no_gemm_hides_by_hand() -> None:
    """tp 4, SP, T = 2 x 512 tokens, h 256, q = kv = 256, f 512 (gate_up 1024), V 1024, one
    micro-batch, pp 1, at the GEMM rate that makes the qkv GEMM take 2g, so its forward shard
    (G/tp = g/2) hides half its gather while its backward GEMMs hide all of theirs. One gather
    g = gather_time(2 T h). Per block: the qkv
    (N 768) and gate_up (N 1024) column linears expose max(0, g - G/tp) forward and
    max(0, g - G) twice backward; o_proj (K 256) and down (K 512) expose g forward and
    max(0, g - G/tp) backward (G = 2 T k n / tp / rate). Embedding 2g; head: its column
    linear's windows over 2 T h V / tp plus the loss's three all-reduces of 4 T bytes."""
    lay = Layout(dp=1, tp=4, sp=True)
    p = _plan(lay, gb=2)
    link = axis_link(lay, p.hardware, "tp", None)
    T, h, tp = 1024.0, 256, 4
    bw, lat, _ = link
    g = gather_time(2 * T * h, tp, bw, lat)
    rate = 2 * T * h * 768 / tp / (2 * g)
    t = async_tp_terms(p, link=link, rate=rate, layers=4, m=1, recompute=False)

    def gemm(k: float, n: float) -> float:
        return 2 * T * k * n / tp / rate

    assert max(0.0, g - gemm(h, 768) / tp) == pytest.approx(g / 2)  # half hidden
    block = 0.0
    for n in (768, 1024):
        G = gemm(h, n)
        block += max(0.0, g - G / tp) + 2 * max(0.0, g - G)
    for k in (256, 512):
        G = gemm(k, h)
        block += g + max(0.0, g - G / tp)
    H = gemm(h, 1024)
    head = max(0.0, g - H / tp) + 2 * max(0.0, g - H) + 3 * allreduce_time(4 * T, tp, bw, lat)
    assert t.exposed == pytest.approx(4 * block + 2 * g + head)
    # ten half-collectives per block, two for the embedding, three for the head + the loss's
    assert t.seconds == pytest.approx(
        4 * 10 * g + 2 * g + 3 * g + 3 * allreduce_time(4 * T, tp, bw, lat)
    )
    assert t.bytes == pytest.approx((4 * 10 + 5) * 3 / 4 * 2 * T * h + 3 * 2 * 3 / 4 * 4 * T)
    # a fast GEMM hides nothing: every collective is exposed but the loss's are all-reduces
    fast = async_tp_terms(p, link=link, rate=1e30, layers=4, m=1, recompute=False)
    assert fast.exposed == pytest.approx(fast.seconds)
    # full recompute (recompute_layer) runs the forward's collectives again
    rc = async_tp_terms(p, link=link, rate=rate, layers=4, m=1, recompute=True)
    fwd = sum(max(0.0, g - gemm(h, n) / tp) for n in (768, 1024)) + 2 * g
    assert rc.exposed == pytest.approx(t.exposed + 4 * fwd)


def test_nanotron_charges_the_async_tp_exposure_and_other_recipes_keep_theirs() -> None:
    """step_time under nanotron at tp 4 + SP: comm['tp'] carries async_tp_terms' bytes and
    seconds and the exposed time is its exposed share (the only family at dp 1, pp 1); without
    SP (ALL_REDUCE mode, no async linears) and under megatron the generic term stays."""
    lay = Layout(dp=1, tp=4, sp=True)
    p = _plan(lay, gb=4)
    r = recipe_named("nanotron")
    st = recipe_step(p, r)
    rate = p.hardware.flops("bf16") * plan_efficiency(p)
    ref = async_tp_terms(
        p, link=axis_link(lay, p.hardware, "tp", None), rate=rate, layers=4, m=2, recompute=False
    )
    assert st.comm["tp"] == pytest.approx((ref.bytes, ref.seconds))
    assert st.exposed_s == pytest.approx(ref.exposed)
    assert ref.exposed < ref.seconds
    generic = recipe_step(p, _without(r, tp_comm="exposed"))
    assert generic.exposed_s == pytest.approx(generic.comm["tp"][1])
    no_sp = recipe_step(dataclasses.replace(p, layout=Layout(dp=1, tp=4)), r)
    assert no_sp.exposed_s == pytest.approx(no_sp.comm["tp"][1])


def test_zero1_all_reduces_the_fp32_buffer_after_the_backward() -> None:
    """dp 8 ZeRO-1 (no DDP with accumulate_grad_in_fp32): one all-reduce of the 4 B gradient
    of every parameter, 2(n-1)/n of it moved (NVLink SHARP on the H100's node, else one ring
    latency term), exposed whole; the 16-bit
    weights' all-gather after the step stays exposed too. Under reduce_scatter the same rank
    reduce-scatters half the bytes, overlapped with the backward."""
    lay = Layout(dp=8, zero=1)
    p = _plan(lay, gb=16)
    r = recipe_named("nanotron")
    _, P = recipe_worst_rank(p)
    bw, lat, _ = axis_link(lay, p.hardware, "dp", None)
    n = 8
    st = recipe_step(p, r)
    moved = 2 * (n - 1) / n * 4 * P
    # one node: NCCL's ring, 2(n-1) intra-node hops (efficiency.allreduce_latency)
    assert lat == p.hardware.intra_node_latency_s
    assert allreduce_latency(n, lat, p.hardware.inter_node_latency_s, 8) == 2 * (n - 1) * lat
    ring = moved / bw + 2 * (n - 1) * lat
    # inside one node of an NVSwitch-3 device NCCL may take NVLink SHARP (comm.allreduce_seconds)
    nvls = moved / p.hardware.nvls_allreduce_busbw + NVLS_LATENCY_S
    assert p.hardware.nvls_allreduce_busbw > 0 and nvls < ring
    assert st.comm["dp_allreduce"] == pytest.approx((moved, nvls))
    gather = st.comm["zero_all_gather"][1]
    assert st.exposed_s == pytest.approx(st.comm["dp_allreduce"][1] + gather)
    rs = recipe_step(p, _without(r, zero1_grad_sync="reduce_scatter"))
    assert rs.comm["dp_allreduce"][0] == pytest.approx((n - 1) / n * 4 * P)
    assert rs.exposed_s < st.exposed_s


def test_tied_embedding_gradient_all_reduced_across_stages_after_the_backward() -> None:
    """pp 2 across two nodes (tp 4 x dp 2 = one node per stage), TINY's embedding tied to its
    head: sync_tied_weights_gradients sums the fp32 buffer of the vocab shard (V x h / tp
    elements, 4 B) between the two stages after the backward, one 2-rank all-reduce over the pp
    link (one rank per node: the NIC), exposed whole; untied, at pp 1, or under a recipe
    without the mechanism, nothing."""
    lay = Layout(dp=2, tp=4, sp=True, pp=2)
    p = _plan(lay, gb=8)
    r = recipe_named("nanotron")
    st = recipe_step(p, r)
    bw, lat, inter = axis_link(lay, p.hardware, "pp", None)
    assert inter and bw == p.hardware.inter_node_bw
    nbytes = 4.0 * TINY.vocab_size * TINY.dim / 4
    assert st.comm["pp_tied_allreduce"] == pytest.approx(
        (nbytes, allreduce_time(nbytes, 2, bw, lat))
    )
    off = recipe_step(p, _without(r, tied_grad_sync="none"))
    assert "pp_tied_allreduce" not in off.comm
    assert st.exposed_s - off.exposed_s == pytest.approx(st.comm["pp_tied_allreduce"][1])
    untied = dataclasses.replace(p, model=dataclasses.replace(TINY, tie_embeddings=False))
    assert "pp_tied_allreduce" not in recipe_step(untied, r).comm
    assert "pp_tied_allreduce" not in recipe_step(_plan(Layout(dp=2, tp=4, sp=True), gb=8), r).comm
    assert "pp_tied_allreduce" not in recipe_step(p, recipe_named("megatron")).comm


def test_single_hardware_queue_leaves_the_ddp_all_reduce_exposed() -> None:
    """CUDA_DEVICE_MAX_CONNECTIONS=1 (Recipe.single_hw_queue): at ZeRO-0 the DDP buckets'
    all-reduce runs on the critical path whole (the backward kernels queued behind it wait),
    with the same bytes and seconds; without the field the backward hides it but the last
    bucket; ZeRO-1 (already after the backward) and dp 1 are unchanged. A model whose fp32
    gradient spans several 25 MiB buckets (TINY's fits in the last one, exposed anyway)."""
    r = recipe_named("nanotron")
    assert r.single_hw_queue
    free = _without(r, single_hw_queue=False)
    big = dataclasses.replace(TINY, dim=1024, num_layers=8, ffn_dim=4096, vocab_size=32000)
    p = dataclasses.replace(_plan(Layout(dp=4, tp=2, sp=True), gb=8), model=big)
    on, off = recipe_step(p, r), recipe_step(p, free)
    assert on.comm["dp_allreduce"] == pytest.approx(off.comm["dp_allreduce"])
    t = on.comm["dp_allreduce"][1]
    assert off.exposed_s < on.exposed_s
    assert on.exposed_s - off.exposed_s <= t
    assert on.exposed_s >= t
    z1 = dataclasses.replace(_plan(Layout(dp=4, tp=2, sp=True, zero=1), gb=8), model=big)
    assert recipe_step(z1, r).exposed_s == pytest.approx(recipe_step(z1, free).exposed_s)
    one = _plan(Layout(dp=1, tp=2, sp=True), gb=8)
    assert recipe_step(one, r).exposed_s == pytest.approx(recipe_step(one, free).exposed_s)


def test_fp32_accumulation_pass_after_every_micro_batch() -> None:
    """FP32GradientAccumulator.backward adds each 16-bit grad into the fp32 buffer after the
    backward: 10 B per parameter of the rank per micro-batch over the memory bandwidth, in the
    compute (4 micro-batches here), at any dp."""
    p = _plan(Layout(dp=1), gb=8)
    r = recipe_named("nanotron")
    _, P = recipe_worst_rank(p)
    on, off = recipe_step(p, r), recipe_step(p, _without(r, grad_accum_pass_bytes=0.0))
    assert on.compute_s - off.compute_s == pytest.approx(4 * 10 * P / p.hardware.memory_bw)


def test_ddp_hook_adds_the_sync_micro_batch_grads_once_more() -> None:
    """ZeRO-0, dp 2: get_fp32_accum_hook adds the 16-bit grads into the fp32 buffer and
    _accumulate_grad adds them again after the backward (never an accumulation sync step):
    one extra 10 B per parameter pass per step; none at dp 1 or ZeRO-1."""
    r = recipe_named("nanotron")
    off = _without(r, ddp_hook_accumulates=False)
    p = _plan(Layout(dp=2), gb=8)
    _, P = recipe_worst_rank(p)
    diff = recipe_step(p, r).compute_s - recipe_step(p, off).compute_s
    assert diff == pytest.approx(10 * P / p.hardware.memory_bw)
    for lay in (Layout(dp=1), Layout(dp=2, zero=1)):
        q = _plan(lay, gb=8)
        assert recipe_step(q, r).compute_s == pytest.approx(recipe_step(q, off).compute_s)


def test_post_backward_passes_by_hand() -> None:
    """clip_grad_norm over every fp32 grad (4 + 8) and zero_grad (4): 16 B per parameter of the
    rank; the fp32 -> bf16 copy 6 B per updated parameter (1/dp under ZeRO-1); ZeRO-1's
    all-gather copied back from its flat buffers 4 B per parameter; all with the optimizer."""
    # the gather's host time (test_zero1_gather_host_copies_by_hand) off on both sides
    r = _without(recipe_named("nanotron"), zero1_gather_host_copies=False)
    bare = _without(
        r, post_backward_pass_bytes=0.0, master_copy_bytes=0.0, zero1_gather_flat_copies=False
    )
    for lay, extra in ((Layout(dp=4, zero=1), 16 + 6 / 4 + 4), (Layout(dp=4), 16 + 6)):
        p = _plan(lay, gb=8)
        _, P = recipe_worst_rank(p)
        bw = p.hardware.memory_bw
        diff = recipe_step(p, r).optimizer_s - recipe_step(p, bare).optimizer_s
        assert diff == pytest.approx(extra * P / bw)


def test_async_linears_keep_two_gather_buffers() -> None:
    """MemoryBuffer 'allgather' (column inputs) and 'allgather2' (row output gradients): two
    e x T x h buffers under nanotron's async linears, one under megatron's SP."""
    lay = Layout(dp=1, tp=4, sp=True)
    p = _plan(lay, gb=2)
    T, h = 1024, 256
    nano = recipe_rank_memory(p, recipe_named("nanotron"), 0)
    assert nano.buffer_terms["tp_all_gather"] == pytest.approx(2 * 2 * T * h)
    meg = recipe_rank_memory(dataclasses.replace(p, recipe="megatron"), recipe_named("megatron"), 0)
    assert meg.buffer_terms["tp_all_gather"] == pytest.approx(2 * T * h)


def _gather_host(n: int, tensors: int) -> float:
    """ZeRO-1's gather on the host by hand (recipe_terms.zero1_gather_host_s): Python slices of
    the n output lists and the input list, a copy_ back per (dp rank, tensor), ATen's flatten
    (one view per tensor of each of the n + 1 lists, one cat each) and unflatten (narrow + view
    per tensor of each of the n gathered buffers)."""
    return (
        (n + 1) * tensors * VIEW_CALL_S
        + n * tensors * COPY_CALL_S
        + (n + 1 + 2 * n) * tensors * CXX_OP_S
        + (n + 1) * COPY_CALL_S
    )


def test_zero1_gather_host_copies_by_hand() -> None:
    """_all_gather_params slices every parameter per dp rank, all_gather_coalesced flattens
    and unflattens every dp rank's list and update_output copies each slice back, charged
    beyond the GPU work queued after the backward (the fp32 all-reduce, the gather, the
    optimizer), inside optimizer_s."""
    r = recipe_named("nanotron")
    bare = _without(r, zero1_gather_host_copies=False)
    tensors = 6 * TINY.num_layers + 2  # tied: embedding + final norm
    for dp in (4, 64):
        p = _plan(Layout(dp=dp, zero=1), mb=1, gb=dp)
        ref = recipe_step(p, bare)
        hidden = ref.comm["dp_allreduce"][1] + ref.comm["zero_all_gather"][1] + ref.optimizer_s
        host = _gather_host(dp, tensors)
        got = recipe_step(p, r).optimizer_s - ref.optimizer_s
        assert got == pytest.approx(max(0.0, host - hidden))
    assert got > 0  # at dp 64 the host's 64 x 26 pairs outlast the tiny model's tail
    # ZeRO-0 (no sharded gather), dp 1 and pp > 1's larger end (norm + lm_head)
    for lay in (Layout(dp=64), Layout(dp=1)):
        q = _plan(lay, mb=1, gb=lay.dp)
        assert recipe_step(q, r).optimizer_s == pytest.approx(recipe_step(q, bare).optimizer_s)
    q = _plan(Layout(dp=64, zero=1, pp=2), mb=1, gb=128)
    ref = recipe_step(q, bare)
    hidden = sum(
        ref.comm[k][1]
        for k in ("dp_allreduce", "pp_tied_allreduce", "zero_all_gather")
        if k in ref.comm
    )
    layers = max(recipe_stage_layers(q, r))  # nanotron's compute-cost split: 3 + 1
    host = _gather_host(64, 6 * layers + 2)
    got = recipe_step(q, r).optimizer_s - ref.optimizer_s
    assert got == pytest.approx(max(0.0, host - hidden - ref.optimizer_s))


def test_zero1_gather_counts_aten_flatten_and_unflatten() -> None:
    """ATen's flatten_dense_tensors makes one view per tensor of each list (n outputs + the
    input) and unflatten_dense_tensors a narrow and a view per tensor of each gathered buffer:
    3n + 1 C++ ops per parameter tensor beyond the Python slices and copies, each the C++ half
    of a simple eager op (issue #41383)."""
    half_view = VIEW_CALL_S / 2
    assert half_view == pytest.approx(CXX_OP_S)
    n, tensors = 128, 50
    python_only = n * tensors * (VIEW_CALL_S + COPY_CALL_S)
    extra = _gather_host(n, tensors) - python_only
    assert extra == pytest.approx(
        tensors * VIEW_CALL_S + (3 * n + 1) * tensors * CXX_OP_S + (n + 1) * COPY_CALL_S
    )
    # at dp 128 the flatten and unflatten views are a quarter of the host's time
    assert 0.2 < extra / _gather_host(n, tensors) < 0.25
