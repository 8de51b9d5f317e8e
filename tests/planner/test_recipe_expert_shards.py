"""torchtitan's routed experts under EP are FSDP-sharded over the dp_shard * cp / ep ranks that
hold them (recipes.memory.expert_state_shards), not over every ZeRO rank."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, model_preset
from scaletrain.planner.recipes.memory import (
    expert_state_shards,
    recipe_rank_memory,
    recipe_rank_params,
    recipe_states,
)
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.types import PlanInput

from .test_recipes import _plan

MOE = dataclasses.replace(model_preset("qwen3-30b-a3b"), num_layers=2)


def _moe_plan(dp: int, ep: int, recipe: str = "torchtitan") -> PlanInput:
    return _plan(
        recipe, Layout(dp=dp, zero=3, ep=ep), ac="full", model=MOE, seq=256, gb=dp, gpu="b200"
    )


@pytest.mark.parametrize(("dp", "ep", "want"), [(8, 8, 1), (16, 8, 2), (128, 8, 16), (8, 1, 8)])
def test_expert_state_shards_is_dp_over_ep(dp: int, ep: int, want: int) -> None:
    assert expert_state_shards(_moe_plan(dp, ep)) == want


def test_torchtitan_shards_experts_over_dp_mod_ep_only() -> None:
    """fsdp8 ep8: every rank holds its E/8 experts whole (dp_shard_mod_ep = 1) and 1/8 of the
    rest; the states are 16 B per parameter (fp32 weights and grads, AdamW's two moments)."""
    plan = _moe_plan(8, 8)
    recipe = RECIPES["torchtitan"]
    rp = recipe_rank_params(plan, True, True, MOE.num_layers)
    pc = MOE.param_counts()
    assert rp.expert == pytest.approx(MOE.num_layers * pc.mlp / 8)
    held = recipe_states(plan, recipe, rp.params, rp.expert)
    per_param = recipe.weight_bytes + recipe.master_bytes + recipe.grad_bytes
    dense = rp.params - rp.expert
    want_weights = recipe.weight_bytes * (dense / 8 + rp.expert)
    assert held.weights == pytest.approx(want_weights)
    assert held.weights + held.grads + held.optimizer == pytest.approx(
        (per_param + 8.0) * (dense / 8 + rp.expert)
    )
    # without the expert split every parameter is divided by the 8 ZeRO ranks
    flat = recipe_states(plan, recipe, rp.params)
    assert flat.weights == pytest.approx(recipe.weight_bytes * rp.params / 8)


def test_expert_states_fall_with_dp_as_one_over_dp() -> None:
    """All of a rank's sharded states are 1/dp of the model's once dp >= ep (the experts over
    ep x dp/ep ranks, the rest over dp): doubling dp halves the optimizer state."""
    opt = [
        recipe_rank_memory(_moe_plan(dp, 8), RECIPES["torchtitan"], 0).optimizer
        for dp in (8, 16, 32)
    ]
    assert opt[0] / opt[1] == pytest.approx(2.0)
    assert opt[1] / opt[2] == pytest.approx(2.0)


def test_other_recipes_keep_every_zero_rank() -> None:
    """A recipe without Recipe.experts_shard_over_ep_group divides experts by every ZeRO rank,
    as before."""
    recipe = next(
        r for r in RECIPES.values() if not r.experts_shard_over_ep_group and 3 in r.zero_stages
    )
    plan = _moe_plan(8, 8, recipe.name)
    rp = recipe_rank_params(plan, True, True, MOE.num_layers)
    assert recipe_states(plan, recipe, rp.params, rp.expert) == recipe_states(
        plan, recipe, rp.params
    )


@pytest.mark.parametrize("name", ["megatron", "nemo"])
def test_megatron_distributed_optimizer_shards_experts_over_expert_dp(name: str) -> None:
    """Megatron-Core's distributed optimizer (zero 1) shards the expert params' fp32 main
    copy and Adam moments over the expert data-parallel group of dp * cp / ep ranks
    (optimizer/__init__.py get_megatron_optimizer: intra_expt_dp_group), the dense ones over
    dp * cp; the 16-bit weights and the fp32 grad buffer stay whole on every rank."""
    recipe = RECIPES[name]
    assert recipe.experts_shard_over_ep_group
    plan = _plan(name, Layout(dp=16, zero=1, ep=8), model=MOE, seq=256, gb=16, gpu="b200")
    assert expert_state_shards(plan) == 2
    rp = recipe_rank_params(plan, True, True, MOE.num_layers)
    dense = rp.params - rp.expert
    held = recipe_states(plan, recipe, rp.params, rp.expert)
    assert held.weights == pytest.approx(recipe.weight_bytes * rp.params)
    assert held.grads == pytest.approx(recipe.grad_bytes * rp.params)
    assert held.master == pytest.approx(recipe.master_bytes * (dense / 16 + rp.expert / 2))
    assert held.optimizer == pytest.approx(8.0 * (dense / 16 + rp.expert / 2))


def test_megatron_expert_states_fall_as_one_over_dp() -> None:
    """Once dp >= ep, a rank's distributed-optimizer state is 1/(dp*tp) of the model's for the
    experts too (E/ep experts over dp/ep ranks), so doubling dp halves it."""
    opt = [
        recipe_rank_memory(
            _plan("megatron", Layout(dp=dp, zero=1, ep=8), model=MOE, seq=256, gb=dp, gpu="b200"),
            RECIPES["megatron"],
            0,
        ).optimizer
        for dp in (8, 16, 32)
    ]
    assert opt[0] / opt[1] == pytest.approx(2.0)
    assert opt[1] / opt[2] == pytest.approx(2.0)
