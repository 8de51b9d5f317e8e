"""Layout search: legality through layout_problems, fits, pins, family reasons."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaletrain.config import hardware_preset, layout_problems, resolve_model
from scaletrain.planner.search.layouts import (
    FAMILIES,
    SIMPLER_LAYOUT_MARGIN,
    Complexity,
    complexity,
    family_of,
    rule_order,
    search,
)
from scaletrain.planner.types import Estimate, layout_label

pytest.importorskip("scaletrain.planner.estimate")

SMALL = ("tiny", "tiny-llama", "tiny-moe", "gpt-mini")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(SMALL),
    gpus=st.sampled_from([1, 2, 4, 6, 8]),
    gb_mult=st.sampled_from([1, 2, 4]),
    seq=st.sampled_from([32, 64, 128]),
    gpu=st.sampled_from(["cpu", "rtx3090"]),
)
def test_every_result_is_legal_and_fits(
    model: str, gpus: int, gb_mult: int, seq: int, gpu: str
) -> None:
    cfg = resolve_model(model)
    gb = 8 * gb_mult
    res = search(cfg, hardware_preset(gpu), gpus, seq_len=seq, global_batch=gb, top_k=50)
    # every legal candidate's memory is evaluated (plus one probe per layout); counts are honest
    assert res.evaluated >= res.legal >= res.fitting >= len(res.top)
    # the rule of thumb's order (search.rule_order): the layouts within the margin of the
    # fastest come first, simplest first; then the others, fastest first; equal step times
    # (to 9 digits) go to the simpler layout, then to the one reserving less memory
    assert (res.fastest is None) == (res.best is None) == (not res.top)
    if res.fastest is None or res.best is None:
        return
    limit = float(f"{res.fastest.time.step_s:.9g}") * (1 + SIMPLER_LAYOUT_MARGIN)

    def key(e: Estimate) -> tuple[float, Complexity, float]:
        return (
            float(f"{e.time.step_s:.9g}"),
            complexity(e.plan.layout, e.plan.offload),
            e.memory.reserved,
        )

    near = [key(e) for e in res.top if key(e)[0] <= limit]
    far = [key(e) for e in res.top if key(e)[0] > limit]
    assert [key(e) for e in res.top] == near + far
    assert near == sorted(near, key=lambda k: (k[1], k[0], k[2]))
    assert far == sorted(far)
    assert res.best.time.step_s <= res.fastest.time.step_s * (1 + SIMPLER_LAYOUT_MARGIN)
    for e in res.top:
        p = e.plan
        assert (
            layout_problems(
                p.layout,
                cfg,
                world_size=gpus,
                global_batch=gb,
                micro_batch=p.micro_batch,
                seq_len=seq,
            )
            == []
        )
        assert e.memory.fits and e.memory.reserved <= e.memory.capacity
        assert p.layout.world_size == gpus


def test_pins_are_honoured() -> None:
    cfg = resolve_model("gpt-mini")
    res = search(
        cfg,
        hardware_preset("cpu"),
        8,
        seq_len=128,
        global_batch=32,
        top_k=100,
        tp=2,
        zero=3,
        ac="selective",
    )
    assert res.top
    for e in res.top:
        L = e.plan.layout
        assert (L.tp, L.zero, e.plan.ac) == (2, 3, "selective")
        assert L.dp * L.pp * L.cp == 4
    res = search(
        cfg,
        hardware_preset("cpu"),
        8,
        seq_len=128,
        global_batch=32,
        top_k=100,
        pp=2,
        pp_schedule="interleaved",
        micro_batch=2,
    )
    assert res.top
    for e in res.top:
        L = e.plan.layout
        assert (L.pp, L.pp_schedule, e.plan.micro_batch) == (2, "interleaved", 2)
        assert L.pp_virtual >= 2


def test_families_and_reasons() -> None:
    # llama3-8b on 8 x 24 GB (23.70 GiB CUDA-visible): pure DP cannot fit 8B params x 16 B/param;
    # something else does.
    res = search(
        resolve_model("llama3-8b"),
        hardware_preset("rtx3090"),
        8,
        seq_len=2048,
        global_batch=32,
        top_k=3,
    )
    assert res.best is not None
    why = res.why_others_lost()
    assert why["pure DP"].startswith("never fits: best needs")
    # one unit for the two figures (config.units): what CUDA reports on an RTX 3090 24GB
    assert re.search(r"needs [\d.,]+ GiB > 23\.70 GiB \(rank", why["pure DP"]), why["pure DP"]
    assert family_of(res.best.plan) not in why or why[family_of(res.best.plan)] != "winner"
    for fam, reason in why.items():
        assert fam in FAMILIES and reason
        best = res.families[fam].best
        if best is not None:  # the family's best layout is named, with why it lost
            assert reason.startswith(f"best member {layout_label(best)}: ")
    assert "EP" not in res.families  # dense model


def test_nothing_fits_keeps_the_closest_miss() -> None:
    res = search(
        resolve_model("llama3-70b"),
        hardware_preset("rtx3090"),
        2,
        seq_len=2048,
        global_batch=8,
        offload="none",
    )
    assert res.top == [] and res.best is None
    assert all(r.startswith(("never fits", "no legal")) for r in res.why_others_lost().values())


def test_kept_layouts_are_full_estimates_of_their_plans() -> None:
    # the search ranks on the fast path and builds Estimates only for what it keeps: they must
    # be exactly what estimate() says for the same plan, and each family's best is one of them
    from scaletrain.planner import estimate

    res = search(
        resolve_model("llama3-8b"),
        hardware_preset("h100-sxm"),
        16,
        seq_len=4096,
        global_batch=64,
        top_k=10,
    )
    assert len(res.top) == 10
    for e in res.top:
        assert e.time.step_s == estimate(e.plan).time.step_s
    fam = res.families[family_of(res.best.plan)]
    assert fam.best is res.best


def test_unknown_pin_is_a_config_error() -> None:
    from scaletrain.config import ConfigError

    with pytest.raises(ConfigError, match="search.foo"):
        search(resolve_model("tiny"), hardware_preset("cpu"), 1, seq_len=32, global_batch=4, foo=1)


def test_rule_order_prefers_the_simpler_layout_within_the_margin() -> None:
    """search.rule_order: equal step times go to the simpler layout, then to the leaner one; a
    more complex layout wins only when it is more than SIMPLER_LAYOUT_MARGIN faster."""
    from scaletrain.config import Layout

    fsdp = complexity(Layout(dp=8, zero=3))
    ddp = complexity(Layout(dp=8, zero=0))
    tp = complexity(Layout(dp=4, zero=3, tp=2))
    pp = complexity(Layout(dp=4, zero=1, pp=2))
    assert ddp < fsdp < tp < pp  # plain DP, then ZeRO, then TP, PP last
    m = SIMPLER_LAYOUT_MARGIN
    fits = [
        (10.0, tp, 50e9, 0, "tp"),  # the fastest
        (10.0, fsdp, 70e9, 1, "fsdp-fat"),  # as fast, simpler: ahead of tp
        (10.0, fsdp, 40e9, 2, "fsdp-lean"),  # as fast and as simple, leaner: first
        (10.0 * (1 + m) * 0.999, ddp, 75e9, 3, "ddp"),  # simplest, just inside the margin
        (10.0 * (1 + m) * 1.01, ddp, 30e9, 4, "ddp-slow"),  # outside: after the fast ones
        (9.0, pp, 60e9, 5, "pp"),  # fastest of all now, by more than... see below
    ]
    names = [t[-1] for t in rule_order(fits)]
    # the fastest is pp (9 s); the margin is 9.9 s: only pp itself is inside it
    assert names == ["pp", "fsdp-lean", "fsdp-fat", "tp", "ddp", "ddp-slow"]
    names = [t[-1] for t in rule_order(fits[:5])]  # without pp: the fastest is 10 s
    assert names == ["ddp", "fsdp-lean", "fsdp-fat", "tp", "ddp-slow"]
    # a non-finite step (absurd flags) is kept, last, for the output's finiteness check
    nan = [(float("nan"), ddp, 1e9, 6, "nan"), *fits[:2]]
    assert [t[-1] for t in rule_order(nan)][-1] == "nan" and len(rule_order(nan)) == 3


def test_a_family_with_no_legal_layout_names_the_rule(monkeypatch) -> None:
    """A family every proposed layout of which is illegal says which rule of config/layout.py
    refused it (on which layout), not only that nothing was legal."""
    from scaletrain.config import ConfigError
    from scaletrain.planner.search import layouts as search_mod

    def no_tp(layout, model, **kw):
        problems = layout_problems(layout, model, **kw)
        if layout.tp > 1:
            problems.append(ConfigError("parallel.tp", layout.tp, "a rule under test"))
        return problems

    monkeypatch.setattr(search_mod, "layout_problems", no_tp)
    res = search(
        resolve_model("llama3-8b"),
        hardware_preset("h100-sxm"),
        8,
        seq_len=2048,
        global_batch=32,
        top_k=3,
    )
    why = res.why_others_lost()["TP"]
    assert why.startswith("no legal layout: dp") and "tp" in why
    assert why.endswith(" tp2: parallel.tp = 2: a rule under test")
    assert res.best is not None and res.best.plan.layout.tp == 1


def _search_plans() -> list:
    """Plans of llama3-8b on 64 H100 across pipelines (every schedule), ZeRO, micro-batches,
    AC and offload: fits and misses of GPU and host memory."""
    from scaletrain.config import Layout
    from scaletrain.planner.types import PlanInput

    model, hw = resolve_model("llama3-8b"), hardware_preset("h100-sxm")
    layouts = [Layout(dp=64, zero=z) for z in (0, 1, 3)] + [Layout(dp=8, tp=8, zero=1)]
    for sched, v in (("1f1b", 1), ("gpipe", 1), ("zero-bubble", 1), ("interleaved", 2)):
        for pp in (4, 8):
            layouts.append(Layout(dp=64 // pp // 2, tp=2, pp=pp, pp_schedule=sched, pp_virtual=v))
    variants = [(1, "none", "none"), (4, "selective", "none"), (2, "full", "params")]
    plans = []
    for layout in layouts:
        for seq in (4096, 32768):
            for mb, ac, offload in variants:
                if offload == "params" and layout.zero != 3:
                    offload = "optimizer"
                plans.append(
                    PlanInput(
                        model=model,
                        hardware=hw,
                        num_gpus=64,
                        layout=layout,
                        seq_len=seq,
                        global_batch=512,
                        micro_batch=mb,
                        ac=ac,
                        offload=offload,
                    )
                )
    return plans


def test_the_miss_shortcut_stops_only_where_the_miss_is_settled() -> None:
    """The search stops walking a plan's pipeline ranks once one misses by at least its
    family's closest miss so far (`estimate.Shortcut.settle_at`, `miss_threshold`), and a
    rank as soon as one of its moments does (`rank.rank_memory`): such a plan is a miss
    either way and not a closer one, so the search keeps what it kept without the shortcut.
    The shortcut changes nothing for a plan that fits, and where it stops, the bytes it
    reports are a lower bound of the worst rank's that settle the miss."""
    import math

    from scaletrain.planner.estimate import Shortcut, reserved_and_step
    from scaletrain.planner.search.layouts import miss_threshold

    stopped = misses = fits = 0
    for plan in _search_plans():
        full = reserved_and_step(plan)
        cap = plan.hardware.memory_bytes
        fits += math.isfinite(full[1])
        for closest in (0.0, 2.0**30, 2.0**34):
            shortcut = Shortcut(settle_at=miss_threshold(cap, closest))
            got = reserved_and_step(plan, shortcut=shortcut)
            if math.isfinite(full[1]):
                assert got == full, plan.layout
                continue
            misses += 1
            assert got[1] == math.inf and got[0] <= full[0], plan.layout
            if got != full:
                stopped += 1
                # not a closer miss: the search records none either way
                assert max(0.0, full[0] - cap) >= max(0.0, got[0] - cap) >= closest
    assert fits > 10 and stopped > 10 and misses > stopped


@pytest.mark.parametrize(
    ("cap", "closest"),
    [
        (84932978278.0, 0.0),
        (84932978278.0, 1e-5),  # below half a unit of cap: cap + closest rounds to cap
        (84932978278.0, 2.0**30),
        (25769803776.0, 3.3e9 + 0.1),
        (1.0, 1e-300),
    ],
)
def test_the_miss_threshold_is_the_least_float_the_search_rule_settles(
    cap: float, closest: float
) -> None:
    """`miss_threshold` turns the search's rule for a settled miss (reserved r over `cap`
    by at least the family's `closest`, as `_Tally.record` computes it in floats) into one
    comparison: the rule holds at the threshold and on the floats above it, and not on the
    float below."""
    import math

    from scaletrain.planner.search.layouts import miss_threshold

    def settles(r: float) -> bool:
        return r > cap and max(0.0, r - cap) >= closest

    at = miss_threshold(cap, closest)
    assert settles(at) and not settles(math.nextafter(at, -math.inf))
    above = at
    for _ in range(4):
        above = math.nextafter(above, math.inf)
        assert settles(above)
    assert settles(at * 2) and not settles(cap)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_search_pauses_the_garbage_collector_and_restores_it(
    enabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search pauses CPython's cyclic collector while it runs (its objects form no
    cycles; the passes cost the 405B search 0.6 CPU-s): no collection runs inside the search
    (the tiny one below ran 6 without the pause), and the collector is left as it was. The
    search's work is `layouts._search`; collections are recorded only while it runs (one may
    run right after the collector is re-enabled, on the objects the search left: this test
    saw that one when run alone and counted it as the search's)."""
    import gc

    from scaletrain.planner.search import layouts

    inside: list[bool] = []  # gc.isenabled() as the search's work starts
    ran: list[str] = []  # collections while it runs
    running = False
    work = layouts._search

    def watched(*args: Any, **kwargs: Any) -> Any:
        nonlocal running
        inside.append(gc.isenabled())
        running = True
        try:
            return work(*args, **kwargs)
        finally:
            running = False

    monkeypatch.setattr(layouts, "_search", watched)
    was = gc.isenabled()
    gc.callbacks.append(lambda phase, info: running and ran.append(phase))
    try:
        (gc.enable if enabled else gc.disable)()
        search(resolve_model("tiny"), hardware_preset("cpu"), 2, seq_len=32, global_batch=8)
        assert inside == [False] and ran == []
        assert gc.isenabled() is enabled
    finally:
        gc.callbacks.pop()
        (gc.enable if was else gc.disable)()


def test_the_search_builds_the_plans_its_constructor_would() -> None:
    """The search copies one job's PlanInput fields and replaces the layout, micro-batch, AC
    and offload of each candidate instead of running the frozen dataclass's constructor: the
    plans are the constructor's, field for field and in its instance dict (LoRA and a
    calibration included), with the derived values the search sets ahead equal to those the
    constructor's plan derives."""
    from scaletrain.config import Layout
    from scaletrain.planner.search.layouts import _Job

    model, hw = resolve_model("llama3-8b"), hardware_preset("h100-sxm")
    lora = {"lora_rank": 16, "lora_targets": ("q", "v"), "lora_base": "nf4"}
    cal = _h100_calibration()
    for efficiency, extra in ((0.5, {}), (cal, lora)):
        job = _Job(
            model, hw, 8, 4096, 64, "bf16", "adamw", False, efficiency, {}, "scaletrain", extra
        )
        for layout, mb, ac, offload in (
            (Layout(dp=8, zero=3), 2, "full", "params"),
            (Layout(dp=2, tp=2, pp=2, pp_schedule="zero-bubble"), 1, "none", "activations"),
        ):
            plan, built = job.plan(layout, mb, ac, offload), job.first_plan(layout, mb, ac, offload)
            derived = {"grad_accum", "compute_bytes", "lora"}  # (set ahead by the search)
            assert plan == built and set(vars(plan)) - set(vars(built)) == derived
            assert {k: v for k, v in vars(plan).items() if k not in derived} == vars(built)
            # (the fields in the same insertion order, then the derived values, as read)
            assert list(vars(plan))[: len(vars(built))] == list(vars(built))
            assert {k: vars(plan)[k] for k in derived} == {k: getattr(built, k) for k in derived}


def test_the_step_floor_is_at_most_the_step() -> None:
    """`step_time.step_floor` (compute, bubble, the activation offload's PCIe time, optimizer
    and overhead, without the rest of the communication model) bounds the step from below
    for plans of every schedule, ZeRO stage, AC and offload, a calibration's collective
    factors and a framework recipe included, and is the step where nothing but activation
    offload is communicated."""
    import dataclasses
    import math

    from scaletrain.config import Layout
    from scaletrain.planner.estimate import plan_step, reserved_and_step
    from scaletrain.planner.memory.rank_terms import ModelTerms
    from scaletrain.planner.time.step_time import step_floor

    cal = _h100_calibration(
        collective=(("dp_allreduce", 1.3), ("activation_offload", 0.7)), step_overhead_s=0.01
    )
    plans = _search_plans()
    plans += [dataclasses.replace(p, offload="activations", ac="none") for p in plans[:24]]
    plans += [dataclasses.replace(p, calibration=cal) for p in plans[::5]]
    plans += [dataclasses.replace(p, recipe="megatron") for p in plans[::7] if p.layout.zero < 2]
    # one GPU: no collective, so nothing is exposed and the floor is the step
    tiny = dataclasses.replace(plans[0], model=resolve_model("tiny"), num_gpus=1)
    plans.append(dataclasses.replace(tiny, layout=Layout(), seq_len=128, global_batch=8))
    timed = exact = 0
    for plan in plans:
        reserved, step, max_params = reserved_and_step(plan)
        if not math.isfinite(step):
            continue
        terms = ModelTerms(plan.model)
        recipe = None
        if plan.recipe != "scaletrain":
            from scaletrain.planner.recipes.registry import recipe_named

            recipe = recipe_named(plan.recipe)
        floor = step_floor(
            plan, max_params, terms=terms, causal=True, zero_bubble="h1", recipe=recipe
        )
        assert floor <= step == plan_step(plan, max_params, terms=terms), plan.layout
        timed += 1
        exact += floor == step
    assert timed > 40 and exact >= 1


def test_the_search_times_every_step_its_pick_reads() -> None:
    """The search times its fits by a lower bound of the step and the full step model only
    where the pick can read it (`_time_where_read`): the top layouts in the rule's order,
    each family's first, the fastest and every layout within the margin of it are those of
    the same fits all timed in full, and fits are left with their bound."""
    from scaletrain.planner.estimate import plan_step
    from scaletrain.planner.memory.rank_terms import ModelTerms
    from scaletrain.planner.search.layouts import (
        _family,
        _Job,
        _layouts,
        _search_layout,
        _Tally,
        _time_where_read,
    )

    def read(fits: list, top_k: int) -> tuple:
        ranked = rule_order(fits)
        first: dict[str, object] = {}
        for t in ranked:
            first.setdefault(_family(t[4].layout, t[4].offload), t[4])
        fastest = min(fits, key=lambda t: t[:4])
        near = sorted(t[3] for t in fits if t[0] <= fastest[0] * (1 + SIMPLER_LAYOUT_MARGIN))
        return [t[4] for t in ranked[:top_k]], first, fastest[4], near

    model, hw = resolve_model("llama3-8b"), hardware_preset("h100-sxm")
    job = _Job(model, hw, 16, 8192, 64, "bf16", "adamw", False, 0.0, {})
    searched = _Tally(terms=ModelTerms(model))
    for layout, mbs, offloads in _layouts(job):
        _search_layout(job, searched, layout, mbs, offloads, ["none", "selective", "full"])
    assert len(searched.floored) == len(searched.fits) > 500
    full = [
        (float(f"{plan_step(t[4], searched.floored[i], terms=searched.terms):.9g}"), *t[1:])
        for i, t in enumerate(searched.fits)
    ]
    assert all(f[0] <= t[0] for f, t in zip(searched.fits, full, strict=True))
    for top_k in (1, 5, 40):
        tally = _Tally(
            fits=list(searched.fits), floored=dict(searched.floored), terms=searched.terms
        )
        _time_where_read(tally, top_k)
        assert read(tally.fits, top_k) == read(full, top_k)
        assert [t for i, t in enumerate(tally.fits) if i not in tally.floored] == [
            t for i, t in enumerate(full) if i not in tally.floored
        ]
        assert len(full) / 2 < len(tally.floored) < len(full) - top_k


def _h100_calibration(**kw: Any) -> Any:
    """A profile calibration of an H100 bf16 run (the two tests above plan with it)."""
    from scaletrain.planner.time.calibration import Calibration

    return Calibration(
        hardware="h100-sxm",
        precision="bf16",
        source="runs/cal",
        clock="cuda",
        split="profile",
        measured_step_s=1.0,
        gemm_tokens=4096.0,
        matmul=0.6,
        **kw,
    )
