"""Pipeline closed forms against the discrete-event simulator of torch's action orders (the
orders against torch's own: tests/unit/test_pipeline_orders_torch.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scaletrain.config import Layout
from scaletrain.planner.time.pipeline import (
    bubble_fraction,
    inflight_microbatches,
    pipeline_order,
    simulate,
)

CASES = [(2, 4), (4, 8), (4, 16), (8, 8), (8, 32)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", CASES)
def test_gpipe_1f1b_bubble_exact(schedule: str, p: int, m: int) -> None:
    t = simulate(schedule, p, m, 1, tf=1.0, tb=2.0)
    assert t.bubble_fraction == pytest.approx((p - 1) / m)
    assert bubble_fraction(schedule, p, m) == pytest.approx(t.bubble_fraction)
    assert t.makespan == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("v", [2, 4])
@pytest.mark.parametrize("p,m", CASES)
def test_interleaved_bubble_close(p: int, m: int, v: int) -> None:
    t = simulate("interleaved", p, m, v, tf=1.0, tb=2.0)
    assert t.bubble_fraction == pytest.approx(bubble_fraction("interleaved", p, m, v), rel=0.05)
    assert t.bubble_fraction < simulate("1f1b", p, m, 1, 1.0, 2.0).bubble_fraction


@pytest.mark.parametrize("v", [1, 2])
@pytest.mark.parametrize("p,m", CASES)
def test_zero_bubble_below_1f1b_and_h1_form(p: int, m: int, v: int) -> None:
    t = simulate("zero-bubble", p, m, v, tf=1.0, tb=2.0, w_fraction=0.5)
    assert t.bubble_fraction < simulate("1f1b", p, m, 1, 1.0, 2.0).bubble_fraction
    # torch's ZB1P order is ZB-H1: (p-1)/(3vm) with t_F = t_B = t_W.
    assert t.bubble_fraction == pytest.approx(
        bubble_fraction("zero-bubble", p, m, v, zero_bubble="h1"), rel=0.05
    )
    # h1 is the default (what the trainer runs); the ideal ZB-H2 is an explicit option.
    assert bubble_fraction("zero-bubble", p, m, v) == bubble_fraction(
        "zero-bubble", p, m, v, zero_bubble="h1"
    )
    assert bubble_fraction("zero-bubble", p, m, v, zero_bubble="h2") == 0.0


@pytest.mark.parametrize(
    "schedule,v",
    [
        ("gpipe", 1),
        ("1f1b", 1),
        ("interleaved", 2),
        ("interleaved", 4),
        ("zero-bubble", 1),
        ("dualpipev", 2),
    ],
)
@pytest.mark.parametrize("p,m", CASES)
def test_inflight_matches_simulator(schedule: str, v: int, p: int, m: int) -> None:
    if schedule == "dualpipev" and m < 2 * p:
        pytest.skip("dualpipev needs m >= 2p (torch refuses fewer)")
    t = simulate(schedule, p, m, v, tf=1.0, tb=2.0)
    for stage in range(p):
        assert t.peak_inflight[stage] == pytest.approx(
            inflight_microbatches(schedule, p, m, stage, v)
        )


def test_1f1b_order_is_warmup_steady_cooldown() -> None:
    p, m = 4, 8
    order = pipeline_order("1f1b", p, m)
    for rank, actions in order.items():
        kinds = "".join(a.kind for a in actions)
        warm = p - 1 - rank
        assert kinds == "F" * warm + "FB" * (m - warm) + "B" * warm
        assert [a.microbatch for a in actions if a.kind == "F"] == list(range(m))
        assert [a.microbatch for a in actions if a.kind == "B"] == list(range(m))


def test_every_action_once_and_interleaved_stages() -> None:
    p, m, v = 4, 8, 2
    for schedule in ("interleaved", "zero-bubble"):
        order = pipeline_order(schedule, p, m, v)
        for rank, actions in order.items():
            kinds = ("F", "I", "W") if schedule == "zero-bubble" else ("F", "B")
            for kind in kinds:
                for c in range(v):
                    stage = c * p + rank
                    mbs = sorted(
                        a.microbatch for a in actions if a.kind == kind and a.stage == stage
                    )
                    assert mbs == list(range(m))


@pytest.mark.parametrize("p,m", [(2, 4), (3, 7), (4, 8), (4, 9), (8, 16), (8, 33), (8, 64)])
def test_dualpipev_bubble_and_memory_match_the_simulator(p: int, m: int) -> None:
    """torch's DualPipeV order idles (p-1) forward chunks per rank with equal thirds: the
    planned bubble (p-1)/(6m) is the simulator's for any m >= 2p, half of ZB-H1's on one chunk
    per rank; every rank holds p + 1/2 micro-batches (2p + 1 chunks: DualPipe's PP + 1)."""
    t = simulate("dualpipev", p, m, 2, tf=1.0, tb=2.0, w_fraction=0.5)
    assert t.bubble_fraction == pytest.approx(bubble_fraction("dualpipev", p, m, 2))
    assert bubble_fraction("dualpipev", p, m, 2) == pytest.approx((p - 1) / (6 * m))
    zb = simulate("zero-bubble", p, m, 1, tf=1.0, tb=2.0) if m % max(1, m // p) == 0 else None
    assert zb is None or t.bubble_fraction == pytest.approx(zb.bubble_fraction / 2, rel=0.05)
    for rank in range(p):
        assert t.peak_inflight[rank] == inflight_microbatches("dualpipev", p, m, rank, 2) == p + 0.5


def test_dualpipev_runs_every_microbatch_once_per_stage_in_a_v() -> None:
    """Rank r computes stages r and 2p-1-r; each (stage, micro-batch) has one forward and either
    one full backward or an input-gradient pass and its weight pass, W after I."""
    p, m = 4, 10
    for rank, actions in pipeline_order("dualpipev", p, m, 2).items():
        assert {a.stage for a in actions} == {rank, 2 * p - 1 - rank}
        for stage in (rank, 2 * p - 1 - rank):
            mine = [a for a in actions if a.stage == stage]
            assert sorted(a.microbatch for a in mine if a.kind == "F") == list(range(m))
            for k in range(m):
                kinds = "".join(a.kind for a in mine if a.microbatch == k)
                assert kinds in ("FB", "FIW"), (rank, stage, k, kinds)
    with pytest.raises(ValueError, match="dualpipev"):
        pipeline_order("dualpipev", 4, 7, 2)  # m < 2p
    with pytest.raises(ValueError, match="dualpipev"):
        bubble_fraction("dualpipev", 4, 8, 1)


def test_p2p_latency_and_uneven_stages_lengthen_makespan() -> None:
    base = simulate("1f1b", 4, 8, 1, 1.0, 2.0)
    slow = simulate("1f1b", 4, 8, 1, 1.0, 2.0, p2p_latency=0.1)
    uneven = simulate("1f1b", 4, 8, 1, [1.0, 1.0, 1.0, 1.5], [2.0, 2.0, 2.0, 3.0])
    assert slow.makespan > base.makespan
    assert uneven.makespan > base.makespan
    assert 0 < base.idle_fraction < 1


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError):
        bubble_fraction("dualpipe", 4, 8)
    with pytest.raises(ValueError):
        bubble_fraction("1f1b", 4, 8, v=2)
    with pytest.raises(ValueError):
        inflight_microbatches("1f1b", 4, 8, stage=4)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p, m", [(2, 8), (4, 16), (8, 32)])
def test_fill_and_drain_with_a_heavier_last_stage_match_the_simulator(schedule, p, m) -> None:
    """With the head on the last stage, the step is m x t_last + the other stages' times (their
    forwards fill, their backwards drain), not (m + p - 1) x t_last: the planner's bubble share
    (step_time._fill_drain_share) gives the simulator's makespan; 1 for equal stages."""
    from scaletrain.planner.time.step_time import _fill_drain_share

    layers, head_f, head_b = 24 // p, 1.75, 3.5
    tf = [float(layers)] * p
    tb = [3.0 * layers] * p
    tf[-1] += head_f
    tb[-1] += head_b
    counts = [layers] * p
    plan = SimpleNamespace(layout=Layout(pp=p, pp_schedule=schedule))
    # per-layer time 4 (1 forward + 3 backward with recompute), the head 1.75 + 3.5
    share = _fill_drain_share(plan, counts, p - 1, 4.0, head_f + head_b)
    t_max = tf[-1] + tb[-1]
    closed = m * t_max + bubble_fraction(schedule, p, m) * m * t_max * share
    assert simulate(schedule, p, m, 1, tf, tb).makespan == pytest.approx(closed)
    assert _fill_drain_share(plan, counts, p - 1, 4.0, 0.0) == 1.0
