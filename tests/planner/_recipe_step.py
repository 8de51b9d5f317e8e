"""One plan's `StepTime` under a framework recipe, as `estimate` times it (the worst rank's
parameters, the recipe's terms): shared by the recipe time tests."""

from __future__ import annotations

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
