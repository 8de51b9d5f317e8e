"""The llm-foundry recipe (#39 item 2): Composer's FSDP1 defaults, the MPT block's eager
elementwise kernels and Composer's unfused optimizer as time terms, what it refuses, and the
corpus's llm-foundry rows planned with it."""

from __future__ import annotations

from dataclasses import replace

from scaletrain.config import Layout, hardware_preset, model_preset
from scaletrain.planner import estimate
from scaletrain.planner.recipes.defaults import apply_defaults
from scaletrain.planner.recipes.memory import recipe_problems
from scaletrain.planner.recipes.published import FRAMEWORK_RECIPE, load_runs, plan_input
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.time.elementwise import eager_elementwise_s, mpt_eager_elementwise_bytes
from scaletrain.planner.types import PlanInput


def _mpt(recipe: str = "llm-foundry", gpu: str = "h100-sxm", ac: str = "none") -> PlanInput:
    # GPT-2 1.5B: a LayerNorm GELU block as MPT's (h 1600, f 6400)
    return PlanInput(
        model_preset("gpt2-1.5b"),
        hardware_preset(gpu),
        8,
        Layout(dp=8, zero=3),
        1024,
        64,
        8,
        "bf16",
        ac=ac,
        recipe=recipe,
    )


def test_mpt_eager_bytes_follow_the_block_count() -> None:
    m = model_preset("gpt2-1.5b")
    h, f = m.dim, m.ffn_dim
    # forward 20h + 4f (two norms, two residual adds, GELU), backward 50h + 6f
    assert mpt_eager_elementwise_bytes(m, recompute=False) == 70 * h + 10 * f
    assert mpt_eager_elementwise_bytes(m, recompute=True) == 90 * h + 14 * f
    p = _mpt()
    assert eager_elementwise_s(p, RECIPES["llm-foundry"]) == (70 * h + 10 * f) / (
        p.hardware.memory_bw
    )
    # not for other blocks (an RMSNorm SwiGLU Llama), not under compile, not for other recipes
    llama = replace(p, model=model_preset("llama3-8b"))
    assert eager_elementwise_s(llama, RECIPES["llm-foundry"]) == 0.0
    assert eager_elementwise_s(replace(p, compile=True), RECIPES["llm-foundry"]) == 0.0
    assert eager_elementwise_s(p, RECIPES["scaletrain"]) == 0.0


def test_the_same_bytes_cost_an_h100_more_per_flop_than_an_a100() -> None:
    r = RECIPES["llm-foundry"]
    h100, a100 = _mpt(gpu="h100-sxm"), _mpt(gpu="a100-80gb")
    per_flop = [eager_elementwise_s(p, r) * p.hardware.flops("bf16") for p in (h100, a100)]
    assert 1.8 < per_flop[0] / per_flop[1] < 2.0  # 989/3.35 against 312/2.039 FLOP per byte


def test_the_recipe_adds_its_passes_to_the_step() -> None:
    base, fdry = estimate(_mpt("scaletrain")).time, estimate(_mpt()).time
    assert fdry.compute_s > base.compute_s
    assert fdry.optimizer_s > base.optimizer_s  # Composer's DecoupledAdamW, FSDP1 clipping


def test_defaults_and_refusals() -> None:
    a = apply_defaults("llm-foundry", Layout(dp=8), None, ())
    assert (a.layout.zero, a.ac) == (3, "full")
    assert any("FULL_SHARD" in line for line in a.lines)
    assert not recipe_problems("llm-foundry", Layout(dp=8, zero=3), ac="full")
    assert recipe_problems("llm-foundry", Layout(dp=4, zero=3, tp=2))
    assert recipe_problems("llm-foundry", Layout(dp=4, zero=3, pp=2))
    assert recipe_problems("llm-foundry", Layout(dp=8, zero=1))
    assert recipe_problems("llm-foundry", Layout(dp=8, zero=3), ac="selective")


def test_corpus_rows_run_the_recipe() -> None:
    assert FRAMEWORK_RECIPE["llm-foundry"] == "llm-foundry"
    rows = [r for r in load_runs() if r.framework == "llm-foundry"]
    assert len(rows) >= 18
    for run in rows:
        p = plan_input(run, "llm-foundry")
        assert not recipe_problems("llm-foundry", p.layout, ac=p.ac), run.name
        assert estimate(p).memory.fits, run.name
