"""The `Recipe` dataclass: the fields a framework recipe states (what the framework allocates
and does, as the planner needs it), each with what it means. The recipes themselves, each
field cited to its framework's source, are the registry in `registry.py`.

Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Recipe",
    "DEFAULT_RECIPE",
    "CPRing",
    "EagerBlock",
    "PPSplit",
    "TPComm",
    "TiedGradSync",
    "Zero1GradSync",
]

DEFAULT_RECIPE = "scaletrain"

PPSplit = Literal["balanced", "even", "compute_cost"]
"""Pipeline layer-split rules (`Recipe.pp_split`, `recipes.stages`)."""
TPComm = Literal["exposed", "async_linears"]
"""How a recipe's TP linears communicate (`Recipe.tp_comm`)."""
Zero1GradSync = Literal["reduce_scatter", "allreduce_after_backward"]
"""How a recipe's ZeRO-1 synchronises gradients (`Recipe.zero1_grad_sync`)."""
TiedGradSync = Literal["none", "allreduce_after_backward"]
"""How a recipe sums the gradients of an embedding and a head tied across pipeline stages
(`Recipe.tied_grad_sync`)."""
EagerBlock = Literal["llama", "torchtune", "mpt", "mcore", "hf_gpt2"]
"""Which block's eager elementwise kernels a recipe counts (`Recipe.eager_block`)."""
MoEBlock = Literal["none", "torchtitan"]
"""Whose MoE block's elementwise and routed-row kernels a recipe counts (`Recipe.moe_block`)."""
CPRing = Literal["p2p", "torch_allgather"]
"""How a recipe's ring attention exchanges K/V (`Recipe.cp_ring`)."""
PPStageBuffers = Literal["pair", "torch_per_microbatch"]
"""What a recipe's pipeline stages hold for their sends and receives
(`Recipe.pp_stage_buffers`)."""


@dataclass(frozen=True)
class Recipe:
    """What one framework allocates and does (bytes per parameter before any sharding)."""

    name: str
    framework: str
    weight_bytes: float
    """Bytes/param of the weights kept for the run (16-bit model weights, or fp32 parameters
    cast for compute)."""
    master_bytes: float
    """Bytes/param of an fp32 master copy beside 16-bit weights (0: the weights are fp32)."""
    grad_bytes: float
    """Bytes/param of the gradient the backward accumulates into (fp32 main_grad buffer: 4)."""
    grad_buffer_full_under_zero1: bool
    """ZeRO-1 / distributed optimizer keeps the whole gradient buffer (reduce-scatters in
    place) instead of sharding it."""
    shards_master: bool
    """ZeRO-1 (distributed optimizer) shards the master copy with the optimizer states."""
    step_grad_fp32_copy: bool
    """The optimizer step makes an fp32 copy of this rank's gradient partition (4 B per
    sharded param, alive only during the step)."""
    autocast_weight_copy: bool
    """Unsharded fp32 parameters under autocast: every matmul weight's 16-bit cast is saved
    from forward to backward (2 B/param)."""
    zero_stages: tuple[int, ...]
    """ZeRO stages the framework runs (0 = plain DDP)."""
    ddp_bucket: str
    """'view': gradients live in the buckets (no copy); 'copy': the reducer keeps a flat copy
    of every gradient; 'ipg': a fixed-size reduction buffer (DeepSpeed)."""
    bucket_elements: float
    """Elements per gradient bucket (the last bucket is the reduction left exposed after
    backward); for 'megatron' the rule max(4e7, 1e6 x dp) replaces it."""
    bucket_elem_bytes: float
    """Bytes per element of the reduction buffer (fp32 reduction: 4)."""
    bucket_count: int
    """Reduction buffers alive at once (DeepSpeed overlap_comm: 2)."""
    fsdp_prefetch_units: int
    """FSDP/ZeRO-3 units gathered beside the one computing (prefetch)."""
    fsdp_prefetch_params: float
    """ZeRO-3 prefetch bucket in parameters (DeepSpeed stage3_prefetch_bucket_size); 0: whole
    units (FSDP2)."""
    loss: str
    """'fused' (chunked, scaletrain), 'vocab_parallel_fp32' (Megatron-style: fp32 softmax
    saved in place, V/tp), 'materialized_fp32' (16-bit logits, fp32 upcast, log-softmax
    saved: F.cross_entropy(logits.float())) or 'chunked_fp32' (the 16-bit logits in
    `loss_chunks` sequence chunks, each upcast and log-softmaxed on its own, every chunk's
    fp32 log-softmax saved: torchtune's CEWithChunkedOutputLoss)."""
    activations: str
    """Per-layer activation model: 'scaletrain' (our modules:
    memory.activations.layer_activation_bytes),
    'korthikanti' (Megatron's fused TE/flash transformer layer, Korthikanti et al. 2022
    Table 2 generalised to GQA/SwiGLU), 'sdpa_bf16' (an SDPA Llama whose residual stream is
    16-bit: memory.activations.layer_activation_bytes with residual_fp32=False) or 'nanotron'
    (Nanotron's LlamaDecoderLayer, per saved tensor: recipes.activations._nanotron_layer)."""
    selective: str
    """What ac='selective' keeps: 'scaletrain' (parallel/ac.py), 'core_attention'
    (Megatron: the attention core is recomputed, its s^2 terms dropped) or 'torchtitan_op'
    (op-level SAC: outputs of every other matmul and of SDPA)."""
    ac_modes: tuple[str, ...]
    """Activation checkpointing modes the framework offers."""
    full_ac_saves: str
    """What ac='full' keeps per layer: 'layer_input' for every recipe (the checkpointed block's
    input, /tp with SP)."""
    sp_with_tp: bool
    """Tensor parallelism always runs with sequence parallelism (torchtitan's TP plan)."""
    attention: str
    """'model': attention as the model config says (flash/SDPA keeps no s x s scores);
    'naive': the framework's default attention keeps softmax(QK^T) (the s x s scores) for
    backward whatever the model config says."""
    dropout_masks: bool
    """1-byte dropout masks are kept for GPT-2-family models (Megatron's default
    hidden/attention dropout 0.1); Llama-family recipes run without dropout."""
    pp_split: PPSplit
    """How the decoder layers are split over pipeline ranks (`recipes.stages`): 'balanced'
    (scaletrain's rule, the embedding and the head counted as a layer each), 'even' (L / pp
    layers per stage, embedding and head on top of the end stages) or 'compute_cost'
    (Nanotron's blocks balanced by their matmul cost, the head's included)."""
    pp_schedules: tuple[str, ...]
    cp: bool
    """Context parallelism available."""
    ddp_with_model_parallel: bool
    """Plain DDP (zero 0) composes with tp/pp/cp."""
    pp_with_zero: tuple[int, ...]
    """ZeRO stages allowed together with pp > 1."""
    fragmentation: float
    """reserved = allocated x (1 + fragmentation) (+ context)."""
    cuda_context_bytes: float
    time_model: str
    """'scaletrain' (time.step_time.default_efficiency) or 'generation' (efficiency.py). Every
    recipe uses 'scaletrain' (see FOREIGN_TIME_MODEL); the communication terms are the recipe's own
    either way."""
    pp_fsdp_unsharded: bool = False
    """Pipeline parallelism over FSDP keeps every unit of the stage unsharded for the whole
    forward/backward (no reshard after forward) and accumulates the unsharded gradients in the
    reduce dtype across micro-batches, reduce-scattering them once after the last one."""
    experts_shard_over_ep_group: bool = False
    """Under ZeRO with ep > 1 the routed experts' states are sharded over the dp*cp/ep ranks
    holding the same experts (`memory.expert_state_shards`), not over every ZeRO rank
    (torchtitan's expert FSDP mesh; Megatron-Core's expert data-parallel group)."""
    loss_compiles: bool = False
    """With `compile` the framework compiles its loss too: Inductor saves the 16-bit logits
    and per-token fp32 statistics instead of the fp32 log-softmax and writes the 16-bit
    gradient from one fused kernel (PlanInput.compile_loss overrides)."""
    chunked_loss_tokens: int = 0
    """Tokens per chunk of the framework's optional chunked head + loss, which a run turns on
    (`PlanInput.chunked_loss` True; `PlanInput.loss_chunk_tokens` > 0 overrides the length),
    over a 'materialized_fp32' loss: torchtitan's ChunkedLossWrapper, whose head and loss run
    forward and backward one chunk at a time inside the loss call and hand the decoder an fp32
    accumulated gradient of the hidden states (`activations.recipe_head_bytes`). 0: the
    framework has none."""
    pipe_output_buffers: int = 0
    """The pipeline engine keeps the last stage's forward output (the 16-bit logits) of this
    many micro-batches in its buffers through backward (DeepSpeed: 2), at any pp."""
    te_fp8_gemm_inputs: bool = False
    """Transformer Engine layers: under fp8 each GEMM saves the fp8 (1 B) cast of its input
    for backward instead of the 16-bit tensor, so the two layernorm outputs and the MLP's
    activation output take 1 B per element, and the attention output (kept in 16 bits by the
    attention core) gains a 1 B fp8 copy for the output projection
    (activations._korthikanti). The weights are counted as 16-bit: TE's fp8 primary
    weights (1 B) with their cached transpose (1 B); without fp8 primary weights TE's weight
    workspaces would add 2 B per linear parameter (module/base.py get_fp8_workspace
    cache_name='weight'), which this flag does not count."""
    eager_elementwise: bool = False
    """Time model: the framework runs its block's elementwise ops (norms, RoPE, SiLU, adds) as
    separate eager kernels unless compiled, charged over memory bandwidth
    (elementwise.eager_elementwise_bytes); False where the planner's calibrated efficiency
    stands for them. Megatron-Core's fused kernels (Transformer Engine) set it with
    `eager_block` 'mcore': their own traffic is charged instead."""
    fsdp2_copies: bool = False
    """Time model: ZeRO-2/3 run as torch's FSDP2 (`fully_shard`), whose all-gather copy-out and
    reduce-scatter copy-in run on the compute stream, charged over memory bandwidth
    (time.fsdp_copies.fsdp2_copy_bytes). scaletrain's own trainer runs FSDP2 too
    (parallel/fsdp.py), but its recipe leaves this off as it leaves `eager_elementwise` off: its
    calibrated efficiency (time.step_time.default_efficiency) stands for its kernels."""
    fsdp2_ends_exposed: bool = False
    """Time model: ZeRO-3 runs as torch's FSDP2, whose first all-gathers of a forward (the
    first unit's and block 0's) and last reduce-scatters of a backward (block 0's and the
    root / embedding unit's, which the root's final callback waits for) hide behind no
    compute (time.exposure.fsdp2_end_exposure); False: one average unit's gather, as the
    shared rule charges it."""
    eager_block: EagerBlock = "llama"
    """Which block's eager elementwise kernels `eager_elementwise` counts: 'llama' (an RMSNorm
    SwiGLU RoPE block, elementwise.eager_elementwise_bytes, dense RMSNorm models only) or
    'torchtune' (that block with torchtune's stack-based fp32 RoPE, elementwise.TUNE_ROPE_EXTRA,
    and its eager fp32 cross-entropy over the logits, elementwise.TUNE_LOSS_BYTES) or 'mpt'
    (llm-foundry's MPT block: LayerNorm, GELU MLP, split QKV, Triton flash attention's fp32 dq
    accumulation, elementwise.mpt_eager_elementwise_bytes, dense LayerNorm GELU models only) or
    'mcore' (Megatron-Core's decoder layer on Transformer Engine: not eager, the fused norm,
    bias-dropout-add, activation and RoPE kernels it runs, elementwise.mcore_elementwise_bytes,
    any dense block) or 'hf_gpt2' (Hugging Face transformers' eager GPT2Block: Conv1D addmm
    bias copies, head split / merge copies, tanh-GELU as eight kernels, dropouts,
    elementwise.hf_gpt2_eager_elementwise_bytes, dense LayerNorm GELU models only)."""
    moe_block: MoEBlock = "none"
    """Time model, MoE models: 'torchtitan' charges torchtitan's MoE block's memory-bound
    kernels (norms, RoPE, SiLU x gate on the routed rows, the routed rows' gather and
    scatter-add) over memory bandwidth when the block runs eager
    (elementwise.torchtitan_moe_block_eager, torchtitan_moe_elementwise_bytes); 'none' charges
    none for an MoE block outside Megatron-Core's (time.moe_traffic)."""
    naive_scores: str = "megatron"
    """Which kernels a naive (materialized) attention core runs on its s x s scores, the key
    of time.attention_core.NAIVE_SCORE_BYTES: 'megatron' (Megatron's fused scale-mask-softmax)
    or 'hf_gpt2' (Hugging Face GPT2Attention._attn: scale, causal where, mask add, softmax and
    dropout as separate kernels). scaletrain's own recipe always counts its own core."""
    ddp_reducer_copy_bytes: float = 0.0
    """Bytes per parameter of torch DDP's own bucket copy of the gradients (in the parameter
    dtype), kept beside the framework's accumulation buffer when the framework wraps the model
    in torch DDP without gradient_as_bucket_view, at ZeRO-0 with dp > 1 (Nanotron: 2)."""
    param_grads_until_backward_end: bool = False
    """Every parameter's 16-bit autograd `.grad` is alive at the end of each micro-batch's
    backward, beside the fp32 accumulation buffer: the framework runs the whole backward
    before copying `.grad` into its buffers and freeing it (Nanotron's
    FP32GradientAccumulator.backward). With a pipeline the other micro-batches in flight keep
    their activations meanwhile (an end-of-backward moment, `recipes.memory`)."""
    fused_rmsnorm: bool = False
    """The framework's RMSNorm is a fused kernel saving its 16-bit input and an fp32 rstd per
    token for backward (no fp32 upcast kept), whatever the run states (`PlanInput.fused_norm`)."""
    sp_linear_saves_shard: bool = False
    """Under sequence parallelism the column-parallel linears (QKV, MLP input) save their
    sequence-sharded input and all-gather it again in backward, instead of saving the gathered
    copy: their saved inputs, and the head's, divide by tp (recipes.activations._nanotron_layer,
    recipe_head_bytes)."""
    loss_casts_logits: bool = False
    """The head's 16-bit logits are cast to fp32 by an op of their own before a
    'vocab_parallel_fp32' loss that subtracts the max out of place: at the loss forward the
    16-bit logits, the fp32 cast and the saved fp32 softmax coexist (recipes.activations
    .recipe_head_bytes)."""
    zero1_gather_flat_copies: bool = False
    """ZeRO-1's all-gather of the updated weights after the step goes through flattened copies:
    the rank's shard (P/N weights) and one flat buffer per dp rank (P weights in all) are
    allocated beside the model states, then copied back into the parameters."""
    zero1_gather_host_copies: bool = False
    """ZeRO-1's all-gather of the updated weights is assembled on the host one (dp rank,
    parameter tensor) pair at a time: a Python slice of each parameter per dp rank before the
    collective, each dp rank's list flattened and its gathered buffer unflattened (a view per
    tensor in ATen) and a copy_ back into it per dp rank after (time.recipe_terms.
    zero1_gather_host_s), dp x the rank's parameter tensors small ops a step."""
    bf16_optimizer: bool = False
    """Under bf16 at ZeRO-1 (no optimizer offload) the framework runs DeepSpeed's
    BF16_Optimizer (recipes.memory.bf16_optimizer_runs): beside the bf16 .grad of every
    parameter, kept from one backward to the next, it accumulates into an unsharded fp32
    gradient buffer (4 B per parameter of the rank) whose dp partition the step reads in place
    (no step-time fp32 copy, no ZeRO ipg bucket); the gradient all-reduce casts the flat fp32
    buffer to the bf16 communication dtype (2 B per parameter while it reduces)."""
    zero1_flat_buffers: bool = False
    """ZeRO-1 of DeepSpeed 0.4 (stage2.py at stage 1, contiguous gradients forced off) under a
    torch whose list all-gather flattens its outputs: no reduction buffer during the backward;
    after it, every gradient bucket is flattened into a new 16-bit tensor and the step's
    all-gather of the updated weights goes through a flat dp x shard copy per shard, the copies
    of one phase alive together; what the activations freed cannot hold becomes new
    caching-allocator segments that stay reserved (recipes.zero1_flats)."""
    zero_step_check_copies: bool = False
    """The ZeRO-1/2 optimizer's step (not BF16_Optimizer, not ZeRO-3) checks each gradient
    slice of the rank's dp partition one at a time: an fp32 copy for the overflow check, then
    an fp64 copy for the gradient norm. The largest slice (the largest parameter, at most the
    partition) sets their size; a copy larger than every block the backward freed is a new
    caching-allocator segment that stays reserved (recipes.zero1_flats.step_check_copies)."""
    wd_group_halved: bool = False
    """The optimizer's weight-decay parameter group is split in two by parameter count
    (BigScience's Megatron-DeepSpeed of 2022, an apex FusedAdam workaround): ZeRO partitions
    each group over dp, so a parameter's slice is at most its group's partition - the first
    rank's word embedding heads the first half of the rank's weight matrices."""
    zero3_module_fetch: bool = False
    """ZeRO-3 gathers each leaf module's parameters with a collective of its own (prefetching
    one module ahead) and reduce-scatters the gradients from a fixed bucket every micro-batch,
    both on the step's critical path (time/zero3_fetch.py: DeepSpeed) instead of FSDP's
    per-block collectives overlapped with compute."""
    tp_comm: TPComm = "exposed"
    """Time model: how the tensor-parallel linears communicate under sequence parallelism.
    'exposed': every TP collective on the critical path (comm._tp_term); 'async_linears':
    Nanotron's REDUCE_SCATTER mode with tp_linear_async_communication, whose column linears
    hide their all-gathers behind GEMMs and whose row linears reduce-scatter in the open
    (time/recipe_terms.async_tp_terms); memory: the row linears' backward gathers their output
    gradient into a second persistent buffer beside the column linears' (recipes.memory
    _recipe_buffers: two e x T x h 'tp_all_gather' buffers)."""
    zero1_grad_sync: Zero1GradSync = "reduce_scatter"
    """Time model: how ZeRO-1 synchronises the gradients. 'reduce_scatter': bucketed during
    the backward (time.recipe_terms.recipe_comm); 'allreduce_after_backward': one all-reduce of the
    whole fp32 gradient buffer once the pipeline engine returns, nothing left to hide it
    (Nanotron without DDP at zero_stage 1)."""
    tied_grad_sync: TiedGradSync = "none"
    """Time model: how the gradients of a tied embedding and head that sit on different
    pipeline stages (pp > 1) are summed. 'none': not charged; 'allreduce_after_backward': one
    all-reduce of the tied weight's gradient buffer (grad_bytes per element, its 1/tp vocab
    shard) between the first and the last stage once the pipeline engine returns, nothing left
    to hide it (time.recipe_terms.recipe_comm; Nanotron's sync_tied_weights_gradients)."""
    single_hw_queue: bool = False
    """Time model: the framework's launcher sets CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware
    work queue per device, kernels start in launch order whatever their stream: what its
    tensor-parallel linears rely on to start a collective before the GEMM it hides behind), so
    a data-parallel gradient reduction launched during the backward holds back the backward
    kernels queued after it instead of running beside them: the ZeRO-0 / DDP all-reduce is
    charged whole (time.recipe_terms.recipe_exposed). Sources: NVIDIA/Megatron-LM issue #1468
    (2025-03-11: traces of an 8B model at TP 1, DP 64, --overlap-grad-reduce overlapping
    nothing with the variable at 1 and overlapping once it is unset); alibaba/Megatron-LLaMA
    issues #26 and #43 (2023: with the variable at 1, kernels on other streams wait for the
    DP communication to finish; the DP reduce-scatter needs it > 1 to overlap the backward);
    NVIDIA/apex PR #1544 (2022: poor overlap of backward compute and gradient reduce-scatters
    under CUDA_DEVICE_MAX_CONNECTIONS=1); verl-project/verl PR #6976 (2026: FSDP2's prefetch
    and compute serial at 1, traces with the variable at 1 and unset). Ignores: the part of a
    reduction that does run beside compute (NVIDIA/Megatron-LM issue #636 sees some overlap
    and some blocking at 1)."""
    cp_ring: CPRing = "p2p"
    """Time model: how ring attention runs under context parallelism. 'p2p': cp-1 K/V block
    sends each way, hidden behind the attention core (comm._cp_term); 'torch_allgather':
    torch's _templated_ring_attention with the all-gather rotater (time/cp_ring.py): one K/V
    all-gather per forward hidden behind the first sub-SDPA only, fp32 dK/dV sends, and the
    fp32 merges of the sub-steps' outputs as elementwise passes."""
    pp_stage_buffers: PPStageBuffers = "pair"
    """Memory: the pipeline's stage-boundary tensors (pp > 1). 'pair': one send and one
    receive buffer of one micro-batch's residual stream (e x s_l x b x h, /t with SP).
    'torch_per_microbatch': torch.distributed.pipelining's stages (recipes.memory
    .torch_stage_buffers): a persistent receive buffer per micro-batch for the activations
    (ranks after the first) and for the gradients (ranks before the last), and each in-flight
    micro-batch's stage output kept for its backward."""
    cp_kv_repeated: bool = False
    """The model repeats its K/V heads to the query heads before SDPA (GQA expanded), so the
    ring moves and accumulates query-head K/V (time/cp_ring.py)."""
    grad_accum_pass_bytes: float = 0.0
    """Time model: bytes per parameter of the rank that a pass after every micro-batch's
    backward moves, adding each 16-bit .grad into the fp32 accumulation buffer (read 2 + 4,
    write 4: Nanotron's FP32GradientAccumulator.backward); on the critical path."""
    ddp_hook_accumulates: bool = False
    """Time model: at ZeRO-0 with dp > 1 the DDP communication hook adds each bucket's 16-bit
    gradients into the fp32 buffer during the last micro-batch's backward and the pass after
    that backward (grad_accum_pass_bytes) adds them again: one more such pass per step
    (Nanotron c252843 optim/gradient_accumulator.py: get_fp32_accum_hook's
    fp32_grad_buffer.add_(grad) per parameter, and _accumulate_grad's fp32_grad.add_ runs
    whenever _is_accumulation_sync_step is False, which __init__ sets and no_sync restores:
    it is never True)."""
    post_backward_pass_bytes: float = 0.0
    """Time model: bytes per parameter of the rank that the memory-bound passes between the
    gradient sync and the next step move over every fp32 gradient (Nanotron: clip_grad_norm's
    norms 4 and in-place scale 4 + 4, zero_grad 4), charged with the optimizer step."""
    master_copy_bytes: float = 0.0
    """Time model: bytes per parameter this rank updates of the fp32 master -> 16-bit weight
    copy after the optimizer step (read 4, write 2: Nanotron's gradient_accumulator.step)."""
    optimizer_pass_bytes: float = 0.0
    """Time model: bytes per parameter this rank updates that the framework's optimizer step and
    gradient clipping move beyond a fused AdamW's read of param, grad, m, v and write of param,
    m, v (time.step_time.OPTIMIZER_TRAFFIC, 28 B), charged with the optimizer step over memory
    bandwidth (llm-foundry: Composer's DecoupledAdamW, one eager op at a time per parameter,
    and FSDP1's clip_grad_norm_ over the gradient shard)."""
    tp_available: bool = True
    """Tensor parallelism available (llm-foundry's MPT of 2023 has none: a tp > 1 layout is
    refused, recipes.memory.recipe_problems)."""
    nccl_nvls: bool = True
    """Time model: the framework's runs leave NCCL's NVLink SHARP on (NCCL_NVLS_ENABLE's
    default, auto), so an all-reduce inside an NVSwitch-3 node may run as NVLS
    (time.comm.allreduce_seconds); False: its launch scripts set NCCL_NVLS_ENABLE=0 and every
    all-reduce is a ring."""
    fsdp_reduce_bytes: int = 4
    """Bytes per gradient element FSDP's reduce-scatter (and HSDP's replica all-reduce) sends:
    the reduce dtype of the framework's mixed-precision policy. 4: fp32 (torchtitan's and
    scaletrain's reduce_dtype, Composer's DEFAULT); 2 where the policy reduces in bf16
    (fms-fsdp's bfSixteen, torch FSDP1 MixedPrecision(reduce_dtype=bf16): `_reduce_grad` in
    torch/distributed/fsdp/_runtime_utils.py reduce-scatters the flat gradient, and all-reduces
    the shard across replicas, in that dtype). Read by step_time.comm_arguments
    (`CommInputs.reduce_bytes`) for ZeRO-2/3 plans only."""
    optimizer_state_bytes: float = 0.0
    """Bytes per element of the optimizer's state tensors (AdamW's m and v, SGD's momentum);
    0: fp32, as `memory.states.OPTIMIZER_BYTES` counts them. torchtune: 2 (torch's AdamW
    allocates its states zeros_like the parameter, and torchtune's parameters are bf16)."""
    lora: bool = False
    """The recipe plans LoRA / QLoRA runs (`PlanInput.lora`): the frozen base stored as
    `lora_base`, the other frozen parameters and the adapters at `weight_bytes`, gradients and
    optimizer states for the adapters only (recipes.lora); False: the recipe's framework has no
    adapter model here, and a LoRA plan is refused (recipes.memory.recipe_problems), never
    planned as full training."""
    ac_early_stop: bool = False
    """Time model, ac 'full': the framework's checkpoint stops its recompute once every tensor
    the backward saved is back (torch's non-reentrant checkpoint with its default early stop),
    so a dense block's MLP down projection, its TP reduction and the final residual add are not
    recomputed (time/ac_early_stop.py); False: the whole block is replayed (a reentrant
    checkpoint: torch's CheckpointFunction, Megatron's, DeepSpeed's; or a torch before 2.1; or
    a framework that turns the early stop off). A row's `layout.ac_early_stop` overrides it."""
    sdpa_kv_expanded: bool = False
    """Memory: the model expands K and V to the query heads before SDPA (GQA repeated), so the
    attention core saves K and V at the query heads (recipes.activations.recipe_layer_bytes,
    recipes.lora)."""
    grads_set_to_none: bool = False
    """The optimizer's zero_grad(set_to_none=True) after each step frees every gradient: none
    is alive during the forward, and the backward allocates each block's as it goes while it
    frees the activations of the blocks it has passed (without gradient accumulation). The
    forward/backward peak is then the larger of its start (activations, loss temporaries, no
    gradient) and its end (every gradient, the first block's activations), against the
    whole-buffer count of a framework that allocates its gradients up front
    (recipes.memory.recipe_rank_memory)."""
    loss_chunks: int = 0
    """'chunked_fp32' loss: the number of chunks the head's output is split into along the
    sequence, each upcast to fp32 on its own (torchtune's CEWithChunkedOutputLoss:
    num_output_chunks 8)."""
    grad_shard_step_bytes: float = 0.0
    """Bytes per sharded parameter of the reduce-scattered gradient shard the optimizer keeps
    apart from the full gradient buffer, alive from the last micro-batch's gradient sync through
    the step (Apex DistributedFusedAdam's grads_shard in grad_sync_dtype: recipes.dist_optim);
    0: the shard is a view of the buffer (Megatron-Core)."""
    fp32_embedding_grads: bool = False
    """The first pipeline stage's word (and position) embedding keeps an fp32 gradient buffer
    whatever the other parameters' gradient dtype (NeMo's MegatronGPTModel with Apex
    DistributedFusedAdam, with_fp32_embedding_grads: recipes.dist_optim)."""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    """Field -> where the value comes from."""

    def bucket_bytes(self, dp: int) -> float:
        """Bytes of one gradient reduction bucket."""
        elems = max(4e7, 1e6 * dp) if self.name in ("megatron", "nemo") else self.bucket_elements
        return elems * self.bucket_elem_bytes


FOREIGN_TIME_MODEL = "scaletrain"
"""The foreign recipes' matmul efficiency: the calibrated default. efficiency.py's generation
constants are published MFUs (Narayanan et al. 2021, the Megatron-LM README, torchtitan), which
already contain the pipeline bubble and exposed communication that the planner adds again, in
each paper's own FLOP convention (V100's 30% is Megatron 2019's): on the 88-run published
corpus they gave a step-time median |error| of 29% against 16% for the default
(benchmarks/recipe_layouts.py, 2026-11-25), and 24% against 14% once the attention kernels,
multi-rail rings and per-unit FSDP latency were in (the recipe column of
benchmarks/planner_vs_published.py, same day). Why it is worse (per row, same tree, recipe
column; flat -> generation): each constant is a whole step's achieved rate in its source's own
FLOP count, and the planner applies it to its matmul FLOPs only, then adds again what the
source's figure already contains.
- V100 0.30 (Shoeybi et al. 2019, 39 TFLOP/s): the 1.2B single-GPU run it comes from is in the
  corpus (megatron-v100-gpt2-1.2b-1g, 1288 ms); in the planner's FLOP count that run sustained
  39% of peak in model FLOPs, about 52% with its full recompute, so 0.30 over-predicts its own
  source by 74% (flat: 22%) and the BigScience V100 rows without tp by 48-81% (flat: -1 to
  +21%).
- H100 0.47 (Megatron-LM README) is MFU, model FLOPs over whole steps (bubble, exposed TP / DP
  communication, attention inside); the planner charges it on hardware FLOPs (recompute
  included), then adds its own bubble, exposed communication and attention-kernel time: NeMo
  rows +12 to +48% (flat: -15 to +3%), torchtitan Llama 3.1 70B, 405B without cp and H200
  +16 to +29% (flat: -5 to -12%). It helps only torchtitan's 8B H100 rows (-28 -> -19% at
  fsdp8), whose own shortfall is torchtitan's (see README).
- A100 0.52 (Narayanan et al. 2021, 163 TFLOP/s) counts recompute but is a 3072-GPU pipelined
  step's average, bubble and communication included: torchtitan A100 rows +3 to +25% (flat: -2
  to +18%).
Per framework, recipe column: deepspeed 10% -> 60%, megatron-lm 12% -> 64%, nemo 6% -> 28%,
torchtitan 17% -> 16%. So the double count is real: re-deriving each constant as a compute-only
efficiency needs its source run's bubble, exposed communication and attention share removed in
the planner's own FLOP count, which these sources do not state; until then they stay
selectable as 'generation'. The attention core's kernel terms
(attention_core.attention_seconds_per_token) apply under either."""

ALLOCATOR_SOURCE = (
    "PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp) is the same "
    "under every framework; 5% is scaletrain's measured reserved/allocated excess "
    "(memory.buffers.FRAGMENTATION)"
)
RUNTIME_CONTEXT_SOURCE = (
    "CUDA context + cuBLAS workspace + NCCL communicators outside the allocator, 0.75 GB "
    "measured with torch 2.x (memory.buffers.RUNTIME_CONTEXT_BYTES); the same runtime under every "
    "framework"
)
