"""What does a training framework allocate and refuse? Framework recipes for the planner.

- `schema.py`: the `Recipe` record, each field with its meaning.
- `registry.py`: the recipes (scaletrain, torchtitan, DeepSpeed, nanotron, ...), every field
  cited to its framework's source; `megatron.py`: Megatron-LM and NeMo.
- `memory.py`: one rank's memory under a foreign recipe and the layouts it refuses
  (`recipe_problems`); `activations.py`: its activation models (Korthikanti's layer,
  torchtitan's op-level SAC, the head and loss).
- `published.py`: published training runs (`data/published_runs.toml`) and the planner's view
  of each, to hold the recipes against measurement.

The `scaletrain` recipe is the planner's own model (`planner.memory`), not composed here.
"""
