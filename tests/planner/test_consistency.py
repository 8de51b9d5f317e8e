"""The planner agrees with itself and with the trainer's pipeline schedules.

- in-flight micro-batches and the worst rank: the discrete-event simulator of torch's action
  orders is the reference; every pipeline rank is computed by brute force and the estimate's
  pruned rank set must find the same worst one;
- compute covers every FLOP: MFU never exceeds the efficiency (the slowest rank paces the
  pipeline, so compute x gpus x rate >= model FLOPs);
- the search's fast path (`reserved_and_step`, `estimate_memory`) returns exactly what the full
  `estimate` does.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaletrain.config import Layout, hardware_preset, layout_problems, resolve_model
from scaletrain.planner import (
    PlanInput,
    default_efficiency,
    estimate,
    estimate_memory,
    flops_per_token,
)
from scaletrain.planner.estimate import reserved_and_step
from scaletrain.planner.memory.rank import plan_facts, rank_memory
from scaletrain.planner.memory.rank_terms import ModelTerms, activation_terms
from scaletrain.planner.memory.states import stage_layer_counts
from scaletrain.planner.time.pipeline import simulate

H100 = hardware_preset("h100-sxm")
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zero-bubble", 1)]


def _plan(
    model: str,
    layout: Layout,
    *,
    seq: int = 2048,
    mb: int = 1,
    m: int = 8,
    ac: str = "none",
    offload: str = "none",
) -> PlanInput:
    return PlanInput(
        resolve_model(model),
        H100,
        layout.world_size,
        layout,
        seq,
        m * mb * layout.dp,
        mb,
        ac=ac,
        offload=offload,
    )


def _brute_force_worst(plan: PlanInput) -> tuple[float, int, float]:
    """(reserved, pipeline rank, in flight) of the worst rank, every rank computed, in-flight
    counts read off the simulator."""
    L = plan.layout
    m = plan.grad_accum
    sim = simulate(L.pp_schedule, L.pp, m, L.pp_virtual, 1.0, 2.0)
    counts = stage_layer_counts(plan.model.num_layers, L.pp, L.pp_virtual)
    terms = ModelTerms(plan.model)
    facts = plan_facts(plan, terms, activation_terms(plan, terms, True))
    worst = max(
        (
            rank_memory(facts, rank=r, layers=counts[r], in_flight=sim.peak_inflight[r])
            for r in range(L.pp)
        ),
        key=lambda nums: nums.reserved,
    )
    return worst.reserved, worst.rank, worst.in_flight


@pytest.mark.parametrize("schedule,v", SCHEDULES)
@pytest.mark.parametrize(
    "model,pp,m",
    [("llama2-7b", 4, 8), ("llama3-70b", 8, 16), ("llama3-70b", 16, 32), ("gpt2-350m", 8, 8)],
)
def test_worst_rank_and_in_flight_match_the_simulator(
    model: str, pp: int, m: int, schedule: str, v: int
) -> None:
    plan = _plan(
        model, Layout(dp=1, tp=8, sp=True, pp=pp, pp_schedule=schedule, pp_virtual=v, zero=1), m=m
    )
    mem = estimate(plan).memory
    reserved, rank, in_flight = _brute_force_worst(plan)
    assert mem.reserved == pytest.approx(reserved)
    assert mem.detail["activations.in_flight"] == pytest.approx(in_flight)
    assert 0 <= rank < pp


def test_llama3_70b_pp32_middle_ranks_are_counted() -> None:
    # The hand-over case: tp2/sp, pp32 zero-bubble, ZeRO-3, offload=params on 64 H100. The
    # split is (1, 3, ..., 3, 2, ..., 2, 1) layers: a 3-layer middle rank paces compute and
    # holds the most block activations (32 micro-batches in flight x 3 layers). The worst rank
    # is the last 3-layer rank (18): ZB-H1 defers W most on the later ranks, and a block past
    # its input-gradient pass holds the gradients it recorded for W too
    # (`memory.split_backward`). It was the last rank while every micro-batch's head was
    # counted with its logits until W (I frees them), and a middle rank while torch's stages
    # kept a receive buffer per micro-batch (2 x 512 of them, 68.7 GB: issue #37).
    from scaletrain.planner import pipeline_rank_memory

    L = Layout(dp=1, zero=3, tp=2, sp=True, pp=32, pp_schedule="zero-bubble")
    plan = _plan("llama3-70b", L, seq=8192, m=512, offload="params")
    est = estimate(plan)
    tokens = 512 * 8192
    floor = tokens * est.flops_per_token / (64 * 0.55 * H100.flops("bf16"))  # ~54 s
    assert est.time.compute_s >= floor
    assert est.mfu <= 0.55
    assert est.memory.detail["pipeline_rank"] == 18
    assert est.memory.moment == "pipeline stage backward, FSDP units gathered"
    assert est.memory.reserved > pipeline_rank_memory(plan, 31).reserved
    middle = pipeline_rank_memory(plan, 1)
    assert middle.activations > 32 * 3 * middle.detail["activations.per_layer"] * 0.99
    assert middle.reserved > pipeline_rank_memory(plan, 0).reserved


LAYOUTS = st.builds(
    lambda tp, pp, sched, cp, zero, dp: Layout(
        dp=dp, zero=zero, tp=tp, sp=tp > 1, pp=pp, pp_schedule=sched[0], pp_virtual=sched[1], cp=cp
    ),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 3, 4, 8, 16, 32]),
    sched=st.sampled_from(SCHEDULES),
    cp=st.sampled_from([1, 2]),
    zero=st.integers(0, 3),
    dp=st.sampled_from([1, 2, 4]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    model=st.sampled_from(["gpt2-124m", "llama2-7b", "llama3-70b", "mixtral-8x7b"]),
    layout=LAYOUTS,
    mb=st.sampled_from([1, 2]),
    rounds=st.sampled_from([1, 2, 3]),
)
def test_mfu_never_exceeds_efficiency(model: str, layout: Layout, mb: int, rounds: int) -> None:
    cfg = resolve_model(model)
    m = max(1, layout.pp) * rounds
    plan = _plan(model, layout, mb=mb, m=m)
    if layout_problems(
        layout,
        cfg,
        world_size=layout.world_size,
        global_batch=plan.global_batch,
        micro_batch=mb,
        seq_len=plan.seq_len,
    ):
        return
    est = estimate(plan)
    assert est.mfu <= default_efficiency("bf16", cfg.dim, H100) * (1 + 1e-9)
    # model FLOPs (MFU) never exceed the hardware FLOPs the compute time is charged with
    assert est.flops_per_token <= flops_per_token(cfg, plan.seq_len, recompute="full")
    full = estimate(_plan(model, layout, mb=mb, m=m, ac="full"))
    assert full.time.compute_s >= est.time.compute_s


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(["gpt2-350m", "llama2-7b", "llama3-70b", "mixtral-8x7b"]),
    layout=LAYOUTS,
    ac=st.sampled_from(["none", "selective", "full"]),
    offload=st.sampled_from(["none", "optimizer", "params"]),
)
def test_fast_path_equals_estimate(model: str, layout: Layout, ac: str, offload: str) -> None:
    cfg = resolve_model(model)
    plan = _plan(model, layout, m=2 * layout.pp, ac=ac, offload=offload)
    if layout.pp * layout.pp_virtual > cfg.num_layers:
        return
    est = estimate(plan)
    reserved, step, _ = reserved_and_step(plan)
    assert reserved == pytest.approx(est.memory.reserved)
    assert estimate_memory(plan) == est.memory
    if est.memory.fits:
        assert step == pytest.approx(est.time.step_s)
    else:
        assert step == float("inf") and est.memory.reserved > plan.hardware.memory_bytes


def test_shared_model_terms_give_each_layout_its_own_memory() -> None:
    """One `ModelTerms` per search: layouts evaluated one after another through the same terms
    get exactly what a fresh one gives each (no term of one layout leaks into another), and
    terms built for another model are not used."""
    model = resolve_model("llama2-7b")
    layouts = [
        Layout(dp=8, zero=3),
        Layout(dp=2, tp=4, sp=True, zero=1),
        Layout(dp=2, pp=4, zero=2),
        Layout(dp=1, tp=2, pp=4, pp_schedule="interleaved", pp_virtual=2, zero=1),
    ]
    shared = ModelTerms(model)
    for layout in layouts * 2:
        for ac in ("none", "full"):
            plan = PlanInput(model, H100, layout.world_size, layout, 4096, 8 * layout.dp, 1, ac=ac)
            assert estimate_memory(plan, terms=shared) == estimate_memory(plan)
    assert shared.states and shared.acts and shared.bufs
    other = ModelTerms(resolve_model("gpt2-350m"))
    plan = PlanInput(model, H100, 8, layouts[0], 4096, 64, 1)
    assert estimate_memory(plan, terms=other) == estimate_memory(plan)
    assert not other.states
