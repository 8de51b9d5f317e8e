"""Helpers shared by the planner's recipe and kernel-traffic tests: one plan's `StepTime` under a
framework recipe, as `estimate` times it (the worst rank's parameters, the recipe's terms), a
bf16 plan under a named recipe, and one Llama block of given widths."""

from __future__ import annotations

from scaletrain.config import Layout, ModelConfig, hardware_preset
from scaletrain.planner.memory.rank_terms import model_terms
from scaletrain.planner.recipes.memory import recipe_worst_rank
from scaletrain.planner.recipes.schema import Recipe
from scaletrain.planner.time.step_time import StepTime, step_time
from scaletrain.planner.types import PlanInput


def recipe_step(plan: PlanInput, recipe: Recipe) -> StepTime:
    _, max_params = recipe_worst_rank(plan)
    return step_time(
        plan,
        max_params,
        terms=model_terms(plan, None),
        causal=True,
        gpus_per_node=None,
        zero_bubble="h1",
        recipe=recipe,
    )


def recipe_plan(
    recipe: str,
    layout: Layout,
    model: ModelConfig,
    *,
    seq: int,
    gb: int,
    mb: int,
    ac: str = "none",
    gpu: str = "a100-80gb",
) -> PlanInput:
    """A bf16 plan of `model` on `layout` (one GPU per rank) under the recipe named."""
    return PlanInput(
        model,
        hardware_preset(gpu),
        layout.world_size,
        layout,
        seq,
        gb,
        mb,
        "bf16",
        ac,
        recipe=recipe,
    )


def one_llama_block(h: int, heads: int, kv_heads: int, f: int) -> ModelConfig:
    """One RMSNorm / SwiGLU / RoPE block (no bias) of the given widths: the block the
    elementwise-traffic tests recount by hand."""
    return ModelConfig(
        dim=h,
        num_heads=heads,
        num_kv_heads=kv_heads,
        ffn_dim=f,
        num_layers=1,
        norm="rmsnorm",
        activation="swiglu",
        position="rope",
        bias=False,
    )
