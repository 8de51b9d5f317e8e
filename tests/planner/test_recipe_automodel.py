"""The NeMo AutoModel recipe (#39 items 1 and 2): FSDP2 over bf16 resident parameters with
bf16 gradients and torch Adam states in the parameter dtype, its eager MaskedCrossEntropy,
torchtune's LoRA terms on its PEFT path; the corpus's AutoModel rows planned with it."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.cli import main
from scaletrain.config import Layout, hardware_preset, model_preset
from scaletrain.planner import estimate
from scaletrain.planner.recipes.defaults import apply_defaults
from scaletrain.planner.recipes.published import FRAMEWORK_RECIPE, load_runs, plan_input, recipe_of
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.types import PlanInput

# tiny-llama: h 64, 2 layers, 4 heads of 16, 2 KV heads (kv_dim 32), ffn 176, vocab 256, untied
H, F, V, KV = 64, 176, 256, 32
FROZEN = H * H + KV * H + KV * H + H * H + 3 * F * H  # a block's seven projections
BASE = 2 * (FROZEN + 2 * H) + 2 * V * H + H  # blocks (with their norms), embedding, head, norm


def _plan(recipe: str, layout: Layout, **kw: object) -> PlanInput:
    return PlanInput(
        model_preset("tiny-llama"),
        hardware_preset("h100-sxm"),
        layout.world_size,
        layout,
        128,
        2 * layout.world_size,
        2,
        "bf16",
        ac="none",
        recipe=recipe,
        **kw,  # type: ignore[arg-type]
    )


def test_states_are_bf16_with_adam_states_in_the_parameter_dtype() -> None:
    m = estimate(_plan("automodel", Layout(dp=1))).memory
    assert m.params == 2 * BASE and m.grads == 2 * BASE
    assert m.optimizer == (2 + 2) * BASE  # exp_avg, exp_avg_sq zeros_like the bf16 parameter
    # torchtitan's fp32 parameters (and their 16-bit autocast copy), gradients and states
    t = estimate(_plan("torchtitan", Layout(dp=1))).memory
    assert (t.params, t.grads, t.optimizer) == ((4 + 2) * BASE, 4 * BASE, 8 * BASE)


def test_fsdp2_shards_the_bf16_states() -> None:
    m = estimate(_plan("automodel", Layout(dp=8, zero=3))).memory
    t = estimate(_plan("torchtitan", Layout(dp=8, zero=3))).memory
    assert m.optimizer == pytest.approx(4 * BASE / 8)
    # the sharded gradient is bf16 (torchtitan: fp32); the unit in flight the same bf16 grad
    assert t.grads - m.grads == pytest.approx((4 - 2) * BASE / 8)
    assert t.params - m.params == pytest.approx((4 - 2) * BASE / 8)


def test_loss_is_eager_masked_cross_entropy_even_under_compile() -> None:
    r = RECIPES["automodel"]
    assert r.loss == "materialized_fp32" and not r.loss_compiles
    p = _plan("automodel", Layout(dp=1))
    eager = estimate(p).memory
    compiled = estimate(dataclasses.replace(p, compile=True)).memory
    # per-layer compile leaves the loss's saved fp32 log-softmax (4 B per logit) in place
    assert compiled.buffer_terms["loss_backward_temp"] == eager.buffer_terms["loss_backward_temp"]


def test_lora_trains_bf16_adapters_over_a_frozen_bf16_base() -> None:
    p = _plan("automodel", Layout(dp=1), lora_rank=4, lora_targets=("wq", "wv"), lora_base="bf16")
    adapters = 2 * (4 * (H + H) + 4 * (H + KV))  # A and B of wq and wv, two blocks
    m = estimate(p).memory
    assert m.params == 2 * (BASE + adapters)
    assert m.grads == 2 * adapters and m.optimizer == (2 + 2) * adapters


def test_every_term_cites_automodel_where_it_differs_from_torchtitan() -> None:
    r, tt = RECIPES["automodel"], RECIPES["torchtitan"]
    differs = [
        f.name
        for f in dataclasses.fields(r)
        if f.name not in ("name", "framework", "sources")
        and getattr(r, f.name) != getattr(tt, f.name)
    ]
    assert differs
    for name in differs:
        assert "Automodel" in r.sources[name], name
    # torchtitan itself is untouched
    assert (tt.weight_bytes, tt.grad_bytes, tt.optimizer_state_bytes, tt.lora) == (4, 4, 0, False)


def test_defaults_are_automodels() -> None:
    filled = apply_defaults("automodel", Layout(dp=8), None, ())
    assert filled.layout.zero == 3 and filled.ac == "none"
    assert any("FSDP2Config.activation_checkpointing" in line for line in filled.lines)


def test_corpus_automodel_rows_take_the_recipe() -> None:
    assert FRAMEWORK_RECIPE["automodel"] == "automodel"
    rows = {r.name: r for r in load_runs() if r.framework == "automodel"}
    assert len(rows) == 6
    for run in rows.values():
        assert recipe_of(run) == "automodel"
    # the single-GPU LoRA rows ran on an 80 GB H100: bf16 Adam states and MaskedCrossEntropy
    for name in ("am-h100-l31-8b-lora-r16-1g", "am-h100-qwen25-7b-lora-r16-1g"):
        assert estimate(plan_input(rows[name], "automodel")).memory.fits, name
    assert estimate(plan_input(rows["am-h100-qwen3-30b-a3b-fsdp8-ep8"], "automodel")).memory.fits


def test_plan_and_explain_name_the_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        *["--recipe", "automodel", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm"],
        *["--dp", "8", "--micro-batch", "1", "--global-batch", "8", "--seq-len", "4096"],
    ]
    assert main(["plan", *args]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "automodel defaults assumed" in out
    assert main(["explain", *args]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "FSDP2Config.activation_checkpointing" in out
    assert "mixed-precision-training.mdx" in out
