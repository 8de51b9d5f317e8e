"""Which decoder layers each pipeline rank holds under a framework recipe, and where the head is.

Three rules (`Recipe.pp_split`):
- 'balanced': scaletrain's own (`memory.states.stage_layer_counts`: the embedding and the head
  count as one layer each);
- 'even': L / (pp x v) layers per stage, the remainder to the first stages (Megatron-LM's
  get_num_layers_to_build, DeepSpeed's PipelineModule partition_method 'type:transformer'),
  the embedding on rank 0 and the head on the last stage's rank;
- 'compute_cost': Nanotron's `models/base.py build_model` (read at nanotron c252843): every
  PipelineBlock in model order gets a cost (`models/llama.py LlamaModel.get_block_compute_costs`:
  a decoder layer 4 x heads x (h / heads) x h + 3 x ffn x h, the lm_head V x h, every other block
  0); block k goes to the current rank, and the rank index moves on after the first block whose
  cumulative cost exceeds total x (rank + 1) / pp. The crossing block stays on the earlier rank,
  so rank 0 holds more layers than L / pp whenever the head's cost pulls the thresholds forward
  (1.34B of Nanotron's benchmark at pp 2: 11 of 16 layers on rank 0, 5 and the head on rank 1).

Counts: decoder layers per rank and the rank holding the final norm and lm_head. Ignores:
Nanotron's fp32 cast and loss blocks (cost 0) landing on a later rank than the lm_head when a
threshold falls inside the head's cost (small models at large pp): the head's rank is charged
with them. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import ModelConfig

from ..memory.states import stage_layer_counts
from ..time.pipeline import last_stage_rank
from ..types import PlanInput
from .schema import Recipe

__all__ = ["RecipeStages", "compute_cost_stages", "recipe_stages", "recipe_stage_layers"]


@dataclass(frozen=True, slots=True)
class RecipeStages:
    """A pipeline split under a recipe."""

    layers: tuple[int, ...]
    """Decoder layers held by each pipeline rank."""
    head_rank: int
    """The rank holding the final norm, the head and the loss."""


def compute_cost_stages(model: ModelConfig, pp: int) -> RecipeStages:
    """Nanotron's split by block compute cost (module docstring; nanotron c252843
    src/nanotron/models/base.py build_model and models/llama.py get_block_compute_costs).
    The blocks, in LlamaForTraining's module order: token embedding (0), the decoder layers,
    the final norm (0), the lm_head (V x h), the fp32 cast and the loss (0)."""
    h, heads = model.dim, model.num_heads
    layer_cost = 4 * heads * (h // heads) * h + 3 * model.ffn_dim * h
    head_cost = model.vocab_size * h
    total = model.num_layers * layer_cost + head_cost
    thresholds = [total * ((r + 1) / pp) for r in range(pp)]  # nanotron's expression
    counts = [0] * pp
    rank, cumulative = 0, 0
    blocks = [("embedding", 0)] + [("layer", layer_cost)] * model.num_layers + [("norm", 0)]
    head_rank = 0
    for kind, cost in [*blocks, ("head", head_cost)]:
        cumulative += cost
        if kind == "layer":
            counts[rank] += 1
        elif kind == "head":
            head_rank = rank
        if cumulative > thresholds[rank]:
            rank = min(rank + 1, pp - 1)
    return RecipeStages(layers=tuple(counts), head_rank=head_rank)


def recipe_stages(plan: PlanInput, recipe: Recipe) -> RecipeStages:
    """Layers per pipeline rank and the head's rank for `plan` under `recipe`."""
    L, n = plan.layout, plan.model.num_layers
    if recipe.pp_split == "compute_cost" and L.pp > 1:
        return compute_cost_stages(plan.model, L.pp)
    if recipe.pp_split == "even":
        stages = L.pp * L.pp_virtual
        per = [n // stages + (1 if i < n % stages else 0) for i in range(stages)]
        counts = [0] * L.pp
        for s, k in enumerate(per):
            counts[s % L.pp] += k
        return RecipeStages(layers=tuple(counts), head_rank=last_stage_rank(L))
    return RecipeStages(
        layers=stage_layer_counts(n, L.pp, L.pp_virtual, L.pp_schedule),
        head_rank=last_stage_rank(L),
    )


def recipe_stage_layers(plan: PlanInput, recipe: Recipe) -> tuple[int, ...]:
    """Decoder layers per pipeline rank under `recipe` (`recipe_stages`)."""
    return recipe_stages(plan, recipe).layers
