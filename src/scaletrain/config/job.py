"""The whole training plan as typed sections (loaded from TOML and `--section.key=value`
overrides by `config.loading`).

Every section validates itself on construction; cross-section rules (batch arithmetic, layout
legality) are checked by `JobConfig.__post_init__`. Errors are `ConfigError`s naming the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ._errors import require
from .choices import (
    ACMode,
    Fp8Amax,
    Fp8Backend,
    Fp8Matmul,
    Fp8Scaling,
    GradCompression,
    LayoutMode,
    LRScaling,
    LRSchedule,
    OffloadMode,
    OptimizerName,
    PPSchedule,
    Precision,
    ReduceDtype,
    ZeroStage,
    check_choices,
    names,
)
from .data import DataConfig
from .hardware import HardwareSpec
from .layout import Layout, check_layout, option_problems
from .lora import LoraConfig, lora_problems
from .model import ModelConfig, resolve_model
from .monitor import MonitorConfig
from .offload import offloads_activations
from .precision import PRECISIONS, fp8_backend_for
from .runtime import CheckpointConfig, GuardConfig, HardwareConfig, TrainConfig
from .sources import pretrained_vocab_size

__all__ = [
    "ParallelConfig",
    "PrecisionConfig",
    "MemoryConfig",
    "BatchConfig",
    "OptimConfig",
    "DataConfig",
    "TrainConfig",
    "CheckpointConfig",
    "GuardConfig",
    "HardwareConfig",
    "JobConfig",
    "SECTIONS",
    "PRECISIONS",
    "AC_MODES",
    "OFFLOAD_MODES",
]

AC_MODES: tuple[ACMode, ...] = names(ACMode)
OFFLOAD_MODES: tuple[OffloadMode, ...] = names(OffloadMode)


@dataclass
class ParallelConfig:
    """Parallel degrees. dp = -1 fills the world size left after tp*pp*cp."""

    dp: int = -1
    zero: ZeroStage = 0
    dp_replicate: int = 1
    tp: int = 1
    sp: bool = False
    pp: int = 1
    pp_schedule: PPSchedule = "1f1b"
    pp_virtual: int = 1
    cp: int = 1
    ep: int = 1
    layout: LayoutMode = "auto"
    """'auto': when the run names no degrees (all defaults) and has more than one rank, the
    planner picks a layout that fits (the simplest within 10% of the fastest: planner.search);
    'manual' always uses the degrees above."""

    def __post_init__(self) -> None:
        require(self.dp == -1 or self.dp >= 1, "parallel.dp", self.dp, "use -1 (auto) or >= 1")
        check_choices(self, "parallel")  # zero, pp_schedule, layout
        for f in ("dp_replicate", "tp", "pp", "pp_virtual", "cp", "ep"):
            v = getattr(self, f)
            require(isinstance(v, int) and v >= 1, f"parallel.{f}", v, "use a positive integer")

    @property
    def names_degrees(self) -> bool:
        """True when any degree differs from its default (the user chose a layout)."""
        return (
            self.dp,
            self.zero,
            self.dp_replicate,
            self.tp,
            self.sp,
            self.pp,
            self.cp,
            self.ep,
        ) != (-1, 0, 1, 1, False, 1, 1, 1)

    @classmethod
    def from_layout(cls, layout: Layout) -> ParallelConfig:
        """The config that runs exactly `layout` (layout='manual')."""
        return cls(
            dp=layout.dp,
            zero=layout.zero,
            dp_replicate=layout.dp_replicate,
            tp=layout.tp,
            sp=layout.sp,
            pp=layout.pp,
            pp_schedule=layout.pp_schedule,
            pp_virtual=layout.pp_virtual,
            cp=layout.cp,
            ep=layout.ep,
            layout="manual",
        )

    def resolve(self, world_size: int) -> Layout:
        """The concrete Layout for `world_size` ranks (dp filled in when -1)."""
        rest = self.tp * self.pp * self.cp
        dp = self.dp
        if dp == -1:
            require(
                world_size % rest == 0,
                "parallel",
                f"tp*pp*cp={rest}",
                f"must divide the world size {world_size}",
            )
            dp = world_size // rest
        return Layout(
            dp=dp,
            zero=self.zero,
            dp_replicate=self.dp_replicate,
            tp=self.tp,
            sp=self.sp,
            pp=self.pp,
            pp_schedule=self.pp_schedule,
            pp_virtual=self.pp_virtual,
            cp=self.cp,
            ep=self.ep,
        )


@dataclass
class PrecisionConfig:
    dtype: Precision = "fp32"
    """Compute precision: 'fp32', 'bf16' (autocast/FSDP mp, fp32 master), 'fp16' (+ dynamic
    loss scaling), 'fp8' (float8 linears and MoE experts, bf16 elsewhere)."""
    reduce_dtype: ReduceDtype = "fp32"
    """Gradient communication dtype: 'fp32' or 'bf16'."""
    tf32: bool = True
    """fp32 matmuls on TF32 tensor cores (10-bit mantissa, ~8x the fp32 rate) on GPUs that
    have them (NVIDIA sm80+: A100, H100, B200); false keeps IEEE fp32. No effect elsewhere."""
    loss_scale_init: float = 2.0**16
    loss_scale_growth_interval: int = 2000
    fp8_scaling: Fp8Scaling = "tensorwise"
    """fp8 scaling granularity: 'tensorwise' or 'tilewise' (1x128 activations, 128x128 weights)."""
    fp8_amax: Fp8Amax = "current"
    """fp8 per-tensor amax: 'current' (this tensor's) or 'delayed' (the max over the last
    `fp8_history_len` micro-batches, Transformer Engine style; tensorwise only)."""
    fp8_history_len: int = 16
    """Delayed scaling's amax history length."""
    fp8_all_gather: bool = False
    """ZeRO-2/3 (FSDP2): all-gather the fp8 Linears' weights in E4M3 (1 byte/param instead of
    bf16's 2; tensorwise scaling, no tensor parallelism): `precision/fp8_fsdp.py`."""
    fp8_matmul: Fp8Matmul = "auto"
    """fp8 GEMM kernel: 'auto' (torch._scaled_mm, but on a CPU the emulation where a probe,
    once per process, measures _scaled_mm over 2x slower), 'scaled_mm' or 'emulated' (the same
    fp8 operands and scales dequantized to fp32, fp32 matmul): `precision/fp8_matmul.py`."""
    fp8_backend: Fp8Backend = "auto"
    """Who converts the Linears: 'auto' (torchao's Float8Linear where the run's device is CUDA,
    torchao is installed and the recipe is tensorwise / current / not emulated; else ours),
    'scaletrain' (`precision/fp8.py`) or 'torchao'. The rule is `config.fp8_backend_for`:
    a dry-run decides for its target device, not its host (`precision.apply_fp8`), and the
    planner plans the backend it picks (`PlanInput.fp8_backend`)."""
    grad_compression: GradCompression = "none"
    """DDP gradient all-reduce compression: 'none' or 'powersgd' (low-rank, error feedback)."""
    powersgd_rank: int = 2
    """PowerSGD matrix approximation rank."""
    powersgd_start_step: int = 10
    """Optimizer steps of plain all-reduce before PowerSGD starts (its warm-up)."""

    def fp8_backend_on(self, device_type: str) -> str:
        """Whose Float8Linear converts the Linears on `device_type` ('cuda', 'cpu'):
        'scaletrain' or 'torchao' (`config.precision.fp8_backend_for`, the one rule)."""
        return fp8_backend_for(
            self.fp8_backend,
            scaling=self.fp8_scaling,
            amax=self.fp8_amax,
            matmul=self.fp8_matmul,
            device_type=device_type,
        )

    def __post_init__(self) -> None:
        check_choices(self, "precision")  # dtype, reduce_dtype, fp8_*, grad_compression
        require(
            not (self.fp8_amax == "delayed" and self.fp8_scaling == "tilewise"),
            "precision.fp8_amax",
            self.fp8_amax,
            "delayed amax is per-tensor only: set "
            "precision.fp8_scaling='tensorwise', or fp8_amax='current' (tiles are scaled "
            "from their own amax)",
        )
        require(
            self.fp8_backend != "torchao"
            or (
                self.fp8_scaling == "tensorwise"
                and self.fp8_amax == "current"
                and self.fp8_matmul != "emulated"
            ),
            "precision.fp8_backend",
            self.fp8_backend,
            "torchao's Float8Linear runs tensorwise scaling with current amax through "
            "_scaled_mm: set fp8_scaling='tensorwise', fp8_amax='current' and fp8_matmul "
            "other than 'emulated', or fp8_backend='auto' / 'scaletrain'",
        )
        require(
            not (self.fp8_all_gather and self.fp8_scaling == "tilewise"),
            "precision.fp8_all_gather",
            self.fp8_all_gather,
            "the float8 all-gather "
            "sends one per-tensor scale per weight: set precision.fp8_scaling='tensorwise' "
            "or fp8_all_gather=false",
        )
        require(
            self.fp8_history_len >= 1,
            "precision.fp8_history_len",
            self.fp8_history_len,
            "use a positive integer such as 16",
        )
        require(
            self.powersgd_rank >= 1,
            "precision.powersgd_rank",
            self.powersgd_rank,
            "use a positive integer such as 2",
        )
        require(
            self.powersgd_start_step >= 2,
            "precision.powersgd_start_step",
            self.powersgd_start_step,
            "use >= 2 (torch's PowerSGD needs a warm-up)",
        )
        # The scale lifts fp16 gradients above its underflow (smallest subnormal 6e-8): below 1
        # it pushes them further under (1e-30: every gradient 0, the run silently learns
        # nothing); far above fp16's max (65504) every step overflows and is skipped while
        # the dynamic scaler halves it back (DeepSpeed: initial 2^16, min_loss_scale 1).
        require(
            1.0 <= self.loss_scale_init <= 2.0**32,
            "precision.loss_scale_init",
            self.loss_scale_init,
            "use a power of two in [1, 2^32], such as 65536.0 (below 1 it underflows fp16 "
            "gradients to 0)",
        )
        require(
            self.loss_scale_growth_interval >= 1,
            "precision.loss_scale_growth_interval",
            self.loss_scale_growth_interval,
            "use a positive integer",
        )


@dataclass
class MemoryConfig:
    ac: ACMode = "none"
    """Activation checkpointing: 'none', 'selective' (recompute attention core), 'full'."""
    offload: OffloadMode = "none"
    """CPU offload: 'none'; 'optimizer' (optimizer states); 'params' (FSDP2 offload policy:
    sharded parameters, gradients and optimizer states); 'activations' (what autograd saves
    for backward goes to host memory, pinned on CUDA, and comes back in backward); or
    'optimizer+activations' / 'params+activations'. The planner counts the host memory each
    uses per node against `hardware.host_memory_gib`."""
    loss_chunk_tokens: int = 0
    """Tokens per chunk of the fused head + cross-entropy (`models.loss`): the (tokens x
    vocab) logits exist one chunk at a time, forward and backward. 0 (default) = auto: one
    chunk's fp32 logits stay under 256 MiB (523 tokens at a 128,256 vocabulary per tp rank,
    1,335 at GPT-2's 50,257); smaller saves memory, larger means fewer head matmuls."""

    def __post_init__(self) -> None:
        check_choices(self, "memory")  # ac, offload
        require(
            self.ac == "none" or not offloads_activations(self.offload),
            "memory.offload",
            self.offload,
            f"activation offload moves what autograd saves, and under memory.ac={self.ac!r} "
            "the blocks save nothing but their inputs, which the checkpoint keeps on the "
            "device: use memory.ac = none with it, or an offload without '+activations'",
        )
        require(
            isinstance(self.loss_chunk_tokens, int) and self.loss_chunk_tokens >= 0,
            "memory.loss_chunk_tokens",
            self.loss_chunk_tokens,
            "use 0 (auto) or a positive number of tokens per chunk",
        )


@dataclass
class BatchConfig:
    global_batch: int = 16
    """Sequences per optimizer step, over all data-parallel ranks."""
    micro_batch: int = 16
    """Sequences per forward/backward on one rank; the rest is gradient accumulation."""
    seq_len: int = 128
    """Tokens per sequence."""

    def __post_init__(self) -> None:
        for f in ("global_batch", "micro_batch", "seq_len"):
            v = getattr(self, f)
            require(isinstance(v, int) and v >= 1, f"batch.{f}", v, "use a positive integer")
        require(
            self.global_batch % self.micro_batch == 0,
            "batch.global_batch",
            self.global_batch,
            f"must be a multiple of batch.micro_batch={self.micro_batch}: give a micro_batch "
            f"that divides {self.global_batch}, or a global_batch that micro_batch divides",
        )


@dataclass
class OptimConfig:
    name: OptimizerName = "adamw"
    """'adamw'; 'adamw8bit' (AdamW with block-wise 8-bit moments, torchao's AdamW8bit: the
    `lowbit` extra); 'adafactor' (Shazeer & Stern 2018: a factored second moment, a row and a
    column per matrix, the update clipped to RMS 1, a first moment while `beta1` > 0; see
    `relative_step`); or 'sgd' (with momentum)."""
    lr: float = 2e-3
    """Peak learning rate (the default suits the embedded small-GPT run; large models want
    ~3e-4 or lower)."""
    min_lr_ratio: float = 0.1
    """Final lr of the cosine decay as a fraction of `lr`."""
    warmup_steps: int = 80
    schedule: LRSchedule = "cosine"
    """'cosine' (linear warmup then cosine decay), 'linear' or 'constant' (after warmup)."""
    beta1: float = 0.9
    """First-moment decay: AdamW's and adamw8bit's beta1; with 'adafactor', the decay of its
    optional first moment (an EMA of the clipped update, as T5X keeps it: one more fp32 state
    per parameter, which the planner counts), 0 = none (torch.optim.Adafactor's algorithm).
    0.9 for all three: Adafactor's final loss on the default job is 1.013x AdamW's with it,
    1.058x without (benchmarks/results/optimizers.md)."""
    beta2: float = 0.95
    """AdamW's and adamw8bit's second-moment decay (Adafactor's follows 1 - step^-0.8)."""
    eps: float = 1e-8
    weight_decay: float = 0.1
    momentum: float = 0.9
    """SGD's momentum."""
    relative_step: bool = False
    """'adafactor' only: false makes `lr` (the schedule's) the step size, as AdamW's, so the
    same lr suits both (Hugging Face's Adafactor with relative_step=False,
    scale_parameter=False); true is the paper's relative step, max(1e-3, RMS(param)) x
    min(lr, 1/sqrt(step)) (torch's Adafactor), where `lr` caps a step relative to each
    parameter's RMS and wants ~50x AdamW's. False by measurement: on the default job 1.013x
    AdamW's final loss at its lr, the relative step's best 1.040x (lr 0.1;
    benchmarks/results/optimizers.md)."""
    grad_clip: float = 1.0
    """Global-norm clip threshold; 0 disables clipping."""
    lr_scaling: LRScaling = "none"
    """Scale `lr` (and so the whole schedule) by the global batch against
    `lr_reference_batch`: 'linear' multiplies it by global/reference (Goyal et al. 2017, SGD),
    'sqrt' by its square root (Adam: Malladi et al. 2022; Krizhevsky 2014); 'none' keeps it.
    The factor and the resulting lr are printed once at the start of a run."""
    lr_reference_batch: int = 2048
    """The batch, in TOKENS per optimizer step (batch.global_batch * batch.seq_len), for which
    `lr` was tuned; read only when lr_scaling is not 'none'. The default is the default job's
    (16 sequences of 128 tokens), for which the default lr was tuned. Tokens rather than
    sequences so that a change of seq_len scales the lr too: the gradient's noise falls with
    the tokens averaged, whatever their split into sequences."""

    def __post_init__(self) -> None:
        check_choices(self, "optim")  # name, schedule, lr_scaling
        require(
            isinstance(self.lr_reference_batch, int) and self.lr_reference_batch >= 1,
            "optim.lr_reference_batch",
            self.lr_reference_batch,
            "use the positive number of tokens per step (global_batch * seq_len) the lr was "
            "tuned for, such as 2048",
        )
        require(self.lr > 0, "optim.lr", self.lr, "use a positive learning rate such as 3e-4")
        require(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", self.min_lr_ratio, "use 0..1")
        require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "use >= 0")
        require(0 <= self.beta1 < 1, "optim.beta1", self.beta1, "use 0 <= beta1 < 1")
        require(0 <= self.beta2 < 1, "optim.beta2", self.beta2, "use 0 <= beta2 < 1")
        require(
            self.eps >= 2.0**-126,  # float32's smallest normal (IEEE 754 binary32: 2^-126)
            "optim.eps",
            self.eps,
            "use a small positive float >= 1.2e-38 such as 1e-8 (a smaller one rounds to 0 in "
            "the fp32 optimizer states: 0/0 = nan for a parameter whose gradient is 0)",
        )
        require(0 <= self.momentum < 1, "optim.momentum", self.momentum, "use 0 <= momentum < 1")
        require(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "use >= 0")
        require(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, "use >= 0 (0 = off)")


SECTIONS = {
    "parallel": ParallelConfig,
    "precision": PrecisionConfig,
    "memory": MemoryConfig,
    "batch": BatchConfig,
    "optim": OptimConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "checkpoint": CheckpointConfig,
    "guard": GuardConfig,
    "hardware": HardwareConfig,
    "monitor": MonitorConfig,
    "lora": LoraConfig,
}


@dataclass
class JobConfig:
    model: ModelConfig = field(default_factory=lambda: resolve_model("gpt-mini"))
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        if self.data.tokenizer not in ("byte", "char", "bpe"):  # before any tokenizing
            n = pretrained_vocab_size(self.data.tokenizer)
            require(
                n <= self.model.vocab_size,
                "data.tokenizer",
                self.data.tokenizer,
                f"its {n} ids exceed model.vocab_size={self.model.vocab_size}: use the "
                "model's own tokenizer (or raise model.vocab_size)",
            )
        # learned positions have a table of max_seq_len rows; RoPE's cos/sin cache is sized
        # by it too, so both refuse longer sequences here rather than at step 1
        if self.model.position == "learned":
            fix = (
                f"exceeds model.max_seq_len={self.model.max_seq_len}, the rows of the model's "
                "learned position table (a longer sequence has no position embedding): "
                "lower batch.seq_len"
            )
        else:
            fix = (
                f"exceeds model.max_seq_len={self.model.max_seq_len}: lower batch.seq_len, or "
                "set model.max_seq_len to train RoPE positions beyond the model's context "
                "(unscaled; plan/explain/dryrun extend it for you)"
            )
        require(
            self.batch.seq_len <= self.model.max_seq_len, "batch.seq_len", self.batch.seq_len, fix
        )

        if self.checkpoint.export_hf:  # refused now, not after training
            from .hf_model import hf_export_problem

            why = hf_export_problem(self.model)
            require(
                why is None,
                "checkpoint.export_hf",
                True,
                f"model {self.model.name!r} cannot be exported: {why}; "
                "set checkpoint.export_hf = false or change the model",
            )

    def layout(self, world_size: int) -> Layout:
        """The concrete, checked layout for `world_size` ranks."""
        layout = self.parallel.resolve(world_size)
        check_layout(
            layout,
            self.model,
            world_size=world_size,
            global_batch=self.batch.global_batch,
            micro_batch=self.batch.micro_batch,
            seq_len=self.batch.seq_len,
        )
        problems = option_problems(
            layout,
            offload=self.memory.offload,
            fp8_all_gather=self.precision.fp8_all_gather,
            precision=self.precision.dtype,
            grad_compression=self.precision.grad_compression,
            moe=self.model.is_moe,
            optimizer=self.optim.name,
        )
        problems += lora_problems(self.lora, self.model, layout, self.precision.dtype)
        if problems:
            raise problems[0]
        return layout

    def hardware_spec(self) -> HardwareSpec:
        """The configured hardware as this job runs it: `hardware.spec()` with the precision
        settings that change its rates (`precision.tf32`: fp32 matmuls at the TF32 rate)."""
        spec = self.hardware.spec()
        return spec if self.precision.tf32 else dataclasses.replace(spec, tf32=False)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
