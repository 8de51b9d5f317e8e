"""Typed configuration of a training plan: model, layout, precision, memory, batch, hardware.

Pure Python (no torch): the planner and the trainer share these types and legality rules.
"""

from ._errors import ConfigError
from .hardware import GB, HARDWARE_PRESETS, TFLOPS, GiB, HardwareSpec, hardware_preset
from .hardware_rules import GpuArch, precision_problem, runs_tf32
from .hf_model import model_from_hf_config
from .job import (
    AC_MODES,
    OFFLOAD_MODES,
    PRECISIONS,
    BatchConfig,
    CheckpointConfig,
    DataConfig,
    GuardConfig,
    HardwareConfig,
    JobConfig,
    MemoryConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainConfig,
)
from .layout import (
    PP_SCHEDULES,
    Layout,
    batch_problems,
    check_layout,
    composition_problems,
    ddp_reducer,
    expert_split,
    expert_tp,
    expert_zero_shards,
    fsdp_reshard_after_forward,
    fused_head_loss,
    grad_accum_steps,
    layout_problems,
    option_problems,
    stage_ids,
    stage_layer_ranges,
)
from .loading import load_config, parse_overrides, split_overrides
from .lora import LORA_TARGETS, LoraConfig
from .model import MODEL_PRESETS, ModelConfig, ParamCounts, model_preset, resolve_model
from .offload import offload_states, offloads_activations
from .precision import PRECISION_TABLE, PrecisionSpec, compute_bytes, precision_spec
from .units import KiB, MiB, byte_unit, fmt_bytes

__all__ = [
    "ConfigError",
    "GB",
    "GiB",
    "MiB",
    "KiB",
    "byte_unit",
    "fmt_bytes",
    "TFLOPS",
    "HARDWARE_PRESETS",
    "HardwareSpec",
    "hardware_preset",
    "GpuArch",
    "precision_problem",
    "runs_tf32",
    "AC_MODES",
    "OFFLOAD_MODES",
    "PRECISIONS",
    "PRECISION_TABLE",
    "PrecisionSpec",
    "precision_spec",
    "compute_bytes",
    "BatchConfig",
    "LORA_TARGETS",
    "LoraConfig",
    "offload_states",
    "offloads_activations",
    "CheckpointConfig",
    "DataConfig",
    "GuardConfig",
    "HardwareConfig",
    "JobConfig",
    "MemoryConfig",
    "OptimConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "TrainConfig",
    "load_config",
    "parse_overrides",
    "split_overrides",
    "PP_SCHEDULES",
    "Layout",
    "batch_problems",
    "check_layout",
    "composition_problems",
    "ddp_reducer",
    "expert_split",
    "fused_head_loss",
    "expert_tp",
    "expert_zero_shards",
    "fsdp_reshard_after_forward",
    "grad_accum_steps",
    "option_problems",
    "layout_problems",
    "stage_ids",
    "stage_layer_ranges",
    "MODEL_PRESETS",
    "ModelConfig",
    "ParamCounts",
    "model_from_hf_config",
    "model_preset",
    "resolve_model",
]
