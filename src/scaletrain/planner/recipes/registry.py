"""Framework recipes: what a training framework allocates and does, as the planner needs it.

A `Recipe` names, per framework, the bytes of every model state, what each activation
checkpointing mode keeps, how the loss treats the logits, the communication buffers, the
allocator's overhead and the layouts it can run. `scaletrain` is the default and is exactly what
scaletrain's trainer allocates (its memory terms stay in `planner.memory`, kept
exact against the dry-run); the other recipes are read off each framework's source or
documentation, cited field by field in `Recipe.sources` (file and function in the framework's
repository, or a documentation page). `memory.py` turns a recipe into memory terms;
`time/efficiency.py` is the time model the foreign recipes use. This module is the registry of
recipes (Megatron-LM's and NeMo's are defined in `megatron.py`); the `Recipe` dataclass
(its fields and what each means) and the constants the recipes share are `schema.py`.
`deepspeed-0.4` is DeepSpeed as it was in 2021 (the big-science branch, 0.4.2, under torch 1.x):
today's `deepspeed` but for ZeRO-1's post-backward copies (`zero1_flats.py`).
`deepspeed-bigscience-2022` is `deepspeed` under BigScience's Megatron-DeepSpeed of February
2022, whose weight-decay group was split in two (Recipe.wd_group_halved).
`deepspeed-hf` is `deepspeed` around a Hugging Face transformers GPT-2 (the Trainer's
DeepSpeed integration): its eager block's elementwise kernels and unfused score kernels.
`automodel` is NeMo AutoModel: torchtitan's FSDP2 / pipelining / expert-sharding terms with bf16
resident parameters, gradients and torch Adam states, its eager MaskedCrossEntropy and
torchtune's LoRA terms (its PEFT path freezes a bf16 base the same way).

Torch-free. Sources were read at these public repositories: NVIDIA/Megatron-LM (megatron/core,
megatron/training), microsoft/DeepSpeed (deepspeed/runtime), pytorch/torchtitan (torchtitan/,
docs/), huggingface/nanotron (src/nanotron), mosaicml/llm-foundry (llmfoundry/, scripts/train/) and
mosaicml/composer (composer/utils/parallelism.py, composer/distributed/), NVIDIA-NeMo/Automodel
(nemo_automodel/, examples/llm_benchmark/, docs/guides/).
"""

from __future__ import annotations

import dataclasses

from scaletrain.config import ConfigError
from scaletrain.config.strict import did_you_mean

from ..memory.buffers import FRAGMENTATION, RUNTIME_CONTEXT_BYTES
from .megatron import MEGATRON, NEMO
from .schema import (
    ALLOCATOR_SOURCE,
    FOREIGN_TIME_MODEL,
    RUNTIME_CONTEXT_SOURCE,
    Recipe,
)

__all__ = [
    "RECIPES",
    "TORCH_EARLY_STOP",
    "recipe_named",
]


TORCH_EARLY_STOP = (
    "torch/utils/checkpoint.py _enable_checkpoint_early_stop = True (the non-reentrant "
    "checkpoint stops its recompute once every saved tensor is back; the default since "
    "pytorch/pytorch PR 96866, 2023-03-15, torch 2.1)"
)
"""The torch default every non-reentrant checkpoint without an early-stop setting runs."""


RECIPES: dict[str, Recipe] = {
    "scaletrain": Recipe(
        name="scaletrain",
        framework="scaletrain",
        weight_bytes=4,
        master_bytes=0,
        grad_bytes=4,
        grad_buffer_full_under_zero1=True,
        shards_master=False,
        step_grad_fp32_copy=False,
        autocast_weight_copy=True,
        zero_stages=(0, 1, 2, 3),
        ddp_bucket="copy",
        bucket_elements=25 * 2**20 / 4,
        bucket_elem_bytes=4,
        bucket_count=1,
        fsdp_prefetch_units=1,
        fsdp_prefetch_params=0,
        loss="fused",
        activations="scaletrain",
        selective="scaletrain",
        ac_modes=("none", "selective", "full"),
        full_ac_saves="layer_input",
        ac_early_stop=True,
        sp_with_tp=False,
        attention="model",
        dropout_masks=False,
        pp_split="balanced",
        pp_schedules=("gpipe", "1f1b", "interleaved", "zero-bubble"),
        cp=True,
        ddp_with_model_parallel=True,
        pp_with_zero=(0, 1, 2, 3),
        fragmentation=FRAGMENTATION,
        cuda_context_bytes=RUNTIME_CONTEXT_BYTES,
        time_model="scaletrain",
        sources={
            "ac_early_stop": "parallel/ac.py wraps each block in torch's non-reentrant "
            "checkpoint (use_reentrant=False): " + TORCH_EARLY_STOP + "; measured by the "
            "dry-run's FLOP counter (planner time/flops.py counted_flops_per_token)",
            "*": "scaletrain's own trainer: planner/memory/ (rank.py and its moments), kept exact "
            "against the fake-tensor dry-run (benchmarks/results/planner_accuracy.md)",
            "weight_bytes": "fp32 parameters, 16-bit casts under autocast / FSDP2 "
            "MixedPrecisionPolicy (memory.states.CONVENTIONS 'scaletrain')",
            "ddp_bucket": "parallel/data_parallel.py: torch DDP with "
            "gradient_as_bucket_view=False (memory.buffers.buffer_terms ddp_buckets)",
            "loss": "models/loss.py fused chunked linear + cross-entropy",
            "activations": "memory.activations.layer_activation_bytes: RMSNorm over a 16-bit "
            "stream saves x and an fp32 rstd per token, 2 B per element (models/norms.py; "
            "benchmarks/results/activation_ledger.md, llama-block bf16 params ac=none: "
            "2,758,656 B measured = analytic, was 3,282,944 B with rms_norm(x.float())); "
            "over an fp32 stream x and the fp32 normalized output, 8 B",
        },
    ),
    "megatron": MEGATRON,
    "deepspeed": Recipe(
        name="deepspeed",
        framework="DeepSpeed (ZeRO)",
        weight_bytes=2,
        master_bytes=4,
        grad_bytes=2,
        grad_buffer_full_under_zero1=True,
        shards_master=True,
        zero_step_check_copies=True,
        step_grad_fp32_copy=True,
        autocast_weight_copy=False,
        zero_stages=(0, 1, 2, 3),
        ddp_bucket="ipg",
        bucket_elements=5e8,
        bucket_elem_bytes=2,
        bucket_count=1,
        fsdp_prefetch_units=0,
        fsdp_prefetch_params=5e7,
        loss="vocab_parallel_fp32",
        activations="korthikanti",
        selective="core_attention",
        ac_modes=("none", "selective", "full"),
        full_ac_saves="layer_input",
        sp_with_tp=False,
        attention="naive",
        dropout_masks=True,
        pp_split="even",
        pp_schedules=("1f1b",),
        cp=True,
        ddp_with_model_parallel=True,
        pp_with_zero=(0, 1),
        fragmentation=FRAGMENTATION,
        cuda_context_bytes=RUNTIME_CONTEXT_BYTES,
        time_model=FOREIGN_TIME_MODEL,
        pipe_output_buffers=2,
        zero3_module_fetch=True,
        bf16_optimizer=True,
        lora=True,
        sources={
            "ac_early_stop": "deepspeed/runtime/activation_checkpointing/checkpointing.py "
            "CheckpointFunction, a torch.autograd.Function: the reentrant checkpoint, the "
            "whole layer replayed",
            "lora": "Hugging Face PEFT over DeepSpeed (peft docs/source/accelerate/deepspeed.md at "
            "09802c1b, the ZeRO-3 LoRA and QLoRA sections: accelerate's DeepSpeed plugin, "
            "zero3_init_flag true, mixed_precision bf16, the HF Trainer via TRL's SFTTrainer): "
            "deepspeed.zero.Init partitions every parameter, frozen or not, so the frozen base "
            "is sharded at ZeRO-3 like a trained one, and under bf16 in bf16 whatever the "
            "checkpoint's dtype (partition_parameters.py zero_wrapper_for_fp_tensor_constructor "
            "casts every floating tensor zero.Init builds to its dtype; engine.py "
            "_configure_distributed_model calls module.bfloat16() when bf16 is enabled): "
            "lora_base 'auto' is weight_bytes; "
            "transformers trainer.py "
            "Trainer.create_optimizer hands the optimizer only parameters with requires_grad "
            "(PEFT freezes the base), and deepspeed/runtime/zero/stage3.py "
            "DeepSpeedZeroOptimizer_Stage3._get_trainable_parameter_groups keeps only "
            "requires_grad ones, so the fp32 master partitions, Adam states and gradient "
            "partitions exist for the adapters only; QLoRA: bitsandbytes 4-bit weights with "
            "bnb_4bit_quant_storage bfloat16 (8 codes per bf16 storage element, the page's "
            "'32/4 = 8') so zero.Init can partition them as bf16 tensors (recipes.lora)",
            "bf16_optimizer": "deepspeed/runtime/bf16_optimizer.py BF16_Optimizer (read at "
            "15293139f, 2022-02-28, an ancestor of the olruwase/bf16-updates commit ab61edb02 "
            "BigScience's chronicles-prequel.md names, and at 38327e07f): "
            "__init__ allocates fp32_groups_gradients_flat = zeros_like(bf16_groups_flat, "
            "float32) for the whole flat group on every dp rank (the step's fp32 partition is a "
            "narrow() of it; the fp32 master and Adam states are the dp partition); "
            "update_hp_grads(clear_lp_grads=False) from pipe/engine.py _exec_backward_pass keeps "
            "every bf16 .grad until the next backward; engine.py allreduce_bucket casts the flat "
            "fp32 buffer to communication_data_type (bf16) to all-reduce it; BigScience "
            "train/tr11-176B-ml/README.md 'Deepspeed config' (ZERO_STAGE=0: 'BF16_Optimizer "
            "implements its own ZeRO Stage 1'; 'doesn't shard the static fp32 buffer ... 4 "
            "bytes * params of additional memory'); engine.py _do_optimizer_sanity_check: "
            "BFLOAT16 for bf16 at ZeRO-1 with fp32 grad_accum_dtype (recipes.memory)",
            "zero3_module_fetch": "deepspeed/runtime/zero/partitioned_param_coordinator.py "
            "fetch_sub_module (one all_gather_coalesced per leaf module, prefetch capped by "
            "stage3_prefetch_bucket_size 5e7), stage3.py __reduce_and_partition_ipg_grads "
            "(reduce_bucket_size 5e8, engine.communication_data_type bf16 under bf16); the "
            "gathers and reduce-scatters share the dp process group; exposed per DeepSpeed "
            "issues #1174 and #5047 and DeepSpeedExamples benchmarks/deepcompile "
            "(time/zero3_fetch.py)",
            "pipe_output_buffers": "deepspeed/runtime/pipe/engine.py _exec_forward_pass: "
            "pipe_buffers['outputs'][buffer_id] = outputs (the last "
            "stage's logits, before the loss); _exec_backward_pass "
            "returns early on the last stage ('just runs backward on "
            "the loss') without clearing that buffer (2021 and today); "
            "pipe/schedule.py TrainSchedule.num_pipe_buffers: max(2, "
            "...) = 2 on the last stage. Megatron-DeepSpeed builds "
            "GPTModelPipe (a PipelineModule, so this engine) at pp = 1 "
            "too unless --no-pipeline-parallel. Under fp16 its last "
            "spec is float16_to_fp32 (megatron/model/gpt_model.py), so "
            "the buffers hold fp32 logits; mpu/cross_entropy.py "
            "_VocabParallelCrossEntropy softmaxes the current one in "
            "place and writes its gradient in place: 2 x 2 B counted = "
            "the other buffer's 4 B beyond the loss's saved 4 B. The "
            "1B3 benchmarks (bigscience experiments/tr3m-1B3.md, "
            "written 2021-12-01) ran Megatron-DeepSpeed of that day (06cfbec7), whose "
            "mpu/cross_entropy.py works in place (unchanged since "
            "2020-10-20, no clone of the logits at the default "
            "branch's head either); a clone would save a 4 B copy more",
            "weight_bytes": "deepspeed/runtime/zero/stage_1_and_2.py "
            "DeepSpeedZeroOptimizer: bit16_groups (the model's 16-bit "
            "params); stage3.py DeepSpeedZeroOptimizer_Stage3: 16-bit "
            "partitions",
            "master_bytes": "stage_1_and_2.py single_partition_of_fp32_groups (fp32 master "
            "partition per rank); stage3.py fp32_partitioned_groups_flat",
            "grad_bytes": "stage_1_and_2.py averaged_gradients in the param dtype "
            "(partitioned from stage 2); estimate_zero2_model_states_mem_needs:"
            " 4 x P + 16 x P / N on the GPU; stage3.py "
            "estimate_zero3_model_states_mem_needs: largest layer x 4 + "
            "18 x P / N",
            "step_grad_fp32_copy": "stage_1_and_2.py step(): single_grad_partition is the "
            "rank's gradient converted to the fp32 master dtype",
            "zero_step_check_copies": "stage_1_and_2.py step(): check_overflow -> "
            "has_overflow_partitioned_grads_serial -> _has_inf_or_nan (x.float() of each "
            "gradient slice of the partition) and get_grad_norm_direct (g.data.double() of "
            "each slice), one slice at a time; read at 2151c787a (2022-02-18, 0.6.0, master "
            "on 2022-02-25), c7f3bc51c (big-science, 0.4.2, stage2.py) and 38327e07f "
            "(recipes.zero1_flats.step_check_copies)",
            "ddp_bucket": "deepspeed/runtime/zero/config.py DeepSpeedZeroConfig: "
            "reduce_bucket_size default 5e8 elements, allgather_bucket_size "
            "5e8; stage_1_and_2.py ipg_buffer in the param dtype (contiguous"
            "_gradients). DeepSpeed's big-science branch (c7f3bc51c, "
            "2021-08-30), which the BigScience 1B3 rows ran, forces "
            "contiguous_gradients off at stage 1 (engine.py "
            "_configure_zero_optimizer): no ipg_buffer, stage2.py "
            "reduce_ipg_grads flattens <= reduce_bucket_size elements at "
            "the pipeline's ReduceGrads only (benchmarks/README.md, issue "
            "#20); master honours contiguous_gradients at stage 1",
            "fsdp_prefetch_params": "zero/config.py stage3_prefetch_bucket_size default 5e7",
            "loss": "Megatron-DeepSpeed runs Megatron's vocab-parallel cross-entropy "
            "(megatron/core/tensor_parallel/cross_entropy.py)",
            "activations": "Megatron-DeepSpeed's GPT model: Korthikanti et al. 2022 Table 2",
            "pp_schedules": "deepspeed/runtime/pipe/schedule.py TrainSchedule (1F1B only)",
            "pp_with_zero": "deepspeed/runtime/pipe/engine.py PipelineEngine.__init__: "
            "'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'",
            "cp": "DeepSpeed-Ulysses sequence parallelism (deepspeed/sequence/layer.py "
            "DistributedAttention)",
            "optimizer": "deepspeed/ops/adam FusedAdam / DeepSpeedCPUAdam on the fp32 "
            "partition: fp32 exp_avg and exp_avg_sq",
            "zero_stages": "deepspeed/runtime/zero/config.py DeepSpeedZeroConfig.stage 0-3",
            "selective": "Megatron-DeepSpeed --recompute-granularity selective (Megatron's "
            "core-attention recompute)",
            "full_ac_saves": "deepspeed/runtime/activation_checkpointing/checkpointing.py "
            "checkpoint(): the layer input (partition_activations splits "
            "it over tp)",
            "attention": "Megatron-DeepSpeed megatron/arguments.py: --use-flash-attn is "
            "store_true (off by default); the fused scale-mask-softmax "
            "(megatron/model/fused_softmax.py) keeps the s x s probabilities",
            "fragmentation": ALLOCATOR_SOURCE,
            "cuda_context_bytes": RUNTIME_CONTEXT_SOURCE,
        },
    ),
    "torchtitan": Recipe(
        name="torchtitan",
        framework="torchtitan (FSDP2)",
        weight_bytes=4,
        master_bytes=0,
        grad_bytes=4,
        grad_buffer_full_under_zero1=False,
        shards_master=False,
        step_grad_fp32_copy=False,
        autocast_weight_copy=True,
        zero_stages=(0, 2, 3),
        ddp_bucket="copy",
        bucket_elements=25 * 2**20 / 4,
        bucket_elem_bytes=4,
        bucket_count=1,
        fsdp_prefetch_units=1,
        fsdp_prefetch_params=0,
        loss="materialized_fp32",
        activations="sdpa_bf16",
        selective="torchtitan_op",
        ac_modes=("none", "selective", "full"),
        full_ac_saves="layer_input",
        ac_early_stop=True,
        sp_with_tp=True,
        attention="model",
        dropout_masks=False,
        pp_split="balanced",
        pp_schedules=("gpipe", "1f1b", "interleaved", "zero-bubble"),
        cp=True,
        ddp_with_model_parallel=False,
        pp_with_zero=(0, 2, 3),
        fragmentation=FRAGMENTATION,
        cuda_context_bytes=RUNTIME_CONTEXT_BYTES,
        time_model=FOREIGN_TIME_MODEL,
        pp_fsdp_unsharded=True,
        experts_shard_over_ep_group=True,
        loss_compiles=True,
        chunked_loss_tokens=8192,
        eager_elementwise=True,
        moe_block="torchtitan",
        fsdp2_copies=True,
        fsdp2_ends_exposed=True,
        optimizer_pass_bytes=12.0,
        cp_ring="torch_allgather",
        cp_kv_repeated=True,
        pp_stage_buffers="torch_per_microbatch",
        sources={
            "ac_early_stop": "torchtitan/parallelisms/parallelize_llama.py (041336434, "
            "2024-04-24) and torchtitan/distributed/activation_checkpoint.py "
            "_apply_ac_to_transformer_block mode 'full': ptd_checkpoint_wrapper(module, "
            "preserve_rng_state=False), torch's NO_REENTRANT checkpoint with no early-stop "
            "setting, so torch's default: " + TORCH_EARLY_STOP + "; from 25413d224 (PR #1580, "
            "2025-08-29) it passes ActivationCheckpoint.early_stop, default False (a row's "
            "layout.ac_early_stop = false)",
            "pp_stage_buffers": "torch/distributed/pipelining/stage.py (torchtitan builds "
            "PipelineStage, torchtitan/parallelisms/pipeline_llama.py at 9dec370): "
            "PipelineStage._prepare_forward_infra and _PipelineStageBase."
            "_prepare_backward_infra allocate an activation and a gradient receive "
            "buffer per micro-batch; forward_one_chunk keeps each output in fwd_cache "
            "until its backward",
            "cp_ring": "torch/distributed/tensor/experimental/_attention.py "
            "_templated_ring_attention(_backward), _AllGatherRotater, _SDPAMerger "
            "(convert_to_f32, enable_load_balance True); torchtitan config_manager.py at "
            "9dec370: --experimental.context_parallel_rotate_method default 'allgather'",
            "cp_kv_repeated": "torchtitan/models/llama/model.py at 9dec370 Attention.forward: "
            "repeat_kv(xk / xv, n_rep) before F.scaled_dot_product_attention",
            "eager_elementwise": "torchtitan/models/llama3/model.py: RMSNorm._norm on "
            "x.float(), apply_rotary_emb via view_as_complex, "
            "F.silu(w1(x)) * w3(x), residual adds, each a separate "
            "kernel without training.compile; "
            "benchmarks/llama3_h100_202412_torchtitan.md Table 1: "
            "compile alone 5,762 -> 6,667 TPS/GPU; under compile the fused kernels' "
            "traffic (parallelize_llama.py apply_compile at 9dec370: per-block "
            "torch.compile; elementwise.compiled_elementwise_bytes)",
            "moe_block": "torchtitan at 022f885: models/moe/moe.py MoE.forward (torch.gather "
            "of the routed rows, out.scatter_add of the expert outputs), _run_experts_grouped_mm "
            "(F.silu, the gate product), distributed/deepep/utils.py permute / unpermute "
            "(index_select, zeros + scatter_add_), models/qwen3/model/model.py (nn.RMSNorm "
            "attention_norm, ffn_norm, q_norm, k_norm); eager under AC + compile: "
            "models/llama4/infra/parallelize.py apply_compile (fullgraph=False for MoE blocks) "
            "and pytorch PR #193143 (a graph break inside a checkpointed function makes Dynamo "
            "skip the frame)",
            "optimizer_pass_bytes": "torchtitan train.py at 54ef422 clips every step "
            "(dist_utils.clip_grad_norm_, foreach=True; training.max_norm 1.0 in "
            "train_configs/llama3_8b.toml): torchtitan/distributed/utils.py clip_grad_norm_ "
            "-> torch.nn.utils.get_total_norm (reads each sharded fp32 gradient: 4) and "
            "clip_grads_with_norm_ (scales it in place: 4 + 4) = 12 B per parameter the rank "
            "updates; the norm's DTensor full_tensor() all-reduce is one scalar (ignored)",
            "fsdp2_ends_exposed": "torch/distributed/fsdp/_fully_shard/_fsdp_state.py "
            "(pytorch/pytorch 1fd469d): FSDPState._pre_forward gathers a unit when it runs "
            "(nothing before the first); _root_post_backward_final_callback runs the "
            "post-backward (reduce-scatter) of the units whose inputs need no gradient (the "
            "root / embedding unit) and makes the current stream wait on the last "
            "reduce-scatter's event; units: torchtitan apply_fsdp (layout.fsdp_ends)",
            "fsdp2_copies": "torchtitan parallelize_llama.py apply_fsdp at 9dec370: "
            "fully_shard per block and the root; torch 2.13 _fully_shard/"
            "_fsdp_collectives.py foreach_all_gather_copy_out (split_with_sizes_copy on "
            "the current stream) and foreach_reduce (chunk_cat copy-in before the "
            "reduce-scatter stream)",
            "experts_shard_over_ep_group": "torchtitan "
            "torchtitan/models/llama4/infra/parallelize.py apply_fsdp (qwen3 and deepseek_v3 "
            "reuse it; read at 022f885): fully_shard(transformer_block.moe.experts) on "
            "dp_mod_ep_mesh, the 'dp_shard_mod_ep' mesh of dp_shard * cp / ep ranks "
            "(torchtitan/distributed/parallel_dims.py ParallelDims._build_mesh_with_ep), after "
            "ExpertParallel split the experts ep ways (distributed/expert_parallel.py "
            "_partition_fn: Shard(0))",
            "pp_fsdp_unsharded": "torchtitan parallelize apply_fsdp: 'For PP, do not reshard "
            "after forward to avoid per-microbatch all-gathers' "
            "(reshard_after_forward = not pp_enabled; at 9dec370 "
            "torchtitan/parallelisms/parallelize_llama.py too); torch "
            "torch/distributed/pipelining/stage.py "
            "backward_maybe_with_nosync: set_reshard_after_backward(False)"
            " and set_requires_gradient_sync(False) for every micro-batch"
            " but the last; fsdp/_fully_shard/_fsdp_param.py "
            "to_accumulated_grad_if_needed: the unsharded gradient is "
            "upcast to reduce_dtype (fp32) and accumulated",
            "loss_compiles": "torchtitan/components/loss.py build_cross_entropy_loss: "
            "torch.compile(loss_fn) when training.compile (from bbb1b61, "
            "2025-04-02; later compile.components 'loss'); train.py at 9dec370 "
            "(Dec 2024) left it uncompiled ('compiling loss function causes "
            "CUDA errors'). Saved tensors measured with torch 2.13: eager "
            "keeps the fp32 log-softmax (4 B/logit), compiled keeps the bf16 "
            "input (2 B/logit) and two fp32 values per token",
            "chunked_loss_tokens": "torchtitan/components/loss.py at 94609ad "
            "ChunkedLossWrapper.Config.chunk_len = 8192 ('Maximum number of tokens in each "
            "loss chunk'; docs/chunked_loss.md: 'The default is 8,192 tokens'). Not the "
            "framework-wide loss: Trainer.Config.loss defaults to BaseLoss.Config and each "
            "model's config_registry.py picks it (qwen3_14b: ChunkedLossWrapper.Config at "
            "b5bcd76, 2026-08); older torchtitan computed the whole logits "
            "(cross_entropy_loss), so a run states chunked_loss",
            "weight_bytes": "torchtitan/models/llama3/infra/parallelize.py apply_fsdp: "
            "fp32 sharded parameters, MixedPrecisionPolicy(param_dtype="
            "bf16, reduce_dtype=fp32) (docs/fsdp.md)",
            "grad_bytes": "FSDP2 sharded fp32 gradients (reduce_dtype fp32)",
            "zero_stages": "apply_fsdp reshard_after_forward (True: ZeRO-3, False: ZeRO-2); "
            "apply_ddp for pure data parallel; no ZeRO-1",
            "fsdp_prefetch_units": "FSDP2 implicit prefetch of the next unit; the last "
            "block and the root are not resharded after forward "
            "(apply_fsdp before 83e6941, 2025-07-28; from it the embedding and the "
            "final norm + head are their own units: PlanInput.fsdp_ends 'own_units', "
            "recipes/memory.py fsdp_end_units)",
            "loss": "torchtitan/components/loss.py cross_entropy_loss: "
            "F.cross_entropy(pred.flatten(0, 1).float(), labels); train.py deletes "
            "pred before backward; under TP, loss_parallel's vocab-parallel ops "
            "(torch/distributed/tensor/parallel/loss.py _log_softmax: e + 12 B per "
            "local logit at the forward; _nll_loss_and_log_softmax_backward: zeros_like, "
            "exp and their sum beside the saved fp32 output, 16 B at the backward)",
            "activations": "torchtitan/models/llama3/model.py: SDPA attention, RMSNorm on "
            "x.float(), SwiGLU; bf16 stream under FSDP2 mixed precision",
            "selective": "parallelize.py _apply_ac_to_transformer_block (op SAC): saves "
            "aten.mm outputs except every second mm, SDPA outputs, "
            "reduce_scatter and max",
            "sp_with_tp": "parallelize.py apply_tp: SequenceParallel norms, loss_parallel",
            "ddp_with_model_parallel": "parallelize.py: 'DDP has not supported > 1D parallelism'",
            "pp_schedules": "torchtitan/distributed/pipeline_parallel.py: GPipe, 1F1B, "
            "Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble",
            "master_bytes": "no separate master copy: the sharded parameters are fp32 and "
            "FSDP2 casts them to bf16 at all-gather",
            "optimizer": "torchtitan/components/optimizer.py build_optimizers: torch.optim."
            "AdamW on the fp32 DTensor shards (exp_avg, exp_avg_sq fp32)",
            "ddp_bucket": "parallelize.py apply_ddp: torch's replicate/DDP, default "
            "bucket_cap_mb=25 copy buckets (torch/nn/parallel/distributed.py)",
            "full_ac_saves": "parallelize.py _apply_ac_to_transformer_block mode 'full': "
            "ptd_checkpoint_wrapper around each block (its input kept)",
            "cp": "torchtitan/distributed/utils.py create_context_parallel_ctx (ring "
            "attention over SDPA); FSDP mesh includes cp",
            "attention": "torchtitan/models/llama3/model.py Attention: "
            "F.scaled_dot_product_attention (flash / memory-efficient kernels)",
            "fragmentation": ALLOCATOR_SOURCE,
            "cuda_context_bytes": RUNTIME_CONTEXT_SOURCE,
        },
    ),
    "nanotron": Recipe(
        name="nanotron",
        framework="Nanotron",
        weight_bytes=2,
        master_bytes=4,
        grad_bytes=4,
        grad_buffer_full_under_zero1=True,
        shards_master=True,
        step_grad_fp32_copy=False,
        autocast_weight_copy=False,
        zero_stages=(0, 1),
        ddp_bucket="view",
        bucket_elements=25 * 2**20 / 4,
        bucket_elem_bytes=4,
        bucket_count=1,
        fsdp_prefetch_units=0,
        fsdp_prefetch_params=0,
        loss="vocab_parallel_fp32",
        activations="nanotron",
        selective="core_attention",
        ac_modes=("none", "full"),
        full_ac_saves="layer_input",
        sp_with_tp=False,
        attention="model",
        dropout_masks=False,
        pp_split="compute_cost",
        pp_schedules=("gpipe", "1f1b"),
        cp=False,
        ddp_with_model_parallel=True,
        pp_with_zero=(0, 1),
        fragmentation=FRAGMENTATION,
        cuda_context_bytes=RUNTIME_CONTEXT_BYTES,
        time_model=FOREIGN_TIME_MODEL,
        ddp_reducer_copy_bytes=2.0,
        param_grads_until_backward_end=True,
        fused_rmsnorm=True,
        sp_linear_saves_shard=True,
        loss_casts_logits=True,
        zero1_gather_flat_copies=True,
        zero1_gather_host_copies=True,
        tp_comm="async_linears",
        single_hw_queue=True,
        zero1_grad_sync="allreduce_after_backward",
        tied_grad_sync="allreduce_after_backward",
        grad_accum_pass_bytes=10.0,
        ddp_hook_accumulates=True,
        post_backward_pass_bytes=16.0,
        master_copy_bytes=6.0,
        sources={
            "ac_early_stop": "nanotron's decoder layers' _checkpointed_forward (recompute_layer): "
            "torch.utils.checkpoint.CheckpointFunction.apply (the reentrant checkpoint: the "
            "forward under no_grad, the whole layer replayed)",
            "tp_comm": "scripts/scaling_benchmarks.py create_config: tp_mode REDUCE_SCATTER "
            "with tp_linear_async_communication = True (the benchmark runs'); "
            "src/nanotron/parallel/tensor_parallel/functional.py "
            "_ColumnLinearAsyncCommunication (all-gather under the own shard's GEMM forward, "
            "all-gather again under dgrad and reduce-scatter under wgrad backward) and "
            "_RowLinearAsyncCommunication (synchronous differentiable_reduce_scatter_sum "
            "forward, all-gather under the own shard's dgrad backward); nn.py "
            "TensorParallelEmbedding (reduce-scatter forward) (time/recipe_terms.py); "
            "parallel/utils.py MemoryBuffer keeps 'allgather' and 'allgather2' (the row "
            "linears' backward) alive between uses",
            "single_hw_queue": "run_multinode.sh (branch nouamane/bench2, 67c5ebb6, the "
            "benchmark launcher c252843's scripts/scaling_benchmarks.py drives): export "
            "CUDA_DEVICE_MAX_CONNECTIONS=1 (functional.py _ColumnLinearAsyncCommunication is "
            "decorated @assert_cuda_max_connections_set_to_1); its base config "
            "(examples/config_tiny_llama_bench.yaml there) zero_stage 0 -> trainer.py DDP with "
            "optim/gradient_accumulator.py get_fp32_accum_hook, whose per-bucket "
            "dist.all_reduce_coalesced(async_op=True) then waits in the one hardware queue "
            "(NVIDIA/Megatron-LM issue #1468: --overlap-grad-reduce overlaps nothing at "
            "CUDA_DEVICE_MAX_CONNECTIONS=1, traces at TP 1 DP 64; alibaba/Megatron-LLaMA "
            "issues #26, #43; NVIDIA/apex PR #1544)",
            "zero1_grad_sync": "src/nanotron/trainer.py _init_model: make_ddp = dp > 1 and not "
            "(accumulate_grad_in_fp32 and zero_stage > 0); training_step: "
            "sync_gradients_across_dp(reduce_scatter=False) after "
            "pipeline_engine.train_batch_iter returns -> optim/gradient_accumulator.py "
            "FP32GradientAccumulator.sync_gradients_across_dp: "
            "dist.all_reduce(self._contiguous_fp32_grad_buffer) (one collective, nothing "
            "left to overlap); ZeRO-0 keeps torch DDP's bucketed, overlapped all-reduce "
            "(get_fp32_accum_hook)",
            "tied_grad_sync": "src/nanotron/trainer.py (c252843) DistributedTrainer."
            "training_step: sync_tied_weights_gradients(...) runs after sync_gradients_across_dp "
            "and before clip_grad_norm, once pipeline_engine.train_batch_iter has returned ('TODO "
            "@nouamane: Put this in hooks so we can overlap communication with gradient "
            "computation on the last backward pass'); mark_tied_parameters ties "
            "LlamaForTraining.get_embeddings_lm_head_tied_names (token embedding and lm_head "
            "weight when tie_word_embeddings) across the pp ranks holding them, reduce_op SUM; "
            "src/nanotron/parallel/tied_parameters.py sync_tied_weights_gradients: "
            "dist.all_reduce_coalesced of grad_accumulator.get_grad_buffer(name) (the fp32 "
            "buffer) over that group",
            "grad_accum_pass_bytes": "src/nanotron/optim/gradient_accumulator.py "
            "FP32GradientAccumulator.backward: loss.backward(), then _accumulate_grad per "
            "parameter: fp32_grad.add_(half_param.grad) (read 2 + 4, write 4 bytes); "
            "parallel/pipeline_parallel/engine.py PipelineEngine.backward calls it for "
            "every micro-batch",
            "ddp_hook_accumulates": "src/nanotron/optim/gradient_accumulator.py "
            "get_fp32_accum_hook: fp32_grad_buffer.add_(grad) for each parameter of the bucket "
            "before its all-reduce; FP32GradientAccumulator._accumulate_grad adds "
            "half_param.grad again while _is_accumulation_sync_step is False (__init__ sets "
            "it False, no_sync restores the old value): two adds at ZeRO-0's sync micro-batch",
            "post_backward_pass_bytes": "src/nanotron/optim/clip_grads.py clip_grad_norm "
            "(examples/config_tiny_llama.yaml clip_grad 1.0): vector_norm of every fp32 "
            "grad buffer (4) and mul_ in place (4 + 4); gradient_accumulator.py zero_grad: "
            "_contiguous_fp32_grad_buffer.zero_() (4)",
            "master_copy_bytes": "src/nanotron/optim/gradient_accumulator.py "
            "FP32GradientAccumulator.step: half_param.copy_(fp32_param) for the parameters "
            "this rank updates (read 4, write 2)",
            "zero1_gather_flat_copies": "src/nanotron/optim/zero.py ZeroDistributedOptimizer."
            "_all_gather_params -> src/nanotron/distributed.py all_gather_coalesced: "
            "torch._utils._flatten_dense_tensors of the input shards and of each dp rank's "
            "output list, dist.all_gather into them, then copy_ back into the parameters",
            "zero1_gather_host_copies": "src/nanotron/optim/zero.py ZeroDistributedOptimizer."
            "_all_gather_params builds output_tensor_lists with one tensor[slice(...)] per "
            "(parameter, dp rank) in a Python comprehension; src/nanotron/distributed.py "
            "all_gather_coalesced flattens each dp rank's list (torch._utils."
            "_flatten_dense_tensors: a view per tensor, one cat) and then runs update_output: "
            "for every dp rank's gathered buffer, _unflatten_dense_tensors (a narrow and a view "
            "per tensor) and original_buffer.copy_(gathered_buffer) per parameter, one Python "
            "call and one kernel launch each (time/recipe_terms.py zero1_gather_host_s)",
            "loss_casts_logits": "src/nanotron/models/llama.py LlamaModel.cast_to_fp32 (a "
            "PipelineBlock running x.float()) feeds Loss.forward -> parallel/tensor_parallel/"
            "functional.py _ShardedCrossEntropy.forward: sharded_logits - logits_max is a new "
            "fp32 tensor, exponentiated and normalised in place and saved for backward",
            "pp_split": "src/nanotron/models/base.py build_model (c252843): PipelineBlocks are "
            "assigned in model order by cumulative cost against total x (rank + 1) / pp, the "
            "crossing block staying on the earlier rank; models/llama.py "
            "LlamaModel.get_block_compute_costs: a decoder layer 4 x heads x d_qkv x h + 3 x "
            "ffn x h, the lm_head V x h, the embedding 0 (recipes.stages.compute_cost_stages)",
            "fused_rmsnorm": "src/nanotron/models/llama.py LlamaDecoderLayer: TritonRMSNorm "
            "(src/nanotron/nn/layer_norm.py) calls flash_attn.ops.triton.layer_norm "
            "layer_norm_fn, whose LayerNormFn.forward saves x (16-bit) and rstd",
            "sp_linear_saves_shard": "src/nanotron/config/parallelism_config.py "
            "ParallelismArgs.tp_recompute_allgather = True; parallel/tensor_parallel/"
            "functional.py _ColumnLinearAsyncCommunication.forward saves `tensor` (the "
            "sequence shard) when tp_recompute_allgather, backward all-gathers it again into "
            "MemoryBuffer 'allgather' (scripts/scaling_benchmarks.py: tp_mode REDUCE_SCATTER "
            "with tp_linear_async_communication)",
            "ddp_reducer_copy_bytes": "src/nanotron/trainer.py init_model (c252843, the v0.5 "
            "benchmarks' commit): make_ddp = dp > 1 and not (accumulate_grad_in_fp32 and "
            "zero_stage > 0); DistributedDataParallel(model, process_group=dp_pg, "
            "broadcast_buffers=False, bucket_cap_mb=25) keeps torch's default "
            "gradient_as_bucket_view=False: the reducer's flat buckets hold a copy of every "
            "bf16 gradient (torch/nn/parallel/distributed.py); the fp32 reduction runs in "
            "the comm hook (optim/gradient_accumulator.py get_fp32_accum_hook)",
            "param_grads_until_backward_end": "src/nanotron/optim/gradient_accumulator.py "
            "FP32GradientAccumulator.backward: loss.backward() runs to the end, then "
            "_accumulate_grad adds each bf16 half_param.grad into the fp32 buffer and sets "
            "it to None; parallel/pipeline_parallel/engine.py PipelineEngine.backward calls "
            "it once per micro-batch",
            "weight_bytes": "src/nanotron/models/llama.py built in config.model.dtype (bfloat16)",
            "master_bytes": "src/nanotron/optim/gradient_accumulator.py "
            "FP32GradientAccumulator: fp32 copies of the params this rank "
            "updates (accumulate_grad_in_fp32)",
            "grad_bytes": "FP32GradientAccumulator: fp32 grad buffers for all parameters "
            "even under ZeRO-1 ('we need to accumulate gradients for all "
            "parameters')",
            "shards_master": "src/nanotron/optim/zero.py ZeroDistributedOptimizer (ZeRO-1)",
            "zero_stages": "config OptimizerArgs.zero_stage: 0 or 1",
            "loss": "src/nanotron/parallel/tensor_parallel/functional.py "
            "sharded_cross_entropy: fp32 logits, V/tp",
            "pp_schedules": "config ParallelismArgs.pp_engine: '1f1b' or 'afab' "
            "(all-forward-all-backward = GPipe)",
            "cp": "ParallelismArgs has dp, pp, tp, expert_parallel_size: no context parallelism",
            "full_ac_saves": "ParallelismArgs.recompute_layer: each decoder layer recomputed",
            "optimizer": "src/nanotron/helpers.py init_optimizer_and_grad_accumulator: "
            "torch.optim.AdamW on the fp32 copies",
            "ddp_bucket": "FP32GradientAccumulator's fp32 buffers are reduced in place "
            "(sync_gradients_across_dp: one all-reduce of the contiguous buffer under ZeRO-1, "
            "trainer.py passes reduce_scatter=False): no copy of its own (torch DDP's at "
            "ZeRO-0: ddp_reducer_copy_bytes)",
            "activations": "src/nanotron/models/llama.py LlamaDecoderLayer._core_forward and "
            "CausalSelfAttention.forward (training path): TritonRMSNorm, the (3, b, s, heads, d) "
            "contiguous qkv buffer q stays a view of, the contiguous (b, s, 2, kv_heads, d) kv "
            "buffer, flash_attn_varlen_func, merged gate_up and GLUActivation, bf16 stream "
            "(recipes.activations._nanotron_layer)",
            "selective": "no selective mode: ParallelismArgs.recompute_layer recomputes whole "
            "layers",
            "attention": "src/nanotron/models/llama.py CoreAttention: flash_attn_varlen_func "
            "(flash-attn)",
            "fragmentation": ALLOCATOR_SOURCE,
            "cuda_context_bytes": RUNTIME_CONTEXT_SOURCE,
        },
    ),
}


_FOUNDRY = "mosaicml/llm-foundry at 061f2c7 (the MPT benchmark README's commit)"
_COMPOSER = "mosaicml/composer composer/utils/parallelism.py FSDPConfig"
RECIPES["llm-foundry"] = Recipe(
    name="llm-foundry",
    framework="llm-foundry (Composer, FSDP1)",
    weight_bytes=4,
    master_bytes=0,
    grad_bytes=4,
    grad_buffer_full_under_zero1=False,
    shards_master=False,
    step_grad_fp32_copy=False,
    autocast_weight_copy=True,
    zero_stages=(0, 2, 3),
    ddp_bucket="copy",
    bucket_elements=25 * 2**20 / 4,
    bucket_elem_bytes=4,
    bucket_count=1,
    fsdp_prefetch_units=1,
    fsdp_prefetch_params=0,
    loss="vocab_parallel_fp32",
    activations="sdpa_bf16",
    selective="scaletrain",
    ac_modes=("none", "full"),
    full_ac_saves="layer_input",
    sp_with_tp=False,
    attention="model",
    dropout_masks=False,
    pp_split="balanced",
    pp_schedules=(),
    cp=False,
    ddp_with_model_parallel=False,
    pp_with_zero=(),
    fragmentation=FRAGMENTATION,
    cuda_context_bytes=RUNTIME_CONTEXT_BYTES,
    time_model=FOREIGN_TIME_MODEL,
    eager_elementwise=True,
    eager_block="mpt",
    optimizer_pass_bytes=64.0,
    tp_available=False,
    sources={
        "ac_early_stop": f"{_FOUNDRY} the benchmarks ran torch 2.0.1 or 1.13.1 (ac_modes), "
        "before torch's non-reentrant checkpoint stopped early by default (pytorch/pytorch "
        "PR 96866, torch 2.1): the whole MPTBlock is replayed",
        "optimizer_pass_bytes": "mosaicml/composer composer/optim/decoupled_weight_decay.py "
        "(at 18f2d3c33, 2023-10-05, and today) DecoupledAdamW.adamw, the optimizer of "
        "llm-foundry's MPT yamls (optimizer.name decoupled_adamw, weight_decay 0.0; "
        "llmfoundry/utils/builders.py build_optimizer): a loop over the parameters, each op a "
        "kernel of its own over fp32 tensors: exp_avg.mul_ (8) .add_(grad) (12), "
        "exp_avg_sq.mul_ (8) .addcmul_(grad, grad) (12), sqrt (8), / sqrt(bc2) (8), .add_(eps) "
        "(8), param.addcdiv_ (16) = 80 B against a fused AdamW's 28: 52 more; the yamls' "
        "algorithms.gradient_clipping (clipping_type norm) -> composer/algorithms/"
        "gradient_clipping/gradient_clipping.py apply_gradient_clipping -> FSDP1 "
        "clip_grad_norm_ on the gradient shard: its norm (4) and the in-place scale (4 + 4) = "
        "12. 64 B per parameter of the rank's shard",
        "eager_elementwise": f"{_FOUNDRY} llmfoundry/models/layers/blocks.py MPTBlock.forward "
        "(LPLayerNorm x 2, residual adds), ffn.py MPTMLP (nn.GELU), attention.py "
        "(qkv.split), flash_attn_triton.py _flash_attn_backward (fp32 dq_accum copied into "
        "dq): separate eager kernels; scripts/train/benchmarking/submit_benchmarks.py "
        "mod_parameters: compile_config None unless --torch_compile (default False), "
        "norm_type 'low_precision_layernorm' (time/elementwise.py MPT_EAGER_FWD)",
        "weight_bytes": f"{_COMPOSER}.mixed_precision = 'DEFAULT' -> composer/distributed/"
        "mosaic_parallelism.py get_mixed_precision: MixedPrecision(param_dtype=bf16, "
        "reduce_dtype=fp32, buffer_dtype=bf16) over torch FSDP1's fp32 FlatParameter shards "
        "(PURE: reduce_dtype bf16 too)",
        "grad_bytes": "torch FSDP1 keeps the sharded gradient in the parameter dtype (fp32)",
        "master_bytes": "no separate master copy: the FSDP1 shards are fp32 and cast to bf16 "
        "at all-gather (MixedPrecision.param_dtype)",
        "optimizer": "composer/optim/decoupled_weight_decay.py DecoupledAdamW: fp32 exp_avg "
        "and exp_avg_sq per parameter shard (llm-foundry yamls optimizer.name "
        "decoupled_adamw)",
        "ddp_bucket": "without sharding (NO_SHARD or no fsdp_config) torch's DDP with its "
        "default bucket_cap_mb=25 copy buckets (torch/nn/parallel/distributed.py)",
        "zero_stages": f"{_COMPOSER}.sharding_strategy: FULL_SHARD (3, the default), "
        "SHARD_GRAD_OP (2), NO_SHARD (0)",
        "fsdp_prefetch_units": f"{_COMPOSER}: backward_prefetch 'BACKWARD_POST', "
        "backward_prefetch_limit 1, forward_prefetch False, limit_all_gathers True",
        "loss": f"{_FOUNDRY} llmfoundry/models/mpt/modeling_mpt.py ComposerMPTCausalLM: "
        "loss_fn 'fused_crossentropy' (flash_attn.losses.cross_entropy.CrossEntropyLoss) "
        "saves the 16-bit logits and an fp32 lse per token; counted as the fp32 softmax "
        "(2 B per logit more than it keeps)",
        "activations": f"{_FOUNDRY} blocks.py MPTBlock: LayerNorm, GELU MLP, Triton flash "
        "attention (attn_impl 'triton', submit_benchmarks.py --attn_impl default), 16-bit "
        "stream under FSDP's bf16 parameters",
        "ac_modes": f"{_FOUNDRY} modeling_mpt.py activation_checkpointing_fn: whole "
        "MPTBlocks (fsdp_config.activation_checkpointing), no selective mode; the recompute "
        "replays the whole block, the MLP's down projection included: the benchmarks ran "
        "torch 2.0.1 (scripts/train/benchmarking/sweep.sh IMAGE mosaicml/pytorch:"
        "2.0.1_cu118) or, the older bf16 / PURE rows, 1.13.1 (submit_benchmarks.py --image "
        "default), before torch's non-reentrant checkpoint stopped early by default "
        "(pytorch/pytorch PR 96866, 2023-03, torch 2.1)",
        "selective": f"{_FOUNDRY} no selective mode: fsdp_config.activation_checkpointing "
        "checkpoints whole MPTBlocks (modeling_mpt.py activation_checkpointing_fn)",
        "full_ac_saves": "torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py "
        "checkpoint_wrapper around each MPTBlock (Composer trainer/dist_strategy.py "
        "prepare_fsdp_module, NO_REENTRANT per the yamls' activation_checkpointing_reentrant: "
        "false): the block's input kept",
        "cp": "no context parallelism in llm-foundry at this commit (Composer's FSDP over "
        "data-parallel ranks only)",
        "pp_schedules": "llm-foundry has no pipeline, tensor or context parallelism at this "
        "commit (Composer's FSDP over data parallel ranks only)",
        "attention": f"{_FOUNDRY} layers/attention.py triton_flash_attn_fn "
        "(flash_attn_triton.py: no s x s scores kept); the time model's 'triton_flash1' kernel "
        "(time/attention_core.py triton_flash1_rates: FlashAttention-1's published rate)",
        "fragmentation": ALLOCATOR_SOURCE,
        "cuda_context_bytes": RUNTIME_CONTEXT_SOURCE,
    },
)


_FMS = "foundation-model-stack/fms-fsdp at 2fdced7 (the PyTorch FSDP blog's run scripts)"
RECIPES["fms-fsdp"] = Recipe(
    name="fms-fsdp",
    framework="fms-fsdp (IBM, torch FSDP1)",
    weight_bytes=4,
    master_bytes=0,
    grad_bytes=4,
    grad_buffer_full_under_zero1=False,
    shards_master=False,
    step_grad_fp32_copy=False,
    autocast_weight_copy=True,
    zero_stages=(3,),
    ddp_bucket="copy",
    bucket_elements=25 * 2**20 / 4,
    bucket_elem_bytes=4,
    bucket_count=1,
    fsdp_prefetch_units=1,
    fsdp_prefetch_params=0,
    loss="materialized_fp32",
    activations="sdpa_bf16",
    selective="scaletrain",
    ac_modes=("none", "full"),
    full_ac_saves="layer_input",
    sp_with_tp=False,
    attention="model",
    dropout_masks=False,
    pp_split="balanced",
    pp_schedules=(),
    cp=False,
    ddp_with_model_parallel=False,
    pp_with_zero=(),
    fragmentation=FRAGMENTATION,
    cuda_context_bytes=RUNTIME_CONTEXT_BYTES,
    time_model=FOREIGN_TIME_MODEL,
    eager_elementwise=True,
    eager_block="llama",
    tp_available=False,
    fsdp_reduce_bytes=2,
    ac_early_stop=True,
    sources={
        "ac_early_stop": f"{_FMS} fms_fsdp/policies/ac_handler.py wraps the checkpointed "
        "blocks with partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT): "
        "torch's non-reentrant checkpoint, which stops its recompute early by default from "
        "torch 2.1 (the blog's runs used 2024 nightlies; time/ac_early_stop.py)",
        "fsdp_reduce_bytes": f"{_FMS} fms_fsdp/policies/mixed_precision.py bfSixteen "
        "reduce_dtype torch.bfloat16: torch FSDP1 _runtime_utils.py _reduce_grad "
        "reduce-scatters (and under HYBRID_SHARD all-reduces across replicas) the bf16 "
        "gradient",
        "eager_elementwise": f"{_FMS} fms_fsdp/config/training.py use_torch_compile False "
        "(and scripts/7b.sh, 34b.sh, 70b.sh --use_torch_compile=False; main_training.py "
        "refuses compile with activation checkpointing): the fms LLaMA block's RMSNorm "
        "(foundation-model-stack fms/modules/layernorm.py LayerNormParameterized.forward: "
        "pow, mean, rsqrt, mul as separate eager ops), RoPE, SwiGLU and residual adds run "
        "as eager kernels, counted as the eager RMSNorm Llama block "
        "(time/elementwise.py eager_elementwise_bytes)",
        "weight_bytes": f"{_FMS} main_training.py builds LLaMA in fp32 and wraps it in torch "
        "FSDP1 with fms_fsdp/policies/mixed_precision.py bfSixteen (param_dtype, reduce_dtype "
        "and buffer_dtype bf16): fp32 FlatParameter shards, cast to bf16 for the all-gather",
        "grad_bytes": "torch FSDP1 keeps the sharded gradient in the parameter dtype (fp32)",
        "master_bytes": "no separate master copy: the FSDP1 shards are fp32",
        "optimizer": f"{_FMS} main_training.py optim.AdamW(model.parameters(), betas (0.9, "
        "0.95), weight_decay 0.1): fp32 exp_avg and exp_avg_sq per parameter shard",
        "ddp_bucket": f"{_FMS} main_training.py wraps every run in FSDP (no DDP path); the "
        "field is unused",
        "zero_stages": f"{_FMS} fms_fsdp/utils/train_utils.py get_policies: "
        "sharding_strategy 'fsdp' -> FULL_SHARD, 'hsdp' -> HYBRID_SHARD (ZeRO-3 within the "
        "shard group), anything else FULL_SHARD",
        "fsdp_prefetch_units": f"{_FMS} main_training.py FSDP(..., limit_all_gathers=True) "
        "without backward_prefetch / forward_prefetch: torch FSDP1's defaults BACKWARD_PRE and "
        "no forward prefetch, one unit ahead",
        "loss": f"{_FMS} fms_fsdp/utils/train_utils.py train: torch.nn.CrossEntropyLoss on "
        "the model's 16-bit logits, counted as the materialized fp32 softmax (an over-count "
        "of its 16-bit log-softmax)",
        "activations": f"{_FMS} the fms LLaMA block with SDPA attention (the blog: 'SDPA "
        "FlashAttention v2'), 16-bit residual stream under FSDP1's bf16 parameters",
        "ac_modes": f"{_FMS} fms_fsdp/policies/ac_handler.py apply_fsdp_checkpointing: whole "
        "LLaMABlocks, every selective_checkpointing-th one (1: every block = full); no "
        "per-op mode",
        "selective": f"{_FMS} no per-op selective mode (ac_handler.py checkpoints whole "
        "blocks; a period above 1 is not expressible here)",
        "full_ac_saves": f"{_FMS} ac_handler.py checkpoint_wrapper(CheckpointImpl."
        "NO_REENTRANT) around each LLaMABlock: the block's input kept",
        "cp": f"{_FMS}: data parallelism (FSDP / HSDP) only",
        "pp_schedules": f"{_FMS}: no pipeline, tensor or context parallelism",
        "attention": "the row's model attention (SDPA flash by default): the blog's 'SDPA "
        "FlashAttention v2' (pytorch.github.io _posts/2024-03-13-maximizing-training.md)",
        "fragmentation": ALLOCATOR_SOURCE,
        "cuda_context_bytes": RUNTIME_CONTEXT_SOURCE,
    },
)

_TUNE = "pytorch/torchtune at 30b8519e86d2 (the README's memory table's commit)"
RECIPES["torchtune"] = Recipe(
    name="torchtune",
    framework="torchtune (single device / FSDP2)",
    weight_bytes=2,
    master_bytes=0,
    grad_bytes=2,
    grad_buffer_full_under_zero1=False,
    shards_master=False,
    step_grad_fp32_copy=False,
    autocast_weight_copy=False,
    zero_stages=(0, 2, 3),
    ddp_bucket="view",
    bucket_elements=25 * 2**20 / 2,
    bucket_elem_bytes=2,
    bucket_count=1,
    fsdp_prefetch_units=1,
    fsdp_prefetch_params=0,
    loss="chunked_fp32",
    loss_chunks=8,
    loss_compiles=True,
    activations="sdpa_bf16",
    selective="scaletrain",
    ac_modes=("none", "full"),
    full_ac_saves="layer_input",
    ac_early_stop=True,
    sp_with_tp=False,
    attention="model",
    dropout_masks=False,
    pp_split="balanced",
    pp_schedules=(),
    cp=False,
    ddp_with_model_parallel=False,
    pp_with_zero=(),
    fragmentation=FRAGMENTATION,
    cuda_context_bytes=RUNTIME_CONTEXT_BYTES,
    time_model=FOREIGN_TIME_MODEL,
    eager_elementwise=True,
    eager_block="torchtune",
    fsdp2_copies=True,
    fsdp2_ends_exposed=True,
    tp_available=False,
    optimizer_state_bytes=2,
    lora=True,
    sdpa_kv_expanded=True,
    grads_set_to_none=True,
    sources={
        "ac_early_stop": f"{_TUNE} torchtune/training/activations.py "
        "set_activation_checkpointing: torch's apply_activation_checkpointing (its default "
        f"checkpoint_wrapper, NO_REENTRANT), no early-stop setting: {TORCH_EARLY_STOP}",
        "weight_bytes": f"{_TUNE} recipes/lora_finetune_single_device.py, "
        "lora_finetune_distributed.py, full_finetune_single_device.py: self._dtype = "
        "training.get_dtype(cfg.dtype) and the model built under training.set_default_dtype("
        "self._dtype) (dtype: bf16 in every config the corpus cites); the recipes' docstring: "
        "'When dtype=bf16, all activations, gradients and optimizer states are in bfloat16'; "
        "no fp32 master copy, no autocast",
        "master_bytes": f"{_TUNE}: none, the bf16 parameters are what the optimizer updates",
        "grad_bytes": "the parameters' own .grad, in their dtype (bf16)",
        "optimizer": f"{_TUNE} recipes/configs/llama3_1/*.yaml optimizer "
        "torch.optim.AdamW (fused True) over the trainable (bf16) parameters "
        "(_setup_optimizer: config.instantiate(cfg_optimizer, model.parameters()))",
        "ddp_bucket": "torchtune runs no DDP (single device, or FSDP2 in the distributed "
        "recipes): no gradient bucket; the field is unused at dp 1",
        "attention": f"{_TUNE} torchtune/modules/attention_utils.py _sdpa_or_flex_attention: "
        "F.scaled_dot_product_attention (flash / memory-efficient kernels, no s x s scores)",
        "selective": f"{_TUNE} the recipes call set_activation_checkpointing on whole layers "
        "only: no selective mode (ac_modes)",
        "grads_set_to_none": f"{_TUNE} recipes/full_finetune_single_device.py, "
        "lora_finetune_single_device.py, lora_finetune_distributed.py train(): "
        "self._optimizer.zero_grad(set_to_none=True) after every optimizer step (and "
        "zero_grad() before the loop, set_to_none by default in torch 2.x)",
        "optimizer_state_bytes": "torch.optim.AdamW (the configs' optimizer, fused True) keeps "
        "exp_avg and exp_avg_sq zeros_like the bf16 parameter: 2 + 2 B",
        "lora": f"{_TUNE} torchtune/modules/peft/lora.py LoRALinear: the base weight frozen in "
        "the model dtype, or to_nf4(weight) (torchao NF4Tensor) under quantize_base; "
        "forward: linear_nf4(x, weight) / F.linear(x, weight) (a frozen weight saves no input) "
        "plus lora_b(lora_a(x)), A and B nn.Linear in the model dtype with the only gradients "
        "(set_trainable_params(model, get_adapter_params(model))); torchao "
        "torchao/dtypes/nf4tensor.py (pytorch/ao 0598012) LinearNF4.forward saves the NF4 "
        "weight and calls weight.to(input.dtype) -> get_original_weight per call, forward and "
        "backward (recipes.lora); under compile (training.compile_model compiles every "
        "TransformerSelfAttentionLayer, recipes/lora_finetune_*.py _setup_model) Inductor fuses "
        "that dequantization into the weight it writes (memory.lora.compiled_dequantize_bytes)",
        "zero_stages": f"{_TUNE} recipes/*_distributed.py: training.shard_model (fully_shard on "
        "every layers.i, then the root; fsdp_reshard_after_forward True = ZeRO-3, False = "
        "ZeRO-2); the *_single_device recipes: ZeRO-0 at dp 1 (torchtune runs no DDP)",
        "fsdp_prefetch_units": "torch FSDP2 fully_shard's default implicit prefetch: the next "
        "layer's all-gather issued while one computes; the root not resharded after forward",
        "loss": f"{_TUNE} recipes/configs/llama3_1/8B_lora_single_device.yaml, "
        "8B_qlora_single_device.yaml, 70B_lora.yaml: loss "
        "torchtune.modules.loss.CEWithChunkedOutputLoss (405B_qlora.yaml: torch.nn."
        "CrossEntropyLoss, not modelled: every torchtune plan takes the chunked loss); "
        "torchtune/modules/loss/ce_chunked_output_loss.py compute_cross_entropy: "
        "F.cross_entropy(logits.float(), ...) per chunk; the recipes `del logits` after the loss",
        "loss_chunks": "CEWithChunkedOutputLoss.__init__ num_output_chunks = 8 (the configs "
        "leave it); TransformerDecoder.set_num_output_chunks",
        "loss_compiles": f"{_TUNE} torchtune/training/_compile.py compile_loss: under compile "
        "the chunked loss's compute_cross_entropy (upcast + cross-entropy of one chunk) is "
        "compiled",
        "activations": f"{_TUNE} torchtune/modules/transformer.py TransformerSelfAttentionLayer "
        "(bf16 stream, no autocast), torchtune/modules/rms_norm.py RMSNorm.forward on "
        "x.float() (the fp32 upcast saved), SDPA (torchtune/modules/attention_utils.py "
        "_sdpa_or_flex_attention)",
        "sdpa_kv_expanded": f"{_TUNE} torchtune/modules/attention.py MultiHeadAttention."
        "forward: k and v expanded to num_heads and reshaped (a copy) before the attention call",
        "ac_modes": f"{_TUNE} torchtune/training/activations.py set_activation_checkpointing "
        "(torch checkpoint_wrapper, CheckpointImpl.NO_REENTRANT) on every "
        "TransformerSelfAttentionLayer when enable_activation_checkpointing; no selective mode "
        "in the recipes",
        "full_ac_saves": "checkpoint_wrapper keeps the wrapped layer's input",
        "eager_elementwise": f"{_TUNE} RMSNorm, RoPE, SiLU and the residual adds are eager "
        "kernels unless compile (training.compile_model compiles each layer)",
        "eager_block": f"{_TUNE} torchtune/models/llama3_1/_position_embeddings.py "
        "Llama3ScaledRoPE.forward (x.float(), torch.stack of the rotated halves, .type_as) and "
        "modules/transformer.py TransformerDecoder.forward (self.output(h).float()) / "
        "modules/loss/ce_chunked_output_loss.py compute_cross_entropy "
        "(F.cross_entropy(logits.float(), ...)); read at 1814feb",
        "fsdp2_copies": "torch FSDP2 fully_shard (training.shard_model)",
        "fsdp2_ends_exposed": "torch FSDP2 fully_shard (training.shard_model: each layer, "
        "then the root model, the 'root' ends): torch/distributed/fsdp/_fully_shard/"
        "_fsdp_state.py _root_post_backward_final_callback (pytorch/pytorch 1fd469d)",
        "tp_available": f"{_TUNE} recipes/lora_finetune_distributed.py and "
        "full_finetune_distributed.py shard with FSDP only (no tensor parallel plan)",
        "pp_schedules": "no pipeline parallelism in torchtune's recipes",
        "cp": "no context parallelism in torchtune's recipes at this commit",
        "fragmentation": ALLOCATOR_SOURCE,
        "cuda_context_bytes": RUNTIME_CONTEXT_SOURCE,
    },
)


_AM = "NVIDIA-NeMo/Automodel at 36044ad (the performance summary's commit)"
_TT = RECIPES["torchtitan"]
RECIPES["automodel"] = dataclasses.replace(
    _TT,
    name="automodel",
    framework="NeMo AutoModel (FSDP2, bf16 resident parameters)",
    weight_bytes=2,
    master_bytes=0,
    grad_bytes=2,
    autocast_weight_copy=False,
    optimizer_state_bytes=2,
    loss_compiles=False,
    moe_block="none",
    chunked_loss_tokens=0,
    lora=True,
    grads_set_to_none=True,
    optimizer_pass_bytes=0.0,
    sources={
        **{
            k: v
            for k, v in _TT.sources.items()
            if k
            not in (
                "weight_bytes",
                "master_bytes",
                "grad_bytes",
                "optimizer",
                "loss_compiles",
                "moe_block",
                "optimizer_pass_bytes",
                "chunked_loss_tokens",
            )
        },
        "ac_early_stop": f"{_AM} components/distributed/activation_checkpointing.py: torch's "
        "checkpoint_wrapper (CheckpointImpl.NO_REENTRANT), no early_stop passed: "
        f"{TORCH_EARLY_STOP}",
        "moe_block": "NVIDIA-NeMo/Automodel nemo_automodel/components/moe/layers.py (read at "
        "01883b4): its own GroupedExperts / GroupedExpertsDeepEP (the latter on Megatron-Core's "
        "MoEFlexTokenDispatcher and weighted_bias_swiglu_impl), not torchtitan's MoE block: "
        "its kernels are not counted",
        "optimizer_pass_bytes": f"{_AM}: not charged; torchtitan's clip pass (12 B per "
        "parameter over fp32 sharded gradients, its train.py clip_grad_norm_) does not carry "
        "over: AutoModel's gradients are bf16 (grad_bytes) and its clipping is not read here",
        "chunked_loss_tokens": "NVIDIA-NeMo/Automodel nemo_automodel/components/loss/"
        "chunked_ce.py ChunkedCrossEntropy.forward (read at 0122d60): chunks logits the model "
        "already computed whole ([batch, seq, vocab]), not torchtitan's head + loss "
        "ChunkedLossWrapper, so the torchtitan term does not apply (0; not modelled)",
        "autocast_weight_copy": f"{_AM} components/distributed/config.py FSDP2Config."
        "autocast_dtype = None (no torch.autocast around the forward) and the parameters are "
        "bf16 already: no 16-bit cast of a weight is saved",
        "framework": f"{_AM}: Hugging Face or AutoModel-native models sharded with torch FSDP2 "
        "per decoder block (nemo_automodel/components/distributed/parallelizer.py, "
        "components/moe/parallelizer.py apply_fsdp), torch DTensor TP / CP / EP and "
        "torch.distributed.pipelining: the torchtitan recipe's FSDP2, pipeline-stage, "
        "expert-sharding and ring-attention terms, with AutoModel's dtypes below",
        "weight_bytes": f"{_AM} nemo_automodel/_transformers/auto_model.py "
        "NeMoAutoModelForCausalLM.from_config: torch_dtype 'auto' -> torch.bfloat16; "
        "from_pretrained: torch_dtype 'auto' keeps the checkpoint's dtype "
        "(_transformers/model_init.py _restore_loaded_model_dtype; bf16 for the Llama / Qwen "
        "checkpoints); docs/guides/mixed-precision-training.mdx 'Risky Pattern': leaving "
        "model.torch_dtype unset or 'auto' resolves the resident parameter to bf16. The "
        "resident FSDP2 shard is bf16 (2 B); FSDP2Config.mp_policy's param_dtype bf16 casts "
        "nothing (components/distributed/config.py FSDP2Config: MixedPrecisionPolicy("
        "param_dtype=bf16, reduce_dtype=fp32, output_dtype=bf16))",
        "master_bytes": f"{_AM} docs/guides/mixed-precision-training.mdx: torch.optim keeps no "
        "separate master copy (the resident parameter is what it updates); TE FusedAdam "
        "master_weights is opt-in and no benchmark config the corpus cites sets it",
        "grad_bytes": f"{_AM} docs/guides/mixed-precision-training.mdx: with bf16 resident "
        "parameters the gradients are bf16 (reduce_dtype fp32 is the reduce-scatter's dtype "
        "only; the sharded gradient takes the parameter's dtype)",
        "optimizer": f"{_AM} examples/llm_benchmark/qwen/qwen3_moe_30b_te_deepep.yaml and "
        "deepseek/deepseek_v3_te_deepep.yaml: torch.optim.Adam; llama3_1/"
        "llama3_1_8b_peft_benchmark.yaml, qwen/qwen2_5_7b_peft_benchmark.yaml: torch.optim.AdamW",
        "optimizer_state_bytes": f"{_AM} docs/guides/mixed-precision-training.mdx (Storage "
        "Dtype vs. Compute Dtype): 'For torch.optim, the optimizer reads param.data, so the "
        "EMA buffers (exp_avg, exp_avg_sq for AdamW) end up in this dtype': 2 + 2 B over bf16 "
        "parameters. Ignores: TE FusedAdam's fp32 exp_avg / exp_avg_sq (the same page: 'TE "
        "FusedAdam keeps fp32 state regardless'; llama3_3/"
        "custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml runs it: its states are "
        "under-counted by 4 B/param)",
        "loss": f"{_AM} nemo_automodel/components/loss/masked_ce.py MaskedCrossEntropy.forward: "
        "logits.view(-1, V), logits.float() when fp32_upcast (default True), "
        "F.cross_entropy(logits, labels) over the whole micro-batch (no chunking, no fused "
        "linear cross-entropy in the benchmark configs). Ignores: fp32_upcast false (the MoE "
        "benchmark configs), where the log-softmax is saved in bf16: 2 B/logit over-counted",
        "loss_compiles": f"{_AM} components/distributed/config.py FSDP2Config.enable_compile: "
        "'per-layer torch.compile to transformer decoder layers ... Skips whole-model "
        "compile': the loss stays eager",
        "lora": f"{_AM} nemo_automodel/components/_peft/lora.py LinearLoRA._init_adapter: the "
        "base weight frozen (requires_grad False) in its own dtype, lora_A / lora_B nn.Linear "
        "(or TE Linear) in the base weight's dtype (bf16), the only trained parameters; "
        "LinearLoRA.forward: the base linear plus lora_B(lora_A(dropout(x))) scaled: "
        "torchtune's LoRA terms (recipes.lora) over a bf16 base",
        "selective": f"{_AM} nemo_automodel/components/distributed/activation_checkpointing.py "
        "(the selective policy: mm / linear / grouped_mm alternate PREFER_RECOMPUTE and "
        "MUST_SAVE, every other one saved, 'Following TorchTitan'; SDPA outputs in "
        "_SELECTIVE_AC_MUST_SAVE_OPS): torchtitan's op-level SAC",
        "ac_modes": f"{_AM} components/distributed/config.py FSDP2Config."
        "activation_checkpointing: False, True / 'full' or 'selective'",
        "full_ac_saves": f"{_AM} components/distributed/activation_checkpointing.py: torch's "
        "checkpoint_wrapper (CheckpointImpl.NO_REENTRANT) around each decoder block (its input "
        "kept)",
        "ddp_bucket": f"{_AM} components/distributed/config.py DDPConfig: bucket_cap_mb None "
        "(torch's 25 MiB), gradient_as_bucket_view False (a copy of every gradient in the "
        "buckets); components/distributed/ddp.py builds torch DistributedDataParallel",
        "activations": f"{_AM}: Hugging Face / AutoModel decoder blocks with SDPA (or TE) "
        "attention, bf16 stream (FSDP2Config.mp_policy output_dtype bf16, no autocast). "
        "Ignores: the fused kernels a run's backend selects (TE RMSNorm / linear / attention in "
        "the MoE benchmark configs, Liger's RMSNorm / SwiGLU / RoPE patched into Hugging Face "
        "models by _transformers/kernel_patches.py _patch_liger_kernel when use_liger_kernel "
        "(default True)): counted as the eager block, an over-count",
        "cp": f"{_AM} components/distributed/context_parallel/utils.py: torch's context "
        "parallel dispatcher (_enable_context_parallel_dispatcher_impl over the cp mesh, ring "
        "attention over SDPA; examples/llm_benchmark/llama3_3/"
        "custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml: attn_implementation sdpa "
        "'required for cp>1'); the rotate method is torchtitan's assumption (not read)",
        "pp_schedules": f"{_AM} components/distributed/pipelining/config.py PipelineConfig."
        "pp_schedule: 1f1b (default), gpipe, interleaved_1f1b, looped_bfs, dfs, v_schedule, "
        "zero_bubble (torch.distributed.pipelining schedules)",
        "pp_fsdp_unsharded": f"{_AM} components/distributed/config.py FSDP2Config."
        "reshard_after_forward None: 'pipeline-parallel layers do not reshard after forward'; "
        "components/moe/fsdp_mixin.py patched_backward_maybe_with_nosync: sync and resharding "
        "off for every backward but the last before the optimizer step. Ignores: the same "
        "deferral without PP (fsdp_mixin.py prepare_for_grad_accumulation when the backend's "
        "enable_fsdp_optimizations; components/distributed/utils.py get_sync_ctx under "
        "defer_fsdp_grad_sync True), not modelled",
        "experts_shard_over_ep_group": f"{_AM} nemo_automodel/components/moe/parallelizer.py "
        "apply_fsdp: the experts fully_shard on ep_shard_mesh (the data-parallel ranks holding "
        "the same experts), the rest of the block on the whole FSDP mesh",
        "grads_set_to_none": f"{_AM} nemo_automodel/recipes/llm/train_ft.py (training step): "
        "opt.zero_grad() after each step, set_to_none True by torch's default",
    },
)


RECIPES["nemo"] = NEMO

_DS = RECIPES["deepspeed"]
_DS04 = "microsoft/DeepSpeed big-science branch c7f3bc51c (version.txt 0.4.2)"
RECIPES["deepspeed-0.4"] = dataclasses.replace(
    _DS,
    name="deepspeed-0.4",
    framework="DeepSpeed 0.4 (ZeRO-1 of 2021: big-science branch, torch 1.x c10d)",
    zero1_flat_buffers=True,
    # BF16_Optimizer arrived in 2022 (bf16_optimizer.py first at 15293139f, 2022-02-28): the
    # 0.4.2 branch ran bf16 through ZeRO's own optimizer
    bf16_optimizer=False,
    # no adapters: PEFT (2023) postdates this branch, and its Megatron-DeepSpeed trains every
    # parameter
    lora=False,
    sources={
        **{k: v for k, v in _DS.sources.items() if k != "bf16_optimizer"},
        "ddp_bucket": f"{_DS04} engine.py _configure_zero_optimizer: contiguous_gradients "
        "forced off at stage 1, so no ipg buffer in the backward; zero/stage2.py "
        "allreduce_bucket flattens each <= reduce_bucket_size (5e8) bucket after it "
        "(recipes.zero1_flats)",
        "tp_comm": "bigscience-workshop/Megatron-DeepSpeed megatron/mpu/mappings.py _reduce: a "
        "blocking torch.distributed.all_reduce over the tp group, forward in "
        "_ReduceFromModelParallelRegion (row-parallel outputs), backward in "
        "_CopyToModelParallelRegion (column-parallel inputs); no sequence parallelism, no async "
        "linears in the 2021 code, so every one is exposed (comm._tp_term). Placement: "
        f"{_DS04} pipe/topology.py PipeModelDataParallelTopology axes ['pipe', 'data', "
        "'model'], tp innermost, so a tp group is adjacent GPUs of one node, at the links "
        "between them (HardwareSpec.intra_node_group_busbw)",
        "zero1_flat_buffers": f"{_DS04} pipe/engine.py _exec_reduce_grads -> zero/stage2.py "
        "reduce_gradients ... allreduce_bucket (self.flatten per bucket) and step() "
        "(dist.all_gather into a list of dp views, num_shards = max(1, partition x dp // "
        "allgather_bucket_size)); torch/lib/c10d/ProcessGroupNCCL.cpp collective "
        "(recordStream of the input) and allgather (flatten_for_scatter_gather -> newLikeFlat); "
        "c10/cuda/CUDACachingAllocator.cpp header (best fit, else cudaMalloc; a recorded "
        "block is not reused before its stream's work completes; segments never merged)",
    },
)


_HF = "huggingface/transformers (read at 0010f602)"
RECIPES["deepspeed-hf"] = dataclasses.replace(
    _DS,
    name="deepspeed-hf",
    framework="DeepSpeed around a Hugging Face transformers GPT-2 (eager modeling_gpt2)",
    eager_elementwise=True,
    eager_block="hf_gpt2",
    naive_scores="hf_gpt2",
    # the adapters are planned on a Llama block (recipes.lora), not on GPT-2's Conv1D block
    lora=False,
    sources={
        **_DS.sources,
        "eager_elementwise": f"{_HF} src/transformers/models/gpt2/modeling_gpt2.py GPT2Block / "
        "GPT2Attention / GPT2MLP and pytorch_utils.py Conv1D (torch.addmm with the bias): every "
        "op an eager kernel, DeepSpeed's fp16 engine halving the module (engine.py "
        "_configure_distributed_model: module.half()); torch 1.x Blas.cpp addmm_out_cuda_impl "
        "copies the bias into the output before the GEMM (time/elementwise.py HF_GPT2_EAGER_FWD)",
        "naive_scores": f"{_HF} modeling_gpt2.py GPT2Attention._attn: scale division, torch.where "
        "causal mask, padding-mask add, nn.functional.softmax, attn_dropout as separate kernels "
        "(time/attention_core.py NAIVE_SCORE_BYTES['hf_gpt2'])",
    },
)

_BS22 = "bigscience-workshop/Megatron-DeepSpeed"
RECIPES["deepspeed-bigscience-2022"] = dataclasses.replace(
    _DS,
    name="deepspeed-bigscience-2022",
    framework="DeepSpeed 0.6 (master of 2022-02) under BigScience's Megatron-DeepSpeed of 2022-02",
    wd_group_halved=True,
    lora=False,  # BigScience's Megatron-DeepSpeed trains every parameter
    sources={
        **_DS.sources,
        "wd_group_halved": f"{_BS22} megatron/optimizer/__init__.py "
        "_get_params_for_weight_decay_optimization: the weight-decay params list split at "
        "param_count // 2 into two groups ('temp hack to workaround the crash in apex "
        "FusedAdam's multi_tensor_applier', 541b967f, 2022-02-17; at ae6277f5, the branch on "
        "2022-02-25); microsoft/DeepSpeed 2151c787a zero/stage_1_and_2.py partitions each "
        "param group over dp (recipes.zero1_flats.step_check_copies)",
    },
)


def recipe_named(name: str, field_name: str = "--recipe") -> Recipe:
    """The recipe called `name`; an unknown name is one ConfigError line with did-you-mean."""
    if name not in RECIPES:
        raise ConfigError(
            field_name, name, f"use one of {', '.join(RECIPES)}{did_you_mean(name, RECIPES)}"
        )
    return RECIPES[name]
