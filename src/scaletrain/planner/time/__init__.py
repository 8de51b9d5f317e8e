"""How long does one training step take, and what does the run cost? The planner's time model.

- `flops.py`: FLOPs per token (matmuls only, one multiply-add = 2 FLOPs; the attention core,
  the head, recomputation).
- `efficiency.py`: the fraction of peak a GEMM reaches, by GPU generation, shape and precision,
  the latency terms of collectives at scale, and the families a framework overlaps.
- `attention_core.py`: the attention core as its kernel runs it (FlashAttention-2, cuDNN fused,
  materialized), at what fraction of peak by device; the per-device kernel ceilings.
- `elementwise.py`: the bytes a block's memory-bound elementwise kernels move (eager, compiled,
  MPT, Megatron-Core / Transformer Engine) and their seconds over memory bandwidth.
- `fp8_casts.py`: the float8 GEMM rate and the casts each fp8 Linear adds.
- `comm.py`: bytes and alpha-beta times of every collective of a step (DP all-reduce, ZeRO /
  FSDP all-gather and reduce-scatter, TP, PP point-to-point, CP, EP all-to-all).
- `pipeline.py`: pipeline schedules: closed-form bubbles, in-flight micro-batches (also read by
  the memory model), action orders and a simulator.
- `pipeline_comms.py`: where a pipeline step posts its receives and lets its sends go, and the
  stage-boundary tensors a rank holds for them (the memory model's `pp_p2p`).
- `step_time.py`: compute + exposed communication + bubble + optimizer step = `StepTime`.
- `exposure.py`: which communication of a step stays on the critical path after overlap.
- `recipe_terms.py`: what a framework recipe runs its own way (its data-parallel families,
  Nanotron's async TP linears, ZeRO-1 all-reduce, accumulation and post-backward passes).
- `cost.py`: training time, GPU-hours, money, energy and CO2 of a whole run.
"""
