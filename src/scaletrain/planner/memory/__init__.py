"""How many bytes does one GPU hold at its peak? The planner's memory model, per rank.

- `states.py`: parameters, gradients and optimizer states per byte convention, ZeRO sharding,
  offload, and the ZeRO-3 / FSDP units gathered in flight (`params.in_flight`); how a pipeline
  splits the blocks (`stage_layer_counts`).
- `activations.py`: what a block keeps for backward per micro-batch, by AC mode (Korthikanti
  et al. 2022, checked against the dry-run's ledger); `naive_attention.py`: the S x S core's.
- `head.py`: the first and last stage's terms: head inputs, the fused loss's chunk and
  temporaries, the head weight's gradient, the embedding's backward.
- `buffers.py`: communication and allocator buffers (DDP buckets, pipeline receive buffers),
  the runtime context and the allocator's fragmentation.
- `block_ends.py`: a block's ends the stored set misses: an RMSNorm's backward (its fp32
  temporaries) and, under fp8, the MLP forward's end (its unsaved 16-bit inputs).
- `rank_terms.py`: the terms above per layout, cached for one search (`ModelTerms`).
- `moments.py`: the moments of a step at which a rank can peak, each a record of named terms;
  `rank_moments.py` builds them (the ZeRO-2/3 backward with its gathered block, the loss's and
  the embedding's backward, the autocast cast gradients a pipelined backward holds to its end);
  `pipeline_ranks.py`: which pipeline ranks can be the worst and their schedule's moments.
- `rank.py`: the worst rank of a plan, `estimate_memory(plan) -> MemoryBreakdown`.

The framework recipes' memory (Megatron, DeepSpeed, torchtitan...) is `planner.recipes`.
"""
