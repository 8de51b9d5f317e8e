"""The Megatron-LM and NeMo recipes (registry.py holds them): what Megatron-Core's
GPT training allocates, read off NVIDIA/Megatron-LM (megatron/core, megatron/training) and
cited field by field in `Recipe.sources`; NeMo is Megatron-Core's memory terms with NeMo's
performance configurations' communication overlap. Torch-free.
"""

from __future__ import annotations

from dataclasses import replace

from ..memory.buffers import FRAGMENTATION, RUNTIME_CONTEXT_BYTES
from .schema import ALLOCATOR_SOURCE, FOREIGN_TIME_MODEL, RUNTIME_CONTEXT_SOURCE, Recipe

__all__ = ["MEGATRON", "NEMO"]

MEGATRON = Recipe(
    name="megatron",
    framework="Megatron-LM (megatron-core)",
    weight_bytes=2,
    master_bytes=4,
    grad_bytes=4,
    grad_buffer_full_under_zero1=True,
    shards_master=True,
    experts_shard_over_ep_group=True,
    step_grad_fp32_copy=False,
    autocast_weight_copy=False,
    zero_stages=(0, 1, 3),
    ddp_bucket="view",
    bucket_elements=4e7,
    bucket_elem_bytes=4,
    bucket_count=1,
    fsdp_prefetch_units=1,
    fsdp_prefetch_params=0,
    loss="vocab_parallel_fp32",
    activations="korthikanti",
    selective="core_attention",
    ac_modes=("none", "selective", "full"),
    full_ac_saves="layer_input",
    sp_with_tp=False,
    attention="model",
    dropout_masks=True,
    pp_split="even",
    pp_schedules=("1f1b", "interleaved"),
    cp=True,
    ddp_with_model_parallel=True,
    pp_with_zero=(0, 1, 3),
    fragmentation=FRAGMENTATION,
    cuda_context_bytes=RUNTIME_CONTEXT_BYTES,
    time_model=FOREIGN_TIME_MODEL,
    te_fp8_gemm_inputs=True,
    eager_elementwise=True,
    eager_block="mcore",
    sources={
        "ac_early_stop": "megatron/core/tensor_parallel/random.py CheckpointFunction, a "
        "torch.autograd.Function adapted from torch's reentrant checkpoint "
        "(transformer_block.py _checkpointed_forward): the whole layer replayed",
        "eager_block": "megatron/core/models/gpt/gpt_layer_specs.py (Transformer Engine "
        "spec), transformer/transformer_layer.py, attention.py, mlp.py, fusions/"
        "fused_bias_dropout.py, fused_bias_swiglu.py, fused_bias_gelu.py, models/common/"
        "embeddings/rope_utils.py at d98e8a6; TransformerEngine module/layernorm_linear.py, "
        "attention/rope.py, utils.py SplitAlongDim at d0067d0: the fused kernels' own "
        "traffic over memory bandwidth (elementwise.mcore_elementwise_bytes)",
        "te_fp8_gemm_inputs": "megatron/core/extensions/transformer_engine.py: TE "
        "LayerNormLinear / Linear / fused LayerNormMLP layers; TransformerEngine v1.8 "
        "transformer_engine/pytorch/module/layernorm_linear.py (ln_out_dtype uint8 under "
        "fp8, ln_out saved), layernorm_mlp.py (ln_out and the fp8 gelu_out saved, fc1_out "
        "in 16 bits), linear.py (saved_inputmat: the fp8 cast); fp8 primary weights "
        "(NeMo fp8_params, NeMo-Framework-Launcher conf/training/gpt3/mlperf.yaml; "
        "Megatron --fp8-param-gather) assumed, see Recipe.te_fp8_gemm_inputs",
        "weight_bytes": "megatron/core/transformer/module.py Float16Module: the model's "
        "weights are bf16/fp16",
        "master_bytes": "megatron/core/optimizer/optimizer.py "
        "Float16OptimizerWithFloat16Params / distrib_optimizer.py "
        "DistributedOptimizer: fp32 main params",
        "grad_bytes": "megatron/core/distributed/param_and_grad_buffer.py "
        "_ParamAndGradBuffer: contiguous main_grad buffer in fp32 "
        "(DistributedDataParallelConfig.grad_reduce_in_fp32; "
        "megatron/training/arguments.py turns "
        "accumulate_allreduce_grads_in_fp32 on for bf16)",
        "grad_buffer_full_under_zero1": "distrib_optimizer.py: grads are reduce-scattered "
        "inside the full grad buffer, which stays "
        "allocated; 6 + 12/d bytes/param "
        "(megatron/training/theoretical_memory_usage.py "
        "compute_weight_and_optimizer_memory; "
        "docs distrib_optimizer.md table)",
        "experts_shard_over_ep_group": "megatron/core/optimizer/__init__.py "
        "get_megatron_optimizer (at d98e8a6): the expert-parallel params "
        "(_get_param_groups_and_buffers, filter_fn is_expert_parallel, buffer_name "
        "'expert_parallel_buffers') get their own distributed optimizer over "
        "intra_expt_dp_group, the dense ones over intra_dp_cp_group; "
        "distributed/distributed_data_parallel.py DistributedDataParallel.__init__ puts "
        "the expert buffers on intra_expt_dp_group; parallel_state.py "
        "initialize_model_parallel: expert_data_parallel_size = world_size // "
        "(expert_tensor_parallel_size * expert_model_parallel_size * pp), "
        "expert_tensor_parallel_size defaulting to tp, i.e. dp * cp / ep ranks; "
        "Megatron-FSDP (zero 3) likewise: distributed/fsdp/mcore_fsdp_adapter.py "
        "_init_dist_index builds the experts' mesh on get_expert_data_parallel_group()",
        "shards_master": "distrib_optimizer.py DistributedOptimizer: fp32 main params and "
        "Adam states of this rank's shard only",
        "zero_stages": "0 = DDP, 1 = --use-distributed-optimizer, 3 = Megatron-FSDP / "
        "--use-torch-fsdp2 (megatron/core/distributed/); no separate "
        "ZeRO-2 mode",
        "ddp_bucket": "param_and_grad_buffer.py: buckets are views into the grad buffer "
        "(no copy); bucket_size = max(40000000, 1000000 x dp) elements "
        "(distributed_data_parallel.py DistributedDataParallel.__init__)",
        "loss": "megatron/core/tensor_parallel/cross_entropy.py "
        "VocabParallelCrossEntropy.calculate_logits_max: logits.float(); "
        "_VocabParallelCrossEntropy saves exp_logits (computed in place) for "
        "backward, V/tp per rank; theoretical_memory_usage.py counts "
        "4 x s x b x h x (1 + V/h) for the output layer and loss",
        "activations": "Korthikanti et al. 2022 (arXiv 2205.05198) Table 2: "
        "sbh(34 + 5as/h) per layer (/t with SP; 10 + 24/t without SP); "
        "megatron/training/theoretical_memory_usage.py "
        "compute_activation_memory uses sbh(18 + 4 f/h)",
        "selective": "megatron/core/transformer/transformer_block.py "
        "(recompute_granularity='selective' recomputes core_attn): drops "
        "the 5as^2b/t term; with flash/TE attention that term is absent "
        "already",
        "full_ac_saves": "transformer_block.py _checkpointed_forward "
        "(recompute_method uniform, 1 layer): the layer input",
        "dropout_masks": "megatron/training/arguments.py: --hidden-dropout and "
        "--attention-dropout default 0.1 (GPT recipes keep them; "
        "Llama recipes set 0)",
        "pp_split": "megatron/core/transformer/transformer_block.py "
        "get_num_layers_to_build: num_layers / pp per stage",
        "pp_schedules": "megatron/core/pipeline_parallel/schedules.py "
        "get_forward_backward_func: no pipelining, 1F1B "
        "(forward_backward_pipelining_without_interleaving), "
        "interleaved (..._with_interleaving); no GPipe or zero-bubble "
        "order",
        "optimizer": "megatron/core/optimizer/__init__.py get_megatron_optimizer: "
        "Adam (TE FusedAdam / apex) with fp32 exp_avg and exp_avg_sq",
        "cp": "megatron/core/parallel_state.py context_parallel_size (ring attention in "
        "Transformer Engine); composes with pp",
        "attention": "megatron/core/transformer: TEDotProductAttention (flash / fused "
        "attention by --attention-backend auto): no s x s scores kept unless "
        "the model asks for the unfused core",
        "fragmentation": ALLOCATOR_SOURCE,
        "cuda_context_bytes": RUNTIME_CONTEXT_SOURCE,
        "nccl_nvls": "NCCL's default (NCCL_NVLS_ENABLE = 2, auto: nccl src/transport/nvls.cc "
        "ncclNvlsInit); Megatron-LM sets no NCCL_NVLS_ENABLE in its training scripts (its "
        "NCCL user-buffer allocator, megatron/core/nccl_allocator.py init, sets it to 1)",
    },
)


NEMO = replace(
    MEGATRON,
    name="nemo",
    framework="NeMo (Megatron-Core, NeMo's performance configs)",
    nccl_nvls=False,
    sources={
        **MEGATRON.sources,
        "*": "NeMo trains Megatron-Core's GPTModel with its DistributedDataParallel and "
        "distributed optimizer: every memory term is megatron's (a NeMo-specific "
        "memory term, e.g. Apex distributed_fused_adam's gradient shard, is not "
        "modelled here); what differs is the communication NeMo's performance "
        "configurations overlap (efficiency.COMM_OVERLAP['nemo'])",
        "comm_overlap": "NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/"
        "gpt3/175b_fp8_performance.yaml (24.07): ub_tp_comm_overlap, "
        "overlap_p2p_comm, optim.overlap_grad_sync / overlap_param_sync; "
        "NeMo docs features/optimizations/communication_overlap.rst",
        "attention": "NeMo's GPT / Llama configs run Transformer Engine "
        "DotProductAttention (fused / flash by NVTE_FUSED_ATTN)",
        "nccl_nvls": "NVIDIA/NeMo scripts/performance/executors.py slurm_executor "
        "PERF_ENV_VARS: NCCL_NVLS_ENABLE '0' ('Disable NVLink SHARP to save memory'; "
        "also scripts/llm/pretraining.py), at 7cc8bbb",
    },
)
"""NeMo: Megatron-Core's model states, activations and buffers (megatron's memory terms,
unchanged) with the communication overlap of NeMo's performance configurations, which the
published NeMo runs use (efficiency.COMM_OVERLAP['nemo'])."""
