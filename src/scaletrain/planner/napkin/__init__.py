"""What do the textbook formulas say? Napkin math a learner checks by hand (`scaletrain napkin`).

- `textbook.py`: memory conventions, Korthikanti's activations, checkpointing, quantization,
  GEMM waves and alignment, ring all-reduce, each with its source and what it ignores.
- `budget.py`: a training budget: the job's FLOPs, GPUs for a deadline, renting against
  buying, the tokenizer's throughput.

The planner's own (exact) models are `planner.memory` and `planner.time`.
"""
