"""torch's ring attention under context parallelism (planner/time/cp_ring.py): the byte count of
its elementwise passes, the waits of its all-gather rotater, and torchtitan's CP plans."""

from __future__ import annotations

import pytest

from scaletrain.planner.recipes.registry import recipe_named
from scaletrain.planner.time.comm import gather_time, p2p_time
from scaletrain.planner.time.cp_ring import (
    MERGE_BYTES,
    torch_ring_pass_bytes,
    torch_ring_passes_s,
    torch_ring_terms,
)


def test_pass_bytes_by_hand() -> None:
    # cp = 2, bf16, one element of Q and of each of K and V
    fwd, bwd = torch_ring_pass_bytes(2, 2, q_elems=1.0, kv_elems=1.0)
    # K, V contiguous + cat (4e each); two fp32 casts (e + 4), one merge, the final cast (4 + e)
    assert fwd == pytest.approx(2 * 8 + 2 * 6 + MERGE_BYTES + 6)
    # zeros (4 x 3), K/V copies (16), dQ adds (2 x 10) + cast (6), dK and dV: the first add
    # (10), one half add (5) + cat (8), two fp32 cats (16), the cast (6)
    assert bwd == pytest.approx(12 + 16 + 20 + 6 + 2 * (10 + 5 + 8 + 16 + 6))
    assert torch_ring_pass_bytes(1, 2, q_elems=1.0, kv_elems=1.0) == (0.0, 0.0)
    # the merges grow with the ring: cp - 1 of them per forward
    f4, _ = torch_ring_pass_bytes(4, 2, q_elems=1.0, kv_elems=0.0)
    f8, _ = torch_ring_pass_bytes(8, 2, q_elems=1.0, kv_elems=0.0)
    assert f8 - f4 == pytest.approx(4 * (6 + MERGE_BYTES))
    # so do the K/V concatenations: the loop builds the exchange buffer at every sub-step but
    # the last (torch.cat of K and V, read + write e each), forward and backward alike
    kf4, kb4 = torch_ring_pass_bytes(4, 2, q_elems=0.0, kv_elems=1.0)
    kf8, kb8 = torch_ring_pass_bytes(8, 2, q_elems=0.0, kv_elems=1.0)
    assert kf8 - kf4 == pytest.approx(2 * 4 * 2 * 2)
    assert kf4 == pytest.approx(2 * (2 + 2 * 3) * 2)
    # backward: the copies, plus per dK / dV the first add, cp - 1 half adds + cats, cp fp32
    # cats and the cast
    assert kb8 - kb4 == pytest.approx(2 * 4 * 2 * 2 + 2 * 4 * (10 / 2 + 8 + 8))


def _plan(name: str):
    """The planner's input for the published corpus row `name` under its framework recipe."""
    from scaletrain.planner.recipes.published import load_runs, plan_input, recipe_of

    (run,) = [r for r in load_runs() if r.name == name]
    return plan_input(run, recipe_of(run))


def test_torchtitan_ring_moves_query_head_kv() -> None:
    """torchtitan repeats K/V to the query heads before SDPA: the all-gather and the fp32 dK/dV
    sends carry n_heads / n_kv_heads times what a GQA ring would."""
    tt = recipe_named("torchtitan")
    plan = _plan("tt-h100-l31-8b-fsdp1-cp8-256k")
    link = (370e9, 0.0, False)
    ring = torch_ring_terms(plan, tt, link=link, core_s_layer=1.0, layers=32)
    e_kv = 32768 * plan.model.q_dim  # tokens per rank x query heads x head dim
    kv, dkv = 2 * 2 * e_kv, 2 * 4 * e_kv
    # full AC: the forward all-gather twice, the backward's once; cp fp32 sends
    assert ring.bytes == pytest.approx(32 * (3 * 7 * kv + 8 * dkv))
    # a slow sub-SDPA hides every collective but the last dK/dV send
    assert ring.wait_per_mb == pytest.approx(32 * p2p_time(dkv, 370e9, 0.0))
    # a fast one leaves the all-gather exposed past the first sub-SDPA (forward, recompute,
    # backward) and every dK/dV send past one sub-SDPA backward
    fast = torch_ring_terms(plan, tt, link=link, core_s_layer=1e-6, layers=1)
    t_ag, t_dkv = gather_time(8 * kv, 8, 370e9, 0.0), p2p_time(dkv, 370e9, 0.0)
    sub_f = 1e-6 / 4.5 / 8
    sub_b = 2.5 * sub_f
    want = 2 * (t_ag - sub_f) + (t_ag - sub_b) + 7 * (t_dkv - sub_b) + t_dkv
    assert fast.wait_per_mb == pytest.approx(want)


def test_no_ring_without_cp() -> None:
    tt = recipe_named("torchtitan")
    plan = _plan("tt-h100-l31-8b-fsdp8-cp1-32k")
    assert torch_ring_passes_s(plan, tt, layers=32) == 0.0
    ring = torch_ring_terms(plan, tt, link=(1e9, 0.0, False), core_s_layer=1.0, layers=32)
    assert ring.bytes == ring.seconds == ring.wait_per_mb == 0.0


def test_torchtitan_cp_slower_than_the_p2p_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 405B 4D row under torchtitan's recipe, with and without torch's ring: the
    all-gather across nodes (cp ranks 8 apart under tp 8) and the merges add time and bytes;
    at cp = 1 the two recipes agree."""
    import dataclasses

    from scaletrain.planner import estimate
    from scaletrain.planner.recipes import registry

    cp8 = _plan("tt-h100-l31-405b-4d-cp8-256k")
    cp1 = _plan("tt-h100-l31-405b-4d-cp1-32k")
    with_ring, one_ring = estimate(cp8).time, estimate(cp1).time
    p2p = dataclasses.replace(registry.RECIPES["torchtitan"], cp_ring="p2p", cp_kv_repeated=False)
    monkeypatch.setitem(registry.RECIPES, "torchtitan", p2p)
    without, one = estimate(cp8).time, estimate(cp1).time
    assert with_ring.step_s > without.step_s
    assert with_ring.comm_terms["cp_ring"] > without.comm_terms["cp_ring"]
    assert one_ring.step_s == pytest.approx(one.step_s)


def test_ring_passes_shrink_beside_longer_chunks() -> None:
    """The ring's own elementwise work is linear in the chunk (merges and copies of the rank's
    output, K and V: tokens x hidden per sub-step) while each sub-SDPA is quadratic in it:
    doubling the tokens per rank at the same cp doubles the passes and quadruples the
    attention core, so their ratio halves. At torchtitan's 32k-token chunks (Llama 3 8B,
    256k on cp 8) the passes and every ring collective together, all of them counted as
    exposed, stay near a tenth of the sub-SDPAs' seconds."""
    import dataclasses

    from scaletrain.planner import estimate
    from scaletrain.planner.time.step_time import attention_core_step_s

    tt = recipe_named("torchtitan")
    plan = _plan("tt-h100-l31-8b-fsdp1-cp8-256k")
    half = dataclasses.replace(plan, seq_len=plan.seq_len // 2)

    def core_s(p) -> float:  # the sub-SDPAs' seconds per step on one rank (32 blocks)
        return attention_core_step_s(p, tt, layers=32)

    long_pass = torch_ring_passes_s(plan, tt, layers=32)
    short_pass = torch_ring_passes_s(half, tt, layers=32)
    assert long_pass == pytest.approx(2 * short_pass)
    assert core_s(plan) == pytest.approx(4 * core_s(half))
    ring_s = estimate(plan).time.comm_terms["cp_ring"]
    assert (long_pass + ring_s) / core_s(plan) < 0.15


def test_explain_splits_the_cp_ring() -> None:
    """`explain` prints the busiest rank's ring per step: its sub-SDPAs' seconds, the
    elementwise passes and the collectives; nothing of it at cp = 1."""
    from scaletrain.planner import estimate
    from scaletrain.planner.output.explain import explain

    text = explain(estimate(_plan("tt-h100-l31-8b-fsdp1-cp8-256k")))
    (line,) = [x for x in text.splitlines() if "CP ring on the busiest rank" in x]
    assert "8 sub-SDPAs per block" in line
    assert "elementwise passes" in line and "collectives" in line
    assert "CP ring on the busiest rank" not in explain(
        estimate(_plan("tt-h100-l31-8b-fsdp8-cp1-32k"))
    )


def test_attention_core_step_s_is_the_window_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """`attention_core_step_s` is the compute window's attention core: the seconds the
    estimate's compute holds for the busiest rank's sub-SDPAs."""
    from scaletrain.planner import estimate
    from scaletrain.planner.recipes.stages import recipe_stages
    from scaletrain.planner.time import step_time as st

    tt = recipe_named("torchtitan")
    seen: list[float] = []
    real = st._compute_side

    def spy(*a, **k):  # type: ignore[no-untyped-def]
        side = real(*a, **k)
        seen.append(side.window.core_s)
        return side

    monkeypatch.setattr(st, "_compute_side", spy)
    for name in ("tt-h100-l31-8b-fsdp2-cp4-128k", "tt-h100-l31-405b-4d-cp4-128k"):
        plan = _plan(name)
        estimate(plan)
        layers = max(recipe_stages(plan, tt).layers)
        assert st.attention_core_step_s(plan, tt, layers=layers) == pytest.approx(seen[-1])
