"""What each framework recipe assumes for what a user (or a published run) does not state.

Two kinds of default, each cited to the framework's source (file and function or flag):

- `LAYOUT_DEFAULTS`: values of the plan's own fields (ZeRO stage, sequence parallelism, AC mode,
  pipeline schedule) that the framework takes when they are not given. `apply_defaults` fills
  the fields a plan leaves unset with them and returns what it assumed, which `plan` prints
  and `explain` cites. "Documented default" means what the framework's documented training
  configurations run: where a bare command-line flag and the framework's own published
  training scripts differ (Megatron-LM's `--use-distributed-optimizer` is off as a flag, on in
  every example script), the scripts win and the flag is named beside them.
- `KNOB_DEFAULTS`: settings the recipe's memory and time terms are built on (bucket sizes,
  prefetch, mixed-precision dtypes), which a plan cannot change; listed so that `explain`
  says which defaults a number rests on.

The `scaletrain` recipe is the planner's own model and has no defaults here: its unset fields
are the job config's (`config.job`). Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from scaletrain.config import Layout

__all__ = [
    "RecipeDefault",
    "Knob",
    "LAYOUT_DEFAULTS",
    "KNOB_DEFAULTS",
    "DEFAULTED_FIELDS",
    "Assumed",
    "apply_defaults",
]

DEFAULTED_FIELDS = ("zero", "sp", "pp_schedule", "ac")
"""The plan fields a recipe can fill in (Layout's zero, sp, pp_schedule; PlanInput's ac)."""


@dataclass(frozen=True)
class RecipeDefault:
    """One field's default under a framework: `rule(layout)` gives the value for the layout
    being planned (sequence parallelism, for one, only means something with tp > 1)."""

    field: str
    rule: Callable[[Layout], Any]
    text: str
    """The value as the framework states it (e.g. '--use-distributed-optimizer')."""
    source: str
    """File and function / flag where the default is read from."""


@dataclass(frozen=True)
class Knob:
    """A framework setting the recipe's terms assume at its default value."""

    name: str
    value: str
    source: str


def _const(value: Any) -> Callable[[Layout], Any]:
    return lambda _layout: value


def _sp_with_tp(layout: Layout) -> bool:
    return layout.tp > 1


def _schedule(layout: Layout) -> str:
    return "interleaved" if layout.pp_virtual > 1 else "1f1b"


_MEGATRON_SCRIPTS = "NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh"
_COMPOSER_FSDP = "mosaicml/composer composer/utils/parallelism.py FSDPConfig"
_FMS_AT = "foundation-model-stack/fms-fsdp at 2fdced7"
_TUNE_AT = "pytorch/torchtune at 30b8519e86d2"
_AM_AT = "NVIDIA-NeMo/Automodel at 36044ad"
_FOUNDRY_YAMLS = "mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml (at 061f2c7)"
_NEMO_RECIPES = "NVIDIA/NeMo nemo/collections/llm/recipes"

LAYOUT_DEFAULTS: dict[str, tuple[RecipeDefault, ...]] = {
    "megatron": (
        RecipeDefault(
            "zero",
            _const(1),
            "distributed optimizer (--use-distributed-optimizer)",
            f"{_MEGATRON_SCRIPTS} DDP_ARGS --use-distributed-optimizer (the performance "
            "table of examples/llama/README.md runs these scripts); the bare flag is off "
            "(megatron/training/arguments.py _add_distributed_args, store_true)",
        ),
        RecipeDefault(
            "sp",
            _sp_with_tp,
            "--sequence-parallel with tp > 1",
            f"{_MEGATRON_SCRIPTS} MODEL_PARALLEL_ARGS --sequence-parallel",
        ),
        RecipeDefault(
            "ac",
            _const("none"),
            "no recompute (--recompute-granularity unset)",
            "megatron/training/arguments.py _add_training_args: --recompute-granularity "
            "default None; the example scripts set none",
        ),
        RecipeDefault(
            "pp_schedule",
            _schedule,
            "1F1B, interleaved with virtual stages",
            "megatron/core/pipeline_parallel/schedules.py get_forward_backward_func",
        ),
    ),
    "nemo": (
        RecipeDefault(
            "zero",
            _const(1),
            "distributed optimizer (use_distributed_optimizer=True)",
            f"{_NEMO_RECIPES}/optim/adam.py distributed_fused_adam_with_cosine_annealing "
            "(the optimizer of every pretrain_recipe); Megatron-Bridge the same "
            "(src/megatron/bridge/recipes/utils/optimizer_utils.py)",
        ),
        RecipeDefault(
            "sp",
            _sp_with_tp,
            "sequence_parallel with tp > 1",
            f"{_NEMO_RECIPES}/llama3_70b.py trainer(sequence_parallelism=True) into "
            "nl.MegatronStrategy(sequence_parallel=...)",
        ),
        RecipeDefault(
            "ac",
            _const("none"),
            "no recompute",
            "megatron/core/transformer/transformer_config.py TransformerConfig."
            "recompute_granularity default None (NeMo's pretrain recipes leave it)",
        ),
        RecipeDefault(
            "pp_schedule",
            _schedule,
            "1F1B, interleaved with virtual stages",
            "megatron/core/pipeline_parallel/schedules.py get_forward_backward_func",
        ),
    ),
    "deepspeed": (
        RecipeDefault(
            "zero",
            _const(0),
            "zero_optimization.stage 0",
            "deepspeed/runtime/zero/config.py DeepSpeedZeroConfig.stage default 0",
        ),
        RecipeDefault(
            "sp",
            _const(False),
            "no sequence parallelism",
            "Megatron-DeepSpeed megatron/arguments.py --sequence-parallel store_true (off)",
        ),
        RecipeDefault(
            "ac",
            _const("none"),
            "no activation checkpointing",
            "deepspeed/runtime/activation_checkpointing/config.py: off unless the model "
            "calls deepspeed.checkpointing (Megatron-DeepSpeed --checkpoint-activations off)",
        ),
        RecipeDefault(
            "pp_schedule",
            _const("1f1b"),
            "TrainSchedule",
            "deepspeed/runtime/pipe/schedule.py TrainSchedule (the only training schedule)",
        ),
    ),
    "torchtitan": (
        RecipeDefault(
            "zero",
            _const(3),
            "FSDP over the leftover ranks (data_parallel_shard_degree = -1)",
            "torchtitan/config/job_config.py Parallelism.data_parallel_shard_degree = -1, "
            "fsdp_reshard_after_forward = 'default' (reshard unless pipelining)",
        ),
        RecipeDefault(
            "sp",
            _sp_with_tp,
            "sequence parallel norms with tp > 1",
            "torchtitan/models/llama3/infra/parallelize.py apply_tp (SequenceParallel)",
        ),
        RecipeDefault(
            "ac",
            _const("selective"),
            "activation_checkpoint.mode = 'selective'",
            "torchtitan/config/job_config.py ActivationCheckpoint.mode = 'selective' (planned "
            "as op-level SAC, selective_ac_option = 'op' of train_configs/llama3_*.toml; the "
            "bare default option '2', every second block, has no planner mode)",
        ),
        RecipeDefault(
            "pp_schedule",
            _const("1f1b"),
            "pipeline_parallel_schedule = '1F1B'",
            "torchtitan/config/job_config.py Parallelism.pipeline_parallel_schedule = '1F1B'",
        ),
    ),
    "nanotron": (
        RecipeDefault(
            "zero",
            _const(0),
            "zero_stage 0",
            "huggingface/nanotron examples/config_tiny_llama.yaml optimizer.zero_stage: 0 "
            "(src/nanotron/config/config.py OptimizerArgs.zero_stage has no default)",
        ),
        RecipeDefault(
            "sp",
            _const(False),
            "tp_mode ALL_REDUCE (no sequence parallelism)",
            "src/nanotron/config/parallelism_config.py ParallelismArgs.__post_init__: "
            "tp_mode = TensorParallelLinearMode.ALL_REDUCE",
        ),
        RecipeDefault(
            "ac",
            _const("none"),
            "recompute_layer False",
            "src/nanotron/config/parallelism_config.py ParallelismArgs.recompute_layer = False",
        ),
        RecipeDefault(
            "pp_schedule",
            _const("gpipe"),
            "pp_engine AllForwardAllBackward (every micro-batch's forward, then backward)",
            "src/nanotron/config/parallelism_config.py ParallelismArgs.__post_init__: "
            "pp_engine = AllForwardAllBackwardPipelineEngine() ('conservative defaults')",
        ),
    ),
    "llm-foundry": (
        RecipeDefault(
            "zero",
            _const(3),
            "fsdp_config.sharding_strategy FULL_SHARD",
            f"{_COMPOSER_FSDP}.sharding_strategy = 'FULL_SHARD'; {_FOUNDRY_YAMLS} fsdp_config "
            "sharding_strategy: FULL_SHARD",
        ),
        RecipeDefault(
            "ac",
            _const("full"),
            "fsdp_config.activation_checkpointing true (whole MPTBlocks)",
            f"{_FOUNDRY_YAMLS} fsdp_config activation_checkpointing: true (Composer's own "
            f"default is off: {_COMPOSER_FSDP}.activation_checkpointing = False); "
            "llmfoundry/models/mpt/modeling_mpt.py activation_checkpointing_fn",
        ),
    ),
    "fms-fsdp": (
        RecipeDefault(
            "zero",
            _const(3),
            "sharding_strategy hsdp (HYBRID_SHARD: ZeRO-3 in the node, replicas across)",
            f"{_FMS_AT} fms_fsdp/config/training.py train_config.sharding_strategy = 'hsdp'; "
            "fms_fsdp/utils/train_utils.py get_policies",
        ),
        RecipeDefault(
            "ac",
            _const("none"),
            "fsdp_activation_checkpointing False",
            f"{_FMS_AT} fms_fsdp/config/training.py train_config.fsdp_activation_checkpointing "
            "= False (selective_checkpointing 1: every block when on)",
        ),
    ),
    "torchtune": (
        RecipeDefault(
            "zero",
            lambda L: 3 if L.dp > 1 else 0,
            "fsdp_reshard_after_forward True (FSDP2 full shard) on more than one GPU; the "
            "single-device recipe on one",
            f"{_TUNE_AT} recipes/lora_finetune_distributed.py and full_finetune_distributed.py: "
            "training.shard_model(reshard_after_forward=cfg.get('fsdp_reshard_after_forward', "
            "True)); recipes/*_single_device.py shard nothing",
        ),
        RecipeDefault(
            "ac",
            _const("full"),
            "enable_activation_checkpointing True (every TransformerSelfAttentionLayer)",
            f"{_TUNE_AT} recipes/configs/llama3_1/8B_lora_single_device.yaml, "
            "8B_qlora_single_device.yaml, 70B_lora.yaml, 405B_qlora.yaml: "
            "enable_activation_checkpointing: True (torchtune/training/activations.py "
            "set_activation_checkpointing)",
        ),
    ),
    "automodel": (
        RecipeDefault(
            "zero",
            _const(3),
            "strategy fsdp2 over the leftover ranks (dp_size none), every decoder block "
            "resharded after forward",
            f"{_AM_AT} nemo_automodel/components/distributed/config.py FSDP2Config."
            "reshard_after_forward None (AutoModel's heuristic: non-pipeline layers reshard "
            "after forward, pipeline layers do not)",
        ),
        RecipeDefault(
            "sp",
            _const(False),
            "sequence_parallel False",
            f"{_AM_AT} nemo_automodel/components/distributed/config.py FSDP2Config."
            "sequence_parallel = False",
        ),
        RecipeDefault(
            "ac",
            _const("none"),
            "activation_checkpointing False",
            f"{_AM_AT} nemo_automodel/components/distributed/config.py FSDP2Config."
            "activation_checkpointing = False (True / 'full': every decoder block wrapped)",
        ),
        RecipeDefault(
            "pp_schedule",
            _const("1f1b"),
            "pipeline pp_schedule '1f1b'",
            f"{_AM_AT} nemo_automodel/components/distributed/pipelining/config.py "
            "PipelineConfig.pp_schedule = '1f1b'",
        ),
    ),
}
"""Per recipe: the default of each plan field its framework fills in (DEFAULTED_FIELDS)."""

KNOB_DEFAULTS: dict[str, tuple[Knob, ...]] = {
    "megatron": (
        Knob(
            "gradient bucket",
            "max(4e7, 1e6 x dp) elements, views into the fp32 grad buffer",
            "megatron/core/distributed/distributed_data_parallel.py "
            "DistributedDataParallel.__init__ (bucket_size)",
        ),
        Knob(
            "grad reduce dtype",
            "fp32 main grads",
            "megatron/training/arguments.py: accumulate_allreduce_grads_in_fp32 for bf16 "
            "(the example scripts' --grad-reduce-in-bf16 halves the reduction, not the buffer)",
        ),
        Knob(
            "fp8 weights",
            "fp8 primary weights under fp8 (--fp8-param-gather)",
            f"{_MEGATRON_SCRIPTS} DTYPE_ARGS --fp8-param-gather",
        ),
        Knob(
            "TP communication overlap",
            "off: TP collectives on the critical path (a run that turns it on states "
            "comm_overlap = ['tp'])",
            "megatron/training/arguments.py _add_training_args: --tp-comm-overlap "
            "store_true; no example script passes it",
        ),
    ),
    "nemo": (
        Knob(
            "gradient bucket",
            "max(4e7, 1e6 x dp) elements, views into the fp32 grad buffer",
            "megatron/core/distributed/distributed_data_parallel.py "
            "DistributedDataParallel.__init__ (bucket_size)",
        ),
        Knob(
            "grad reduce dtype and overlap",
            "fp32, overlapped grad reduce and param gather",
            f"{_NEMO_RECIPES}/llama3_70b.py trainer(): DistributedDataParallelConfig("
            "grad_reduce_in_fp32=True, overlap_grad_reduce=True, overlap_param_gather=True)",
        ),
    ),
    "deepspeed": (
        Knob(
            "reduce_bucket_size / allgather_bucket_size",
            "5e8 elements each",
            "deepspeed/runtime/zero/config.py DeepSpeedZeroConfig",
        ),
        Knob(
            "stage3_prefetch_bucket_size",
            "5e7 parameters",
            "deepspeed/runtime/zero/config.py DeepSpeedZeroConfig",
        ),
        Knob(
            "stage3_max_live_parameters / stage3_param_persistence_threshold",
            "1e9 / 1e5 parameters",
            "deepspeed/runtime/zero/config.py DeepSpeedZeroConfig",
        ),
    ),
    "torchtitan": (
        Knob(
            "FSDP mixed precision",
            "bf16 parameters, fp32 reduce",
            "torchtitan/config/job_config.py Training.mixed_precision_param = 'bfloat16', "
            "mixed_precision_reduce = 'float32'",
        ),
        Knob(
            "DDP bucket",
            "25 MB copy buckets (pure DP)",
            "torch/nn/parallel/distributed.py DistributedDataParallel bucket_cap_mb=25 "
            "(torchtitan apply_ddp passes none)",
        ),
        Knob(
            "loss",
            "cross-entropy over the whole logits; chunked (ChunkedLossWrapper, 8192 tokens a "
            "chunk) only where the run states chunked_loss",
            "torchtitan/components/loss.py cross_entropy_loss (F.cross_entropy(pred.float())); "
            "at 94609ad ChunkedLossWrapper.Config.chunk_len = 8192, picked per model in "
            "config_registry.py (Trainer.Config.loss defaults to BaseLoss.Config)",
        ),
    ),
    "nanotron": (
        Knob(
            "DDP bucket",
            "25 MB (ddp_bucket_cap_mb), gradients copied into buckets",
            "src/nanotron/config/config.py ModelArgs.ddp_bucket_cap_mb = 25; "
            "src/nanotron/trainer.py DistributedDataParallel(...) without "
            "gradient_as_bucket_view (torch's default False: a bucket copy of every gradient)",
        ),
        Knob(
            "fp32 gradient accumulation",
            "fp32 grad buffers for every parameter",
            "src/nanotron/optim/gradient_accumulator.py FP32GradientAccumulator "
            "(accumulate_grad_in_fp32: true in examples/config_tiny_llama.yaml)",
        ),
        Knob(
            "TP linears under sequence parallelism",
            "async (tp_linear_async_communication true with tp_mode REDUCE_SCATTER)",
            "examples/config_tiny_llama.yaml; scripts/scaling_benchmarks.py create_config sets "
            "it for REDUCE_SCATTER (src/nanotron/config/parallelism_config.py "
            "ParallelismArgs.__post_init__ defaults it to False)",
        ),
        Knob(
            "gradient clipping",
            "clip_grad 1.0 (a norm pass and an in-place scale of every fp32 gradient)",
            "examples/config_tiny_llama.yaml optimizer.clip_grad (src/nanotron/config/config.py "
            "OptimizerArgs.clip_grad has no default)",
        ),
    ),
    "llm-foundry": (
        Knob(
            "FSDP mixed precision",
            "DEFAULT: bf16 parameters and buffers, fp32 gradient reduce-scatter (PURE: bf16 "
            "reduce too)",
            f"{_COMPOSER_FSDP}.mixed_precision = 'DEFAULT'; composer/distributed/"
            "mosaic_parallelism.py get_mixed_precision",
        ),
        Knob(
            "FSDP prefetch",
            "backward_prefetch BACKWARD_POST (limit 1), forward_prefetch off, limit_all_gathers on",
            f"{_COMPOSER_FSDP}.backward_prefetch / backward_prefetch_limit / forward_prefetch "
            "/ limit_all_gathers",
        ),
        Knob(
            "attention kernel",
            "Triton flash attention (attn_impl 'triton')",
            "llm-foundry scripts/train/benchmarking/submit_benchmarks.py --attn_impl default "
            "'triton'; llmfoundry/models/mpt/configuration_mpt.py attn_config_defaults",
        ),
        Knob(
            "norm / compile",
            "low_precision_layernorm, eager (no torch.compile)",
            "llm-foundry scripts/train/benchmarking/submit_benchmarks.py mod_parameters: norm_type "
            "'low_precision_layernorm', compile_config None unless --torch_compile (False)",
        ),
        Knob(
            "loss",
            "flash-attn fused cross-entropy (loss_fn 'fused_crossentropy')",
            "llmfoundry/models/mpt/modeling_mpt.py ComposerMPTCausalLM.__init__",
        ),
    ),
    "fms-fsdp": (
        Knob(
            "FSDP mixed precision",
            "bfSixteen: bf16 parameters, buffers and gradient reduce-scatter over fp32 shards",
            f"{_FMS_AT} fms_fsdp/policies/mixed_precision.py bfSixteen; "
            "fms_fsdp/utils/train_utils.py get_policies (mixed_precision True)",
        ),
        Knob(
            "FSDP prefetch",
            "torch FSDP1 defaults: backward_prefetch BACKWARD_PRE, no forward prefetch; "
            "limit_all_gathers on",
            f"{_FMS_AT} main_training.py FSDP(..., limit_all_gathers=True); torch/distributed/"
            "fsdp/fully_sharded_data_parallel.py FullyShardedDataParallel.__init__ defaults",
        ),
        Knob(
            "HSDP shard group",
            "8 GPUs (one node), replicas across nodes",
            f"{_FMS_AT} main_training.py FSDP(sharding_strategy=HYBRID_SHARD) without a process "
            "group: torch/distributed/fsdp/_init_utils.py _init_intra_node_process_group",
        ),
        Knob(
            "compile",
            "off (eager elementwise kernels)",
            f"{_FMS_AT} fms_fsdp/config/training.py use_torch_compile = False",
        ),
        Knob(
            "optimizer",
            "torch.optim.AdamW (default foreach), clip_grad_norm_ 1.0",
            f"{_FMS_AT} main_training.py optim.AdamW; fms_fsdp/utils/train_utils.py train "
            "calls the FSDP module's clip_grad_norm_ with grad_clip_thresh",
        ),
    ),
    "torchtune": (
        Knob(
            "dtype",
            "bf16 parameters, gradients and AdamW states; no fp32 master, no autocast",
            f"{_TUNE_AT} recipes/configs/llama3_1/*.yaml dtype: bf16; recipes/"
            "lora_finetune_single_device.py training.get_dtype / training.set_default_dtype",
        ),
        Knob(
            "loss",
            "CEWithChunkedOutputLoss, 8 chunks, each upcast to fp32 on its own",
            f"{_TUNE_AT} torchtune/modules/loss/ce_chunked_output_loss.py "
            "CEWithChunkedOutputLoss (num_output_chunks 8); the 8B and 70B LoRA configs' loss",
        ),
        Knob(
            "optimizer",
            "torch.optim.AdamW (fused), optimizer_in_bwd off",
            f"{_TUNE_AT} recipes/configs/llama3_1/8B_lora_single_device.yaml optimizer "
            "(the LoRA recipes have no optimizer_in_bwd)",
        ),
        Knob(
            "activation offloading",
            "off (enable_activation_offloading False)",
            f"{_TUNE_AT} recipes/configs/llama3_1/8B_lora_single_device.yaml "
            "enable_activation_offloading: False",
        ),
        Knob(
            "LoRA dropout",
            "0.0 (nn.Identity before lora_a)",
            f"{_TUNE_AT} torchtune/modules/peft/lora.py LoRALinear.__init__ (dropout 0.0)",
        ),
    ),
    "automodel": (
        Knob(
            "dtype",
            "bf16 resident parameters and gradients (model.torch_dtype 'auto'), FSDP2 "
            "MixedPrecisionPolicy(param_dtype bf16, reduce_dtype fp32, output_dtype bf16); torch "
            "Adam / AdamW states in the parameter dtype (bf16)",
            f"{_AM_AT} nemo_automodel/_transformers/auto_model.py from_config (torch_dtype "
            "'auto' -> bf16); components/distributed/config.py FSDP2Config.mp_policy; "
            "docs/guides/mixed-precision-training.mdx",
        ),
        Knob(
            "loss",
            "MaskedCrossEntropy over the whole logits, fp32_upcast True",
            f"{_AM_AT} nemo_automodel/components/loss/masked_ce.py MaskedCrossEntropy.__init__",
        ),
        Knob(
            "compile",
            "per decoder layer only when enable_compile (the loss eager)",
            f"{_AM_AT} nemo_automodel/components/distributed/config.py FSDP2Config.enable_compile",
        ),
    ),
}
"""Per recipe: the framework settings its terms assume at their defaults (informational)."""

# DeepSpeed 0.4 (registry RECIPES["deepspeed-0.4"]): the same defaults, and the two settings
# its post-backward copies rest on (recipes.zero1_flats)
LAYOUT_DEFAULTS["deepspeed-0.4"] = LAYOUT_DEFAULTS["deepspeed"]
KNOB_DEFAULTS["deepspeed-0.4"] = (
    *KNOB_DEFAULTS["deepspeed"],
    Knob(
        "overlap_comm / contiguous_gradients at stage 1",
        "off (forced)",
        "DeepSpeed big-science branch c7f3bc51c deepspeed/runtime/engine.py "
        "_configure_zero_optimizer",
    ),
    Knob(
        "dp all-gather of the updated partition",
        "dist.all_gather into a list of dp views (torch c10d flattens the outputs)",
        "big-science branch deepspeed/runtime/zero/stage2.py step; torch "
        "torch/lib/c10d/ProcessGroupNCCL.cpp allgather",
    ),
)


# DeepSpeed around a Hugging Face model (registry RECIPES["deepspeed-hf"]): DeepSpeed's defaults
LAYOUT_DEFAULTS["deepspeed-hf"] = LAYOUT_DEFAULTS["deepspeed"]
KNOB_DEFAULTS["deepspeed-hf"] = KNOB_DEFAULTS["deepspeed"]

# BigScience's Megatron-DeepSpeed of 2022-02 (registry RECIPES["deepspeed-bigscience-2022"]):
# DeepSpeed's defaults, and the parameter groups its ZeRO partitions
LAYOUT_DEFAULTS["deepspeed-bigscience-2022"] = LAYOUT_DEFAULTS["deepspeed"]
KNOB_DEFAULTS["deepspeed-bigscience-2022"] = (
    *KNOB_DEFAULTS["deepspeed"],
    Knob(
        "optimizer parameter groups",
        "the weight-decay group split in two by count, the no-weight-decay group",
        "bigscience-workshop/Megatron-DeepSpeed megatron/optimizer/__init__.py "
        "_get_params_for_weight_decay_optimization (541b967f)",
    ),
)


@dataclass(frozen=True)
class Assumed:
    """What `apply_defaults` returns: the layout and AC mode with the defaults filled in, and
    one line per default it applied ('zero = 1: distributed optimizer (...) [source]')."""

    layout: Layout
    ac: str
    lines: tuple[str, ...]


def apply_defaults(recipe: str, layout: Layout, ac: str | None, given: Iterable[str]) -> Assumed:
    """`layout` and `ac` with `recipe`'s framework defaults in every DEFAULTED_FIELDS field not
    in `given` (a sequence-parallel default needs tp > 1, a schedule default pp > 1; an AC of
    None is unset too). The scaletrain recipe and recipes without defaults change nothing."""
    have = set(given)
    out, lines = layout, []
    act = ac
    for d in LAYOUT_DEFAULTS.get(recipe, ()):
        if d.field in have or (d.field == "ac" and ac is not None):
            continue
        if (d.field == "sp" and layout.tp == 1) or (d.field == "pp_schedule" and layout.pp == 1):
            continue
        value = d.rule(out)
        if d.field == "ac":
            act = value
        else:
            out = dataclasses.replace(out, **{d.field: value})
        shown = str(value).lower() if isinstance(value, bool) else value
        lines.append(f"{d.field} = {shown}: {d.text} [{d.source}]")
    return Assumed(layout=out, ac=act or "none", lines=tuple(lines))
