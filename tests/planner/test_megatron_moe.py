"""A Megatron-Core MoE layer under the megatron / nemo recipes: its saved activations
(recipes.activations._megatron_moe_layer) and its routed rows' memory traffic
(time.moe_traffic), each against a hand count of the tensors and kernels named in their
docstrings (Qwen3-30B-A3B: h 2048, q 4096, kv 512, 32 heads / 4 kv heads, E 128, k 8, f 768)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scaletrain.config import Layout, hardware_preset, model_preset
from scaletrain.planner import estimate
from scaletrain.planner.recipes.activations import megatron_moe_applies, recipe_layer_bytes
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.time import moe_traffic, step_time
from scaletrain.planner.time.fp8_casts import fp8_cast_bytes_per_token
from scaletrain.planner.time.moe_traffic import moe_row_bytes_per_token
from scaletrain.planner.types import PlanInput

QWEN = model_preset("qwen3-30b-a3b")
S = 4096


def _plan(
    recipe: str, precision: str = "fp8", ac: str = "none", layout: Layout | None = None
) -> PlanInput:
    L = layout or Layout(dp=8, ep=8, zero=1)
    return PlanInput(
        QWEN,
        hardware_preset("b200"),
        L.world_size,
        L,
        S,
        8 * L.dp,
        1,
        precision,
        ac,
        recipe=recipe,
    )


def _hand_layer(g: int) -> float:
    """Per token, e = 2, g = the GEMM inputs' bytes (1 under fp8)."""
    h, q, kv, a, akv, E, k, f = 2048, 4096, 512, 32, 4, 128, 8, 768
    attention = (2 * h + 4) + g * h + 2 * (q + kv) + 4 * (a + akv) + 2 * (2 * q + 2 * kv)
    attention += 4 * a + g * q
    moe = (2 * h + 4) + 2 * h + 9 * E + 4 * (2 * E + 1) + 8 * k
    moe += k * (g * h + 2 * 2 * f + g * f + 4)
    return attention + moe


@pytest.mark.parametrize("precision,g", [("fp8", 1), ("bf16", 2)])
def test_megatron_moe_layer_hand_count(precision: str, g: int) -> None:
    for name in ("megatron", "nemo"):
        plan = _plan(name, precision)
        assert megatron_moe_applies(plan, RECIPES[name])
        got = recipe_layer_bytes(plan, RECIPES[name])
        assert got == pytest.approx(S * _hand_layer(g), rel=1e-12)
    # fp8: ~96 kB per token, well under the 16-bit copies of the k routed rows (3 x 32 kB)
    assert _hand_layer(1) == pytest.approx(95_740, abs=1)


def test_megatron_moe_full_recompute_keeps_layer_input() -> None:
    plan = _plan("megatron", ac="full")
    assert recipe_layer_bytes(plan, RECIPES["megatron"]) == 2 * S * QWEN.dim


def test_megatron_moe_not_for_other_recipes_or_deepseek() -> None:
    """torchtitan / scaletrain keep the general MoE model; DeepSeek's layer (shared experts,
    MLA, dense first blocks) is not counted by the Megatron-Core one."""
    assert not megatron_moe_applies(_plan("torchtitan"), RECIPES["torchtitan"])
    ds = dataclasses.replace(_plan("megatron"), model=model_preset("deepseek-v2-lite"))
    assert not megatron_moe_applies(ds, RECIPES["megatron"])
    assert moe_row_bytes_per_token(ds, RECIPES["megatron"]) == 0.0
    assert moe_row_bytes_per_token(_plan("torchtitan"), RECIPES["torchtitan"]) == 0.0
    assert moe_row_bytes_per_token(_plan("megatron"), None) == 0.0


def _hand_rows(fp8: bool, full: bool = False) -> float:
    h, k, f, e = 2048, 8, 768, 2
    perm = e * (k * h + h)  # the permute or the unpermute, forward (read + write)
    fwd = 2 * perm + 3 * e * k * f + (4 * k * (h + f) if fp8 else 0)
    bwd = 2 * perm + 5 * e * k * f + (4 * k * (h + 2 * f) if fp8 else 0)
    return fwd + bwd + (fwd if full else 0)


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
@pytest.mark.parametrize("ac", ["none", "full"])
def test_moe_row_traffic_hand_count(precision: str, ac: str) -> None:
    got = moe_row_bytes_per_token(_plan("nemo", precision, ac), RECIPES["nemo"])
    assert got == pytest.approx(_hand_rows(precision == "fp8", ac == "full"), rel=1e-12)
    # 451 kB per token per layer under fp8: ~5x the expert GEMM inputs' 16-bit bytes
    assert _hand_rows(True) == 450_560


def test_moe_row_traffic_expert_tp() -> None:
    """ep = 1 under tp = 2: the experts split f over tp and every tp rank permutes all k rows
    of the gathered sequence (k x t_e rows per token of its shard)."""
    L = Layout(dp=4, tp=2, sp=True)
    got = moe_row_bytes_per_token(_plan("megatron", "bf16", layout=L), RECIPES["megatron"])
    h, k, f, e, t = 2048, 8, 768, 2, 2
    rows = k * t
    want = 4 * e * (rows * h + h) + 8 * e * rows * f / t
    assert got == pytest.approx(want, rel=1e-12)


def test_moe_attention_casts_under_te() -> None:
    """The attention Linears' TE casts are charged for a Megatron-Core MoE layer (normed input
    2 B x h, projection input 4 B x q, gradients 4 B x (q + 2kv + h)); none in bf16."""
    h, q, kv = 2048, 4096, 512
    want = 2 * h + 4 * q + 4 * (q + 2 * kv + h)
    assert fp8_cast_bytes_per_token(_plan("nemo"), RECIPES["nemo"]) == want
    assert fp8_cast_bytes_per_token(_plan("nemo", "bf16"), RECIPES["nemo"]) == 0.0


def test_moe_row_traffic_in_step_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The term adds m x layers x tokens per rank x bytes / memory bandwidth to compute."""
    plan = _plan("nemo")
    with_rows = estimate(plan).time.compute_s
    monkeypatch.setattr(step_time, "moe_row_seconds_per_token", lambda p, r: 0.0)
    without = estimate(plan).time.compute_s
    per_tok = moe_traffic.moe_row_bytes_per_token(plan, RECIPES["nemo"]) / plan.hardware.memory_bw
    m = plan.grad_accum
    assert with_rows - without == pytest.approx(m * QWEN.num_layers * S * per_tok, rel=1e-9)


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_alltoall_dispatcher_copies(precision: str) -> None:
    """'alltoall' adds its chunk sorts (> 1 local expert) and, under fp8, the experts' padding
    copies: each a read + write of the k rows before and after the experts, and each one's
    backward, 8 e*k*h per kind; 'flex' runs neither (as 'unstated')."""
    h, k, e = 2048, 8, 2
    base = _plan("nemo", precision)
    plain = moe_row_bytes_per_token(base, RECIPES["nemo"])
    flex = dataclasses.replace(base, moe_dispatcher="flex")
    assert moe_row_bytes_per_token(flex, RECIPES["nemo"]) == plain
    a2a = dataclasses.replace(base, moe_dispatcher="alltoall")
    kinds = 2 if precision == "fp8" else 1
    assert moe_row_bytes_per_token(a2a, RECIPES["nemo"]) - plain == kinds * 8 * e * k * h
    # one expert per rank (ep = E): no chunk sort, the padding only under fp8
    L = Layout(dp=128, ep=128, zero=1)
    one = dataclasses.replace(_plan("nemo", precision, layout=L), moe_dispatcher="alltoall")
    one_plain = dataclasses.replace(one, moe_dispatcher="unstated")
    extra = moe_row_bytes_per_token(one, RECIPES["nemo"]) - moe_row_bytes_per_token(
        one_plain, RECIPES["nemo"]
    )
    assert extra == (8 * e * k * h if precision == "fp8" else 0)


def test_published_row_moe_dispatcher_parses(tmp_path: Path) -> None:
    """`layout.moe_dispatcher` reaches PlanInput under a framework recipe; an unknown name is
    refused by its field."""
    from scaletrain.config import ConfigError
    from scaletrain.planner.recipes.published import load_runs, plan_input

    row = """
[[runs]]
name = "t"
framework = "nemo"
source = "https://example.org/perf table 1"
gpu = "b200"
num_gpus = 8
seq_len = 4096
model = { preset = "qwen3-30b-a3b" }
layout = { dp = 8, ep = 8, zero = 1, micro_batch = 1, global_batch = 8, moe_dispatcher = "%s" }
measured = { tokens_per_s_per_gpu = 1.0 }
"""
    p = tmp_path / "runs.toml"
    p.write_text(row % "alltoall")
    (run,) = load_runs(p)
    assert plan_input(run, "nemo").moe_dispatcher == "alltoall"
    assert plan_input(run, "scaletrain").moe_dispatcher == "unstated"
    p.write_text(row % "deepep")
    with pytest.raises(ConfigError) as err:
        load_runs(p)
    assert "moe_dispatcher" in err.value.field
