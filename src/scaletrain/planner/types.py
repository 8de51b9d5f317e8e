"""The planner's input and output types; `Estimate.to_json()` is the docs/DESIGN.md §4 schema.

`Measurement` objects (dry-run, real runs) reuse `MemoryBreakdown` so every predicted number can be
held against a measured one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from scaletrain.config import (
    HardwareSpec,
    JobConfig,
    Layout,
    ModelConfig,
    OptimConfig,
    compute_bytes,
    fp8_backend_for,
    grad_accum_steps,
)

from .time.calibration import Calibration
from .time.pipeline import schedule_microbatches

_T = TypeVar("_T")


class _derived(Generic[_T]):
    """`functools.cached_property` without its lock: Python 3.11's takes an RLock on every
    first read, which cost the 405B search ~2% of its CPU time (two per plan, 31,445 plans).
    Stored in the instance dict on the first read (outside the frozen fields, equality and
    hash); a plan is read by one thread."""

    def __init__(self, fn: Callable[[Any], _T]) -> None:
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    @overload
    def __get__(self, obj: None, owner: type) -> _derived[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> _T: ...
    def __get__(self, obj: object | None, owner: type) -> _derived[_T] | _T:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


__all__ = [
    "PlanInput",
    "MemoryBreakdown",
    "TimeBreakdown",
    "Estimate",
    "plan_input_from_job",
    "PLANNED_FIELDS",
    "layout_label",
]


@dataclass(frozen=True)
class PlanInput:
    """Everything one layout evaluation needs."""

    model: ModelConfig
    hardware: HardwareSpec
    num_gpus: int
    layout: Layout
    seq_len: int
    global_batch: int
    """Sequences per optimizer step (all dp ranks)."""
    micro_batch: int
    """Sequences per micro-batch per dp rank."""
    precision: str = "bf16"
    ac: str = "none"
    offload: str = "none"
    optimizer: str = "adamw"
    """'adamw', 'sgd' (momentum), 'adamw8bit' or 'adafactor' (`OPTIMIZER_BYTES`)."""
    compile: bool = False
    efficiency: float = 0.0
    """Achievable fraction of peak matmul FLOP/s; 0 = the planner's documented default."""
    fp8_all_gather: bool = False
    """precision 'fp8' under ZeRO-2/3: the fp8 Linears' weights are all-gathered in E4M3."""
    fp8_backend: str = "scaletrain"
    """precision 'fp8': whose Float8Linear the run converts its Linears to, resolved for the
    hardware's device (`config.fp8_backend_for`, the trainer's rule; `plan_input_from_job`
    and `plan` resolve `precision.fp8_backend`): 'scaletrain' (`precision/fp8.py`: 1-byte
    saved inputs) or 'torchao' (16-bit saved inputs, eager casts through fp32:
    `memory.torchao_fp8`)."""
    recipe: str = "scaletrain"
    """Framework recipe (planner/recipes/registry.py): whose allocations and time model to plan."""
    loss_chunk_tokens: int = 0
    """Tokens per chunk of the fused head + loss (`memory.loss_chunk_tokens`; 0 = the
    trainer's auto rule, `memory.head.fused_loss_chunk`)."""
    compile_loss: bool | None = None
    """Foreign recipes: whether the framework compiled its loss with the model (None: the
    recipe's rule, `Recipe.loss_compiles` under `compile`); a run of a framework version
    that did not (torchtitan before 2025) says False."""
    chunked_loss: bool | None = None
    """Foreign recipes with a chunked loss (`Recipe.loss` 'chunked_fp32', torchtune's
    CEWithChunkedOutputLoss): False when the run used the unchunked loss instead (torchtune's
    TransformerDecoder upcasts the whole logits, `self.output(h).float()`, for torch's
    CrossEntropyLoss); True over a recipe with an optional chunked head + loss
    (`Recipe.chunked_loss_tokens`, torchtitan's ChunkedLossWrapper; chunk length
    `loss_chunk_tokens` if > 0); None: the recipe's own loss."""
    fsdp_ends: str = "unstated"
    """Foreign recipes under FSDP2: how the run wraps the embedding, final norm and head, a
    `config.choices.FsdpEnds` name ('root', 'own_units'; 'unstated': the recipe's rule,
    'root'). A published row's `layout.fsdp_ends`."""
    sdpa_saved: bool | None = None
    """Foreign recipes with torchtitan's op-level selective AC: whether its save list holds the
    SDPA kernel the run dispatches to (None: the recipe's rule, saved). A published row's
    `layout.sdpa_saved`: torchtitan from 3b85aa3 (2025-05-14) to b39377f (2025-12-01) on
    compute capability >= 10.0 puts cuDNN attention first, which the save list lacks: False."""
    ac_early_stop: bool | None = None
    """Foreign recipes under ac 'full': whether the run's checkpoint stops its recompute once
    every saved tensor is back (time/ac_early_stop.py; None: the recipe's
    `Recipe.ac_early_stop`). A published row's `layout.ac_early_stop`: torchtitan from
    25413d224 (PR #1580, 2025-08-29) passes its `ActivationCheckpoint.early_stop`, default
    False, where it left torch's default (on) before: false."""
    fused_norm: bool = False
    """Foreign recipes: the run's RMSNorm is a fused kernel that saves its 16-bit input and an
    fp32 rstd per token (torchtitan's 'fused_rmsnorm'), not an fp32 upcast of its input."""
    runtime_context_bytes: float | None = None
    """Foreign recipes: the CUDA context (+ kernels) of the run's own runtime as measured on
    its cards (None: the recipe's `cuda_context_bytes`)."""
    assumed: tuple[str, ...] = ()
    """The framework defaults the recipe filled in for fields the user did not give, one line
    each with its source (`recipes.defaults.apply_defaults`); `explain` prints them."""
    comm_overlap: tuple[str, ...] = ()
    """Foreign recipes: communication families the run states it overlaps with compute on top
    of its framework's defaults (`time.efficiency.COMM_OVERLAP`), from
    `time.efficiency.STATED_OVERLAPS` (a published run's configuration, e.g. Transformer
    Engine's userbuffers TP overlap, Megatron --tp-comm-overlap / NeMo
    ub_tp_comm_overlap: 'tp'); () = the framework's defaults only."""
    pp_scatter_gather: bool = False
    """Foreign recipes: the run's pipeline sends are Megatron-LM's 2021-2023 scatter/gather
    (megatron/p2p_communication.py _communicate, --scatter-gather-tensors-in-pipeline on by
    default from 72e4230 (2021-02) until the move into megatron/core, 39b83c7 (2023-01)):
    without SP each tp rank sends 1/tp of the boundary tensor and the receivers all-gather it
    over the tp group; the sends are blocking (batch_isend_irecv, then wait and
    torch.cuda.synchronize), so the interleaved schedule does not overlap them (that came
    with overlap_p2p_comm, f9283c5, 2023-05). A published row's `layout.pp_scatter_gather`."""
    head_wgrad_deferred: int = 0
    """Foreign recipes, pp > 1: micro-batches whose output layer's weight-gradient GEMM the run
    defers to the pipeline flush (Megatron-Core ModelParallelConfig.
    defer_embedding_wgrad_compute with wgrad_deferral_limit: tensor_parallel/layers.py buffers
    the head's grad_output while fewer than the limit are held, pipeline_parallel/schedules.py
    finish_embedding_wgrad_compute runs them after the schedule); 0 = none. A published row's
    `layout.head_wgrad_deferred` (the limit, or m where the limit is 0 = all)."""
    pp_schedule_microbatches: int = 0
    """Foreign recipes, pp > 1: micro-batches per pipeline schedule call, the step's m being
    m / this calls accumulated (`time.pipeline.schedule_microbatches`: NeMo AutoModel runs one
    torch.distributed.pipelining schedule per local batch); 0 = one call over all of the step's
    micro-batches. Sizes the torch stages' per-micro-batch buffers and the in-flight count
    (`recipes.memory`) and the bubble, paid once per call (`time.step_time._compute_side`).
    A published row's `layout.pp_schedule_microbatches`."""
    moe_dispatcher: str = "unstated"
    """Foreign recipes (Megatron-Core's): the run's MoE token dispatcher, a
    `config.choices.MoeDispatcher` name; 'alltoall' adds its chunk sorts by local expert and
    its fp8 padding copies to the routed rows' traffic (time/moe_traffic.py). A published
    row's `layout.moe_dispatcher`."""
    dist_optimizer: str = "unstated"
    """Foreign recipes (NeMo's): the run's optimizer as its NeMo 1.x YAML names it, a
    `config.choices.DistOptimizer` name ('apex_distributed_fused_adam': Apex's
    DistributedFusedAdam, whose gradient buffer, master shard and state dtypes differ from
    Megatron-Core's DistributedOptimizer; 'unstated': the recipe's). A published row's
    `layout.dist_optimizer` (planner/recipes/dist_optim.py)."""
    grad_sync_dtype: str = "unstated"
    """Foreign recipes (Megatron-Core's): the run's gradient buffer / reduction dtype
    (`config.choices.SyncDtype`; NeMo's optim.grad_sync_dtype; 'unstated': fp32). A published
    row's `layout.grad_sync_dtype`."""
    optimizer_dtype: str = "unstated"
    """Foreign recipes (NeMo's, Apex DistributedFusedAdam): the optimizer state dtype
    (`config.choices.SyncDtype`; NeMo's optim.dtype; 'unstated': fp32). A published row's
    `layout.optimizer_dtype`."""
    fp8_params: bool | None = None
    """Foreign recipes (NeMo's, Apex DistributedFusedAdam): the run's YAML `fp8_params`, which
    makes the optimizer store its master shard (store_params) whatever the precision; None: on
    under fp8 precision, off otherwise. A published row's `layout.fp8_params`."""
    calibration: Calibration | None = None
    """Efficiency constants a run on this device measured (`time.calibration`; `plan
    --calibration`); None: the defaults."""
    lora_rank: int = 0
    """`lora.rank`: 0 = no LoRA (every parameter trains)."""
    lora_targets: tuple[str, ...] = ()
    """`lora.targets`: the projections with adapters."""
    lora_base: str = "auto"
    """`lora.base_dtype`: how the frozen projections are stored ('auto', 'bf16', 'int8',
    'nf4'; `memory.lora`)."""
    lora_quantizer: str = "native"
    """Whose quantized linear runs an 'nf4' base (`memory.lora.LORA_QUANTIZERS`): 'native'
    (the trainer's, torchao's NF4Tensor) or 'bitsandbytes' / 'bitsandbytes-dq' (bitsandbytes'
    Linear4bit as LitGPT's QLoRA runs it under Fabric's 'nf4' / 'nf4-dq': `memory.lora`). A
    published row's `lora.quantizer`."""
    lora_dropout: float = 0.0
    """The adapters' dropout probability (PEFT's `lora_dropout`, torchtune's and LitGPT's
    `lora_dropout`): > 0 keeps a dropped copy of each adapter's input and its mask
    (`memory.lora.lora_dropout_bytes`); 0: none. A published row's `lora.dropout`."""
    lora_fused_qkv: bool = False
    """q, k and v adapters share one dropout and one A (LitGPT's LoRAQKVLinear): one dropped
    copy for them (`memory.lora.lora_dropout_bytes`). A published row's `lora.fused_qkv`."""
    beta1: float = OptimConfig.beta1
    """`optim.beta1` (its default): with 'adafactor', > 0 keeps a first moment, one more fp32
    state per parameter (`memory.states.optimizer_bytes`); the other optimizers' states do not
    depend on it."""
    eager_optimizer_step: bool | None = None
    """'adamw8bit': whether torchao's per-parameter step runs eagerly (its fp32 temporaries,
    `memory.states.eager_step_bytes`). None: the trainer's rule (trainer/optim.py
    `_adamw8bit_class`: `torch.compile`d on a GPU, eager on a CPU); True: eager anyway, as
    the dry-run steps it (fake tensors cannot be compiled), for planner-vs-dry-run checks."""

    # Derived once per plan (the search reads them for every rank and moment; `_derived`).
    @_derived
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step (`config.grad_accum_steps`)."""
        return grad_accum_steps(self.global_batch, self.micro_batch, self.layout.dp)

    @_derived
    def pp_call_microbatches(self) -> int:
        """Micro-batches per pipeline schedule call (`time.pipeline.schedule_microbatches` of
        `pp_schedule_microbatches`; `grad_accum` when 0 or pp = 1)."""
        m = max(1, self.grad_accum)
        if self.layout.pp == 1:
            return m
        return schedule_microbatches(m, self.pp_schedule_microbatches, self.layout.pp)

    @_derived
    def compute_bytes(self) -> int:
        """Bytes per activation element of `precision` (the precision table's fact,
        `config.compute_bytes`)."""
        return compute_bytes(self.precision)

    @_derived
    def saved_precision(self) -> str:
        """The precision whose saved set a block's Linears keep (the activation terms):
        `precision`, but 'bf16' for torchao's fp8, whose Float8Linear saves its 16-bit input
        and weight (torchao 0.18 float8/float8_linear.py
        `matmul_with_hp_or_float8_args.forward`: `save_for_backward(input_hp, weight_hp_t)`),
        as a plain bf16 Linear does. MoE models keep 'fp8': their experts run our
        `Float8ExpertLinear` whatever the backend (`precision.apply_fp8`)."""
        torchao = self.fp8_backend == "torchao" and self.recipe == "scaletrain"
        if self.precision == "fp8" and torchao and not self.model.is_moe:
            return "bf16"
        return self.precision

    @_derived
    def gathers_fp8(self) -> bool:
        """FSDP2 (ZeRO-2/3) gathers the fp8 Linears' weights as float8 and keeps them so:
        torchao's fp8 all-gather (`precision.fp8_all_gather` on torchao's backend, torchao 0.18
        float8/fsdp_utils.py `WeightWithDynamicFloat8CastTensor.fsdp_post_all_gather` returns a
        `Float8TrainingTensor`, 1 B per weight, which the Linear uses uncast). Ours gathers
        E4M3 but dequantizes to bf16 (`precision/fp8_fsdp.py`): no memory saved there."""
        return (
            self.fp8_all_gather
            and self.precision == "fp8"
            and self.fp8_backend == "torchao"
            and self.recipe == "scaletrain"
            and self.layout.zero >= 2
        )

    @_derived
    def lora(self) -> tuple[int, tuple[str, ...], str] | None:
        """(rank, targets, base dtype) with LoRA, else None (a cache key)."""
        return (self.lora_rank, self.lora_targets, self.lora_base) if self.lora_rank else None


@dataclass
class MemoryBreakdown:
    """Bytes per GPU for one rank (the worst one in an Estimate)."""

    params: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    buffers: float = 0.0
    """Sum of the named `buffer_terms`."""
    total: float = 0.0
    """Allocated peak."""
    reserved: float = 0.0
    """Allocator's reservation (what OOMs and nvidia-smi see)."""
    capacity: float = 0.0
    fits: bool = True
    rank: int = 0
    buffer_terms: dict[str, float] = field(default_factory=dict)
    """Named buffer terms (communication staging, allocator reserve, runtime context, ...)."""
    detail: dict[str, float] = field(default_factory=dict)
    """Optional finer terms (e.g. 'activations.logits', 'params.unsharded_in_flight')."""
    moment: str = ""
    """The moment that set the peak (e.g. 'loss backward on the last stage'); empty when the
    memory model names none (framework recipes)."""
    host: float = 0.0
    """Host memory per node, bytes: what every rank of a node offloads (optimizer states,
    parameters, activations; `memory.offload`) at its peak."""
    host_capacity: float = 0.0
    """Host RAM per node (`hardware.host_memory_gib`); 0 = unknown, not checked."""

    @property
    def host_fits(self) -> bool:
        return self.host_capacity <= 0 or self.host <= self.host_capacity

    def to_json(self) -> dict[str, Any]:
        return {
            "params": int(self.params),
            "grads": int(self.grads),
            "optimizer": int(self.optimizer),
            "activations": int(self.activations),
            "buffers": int(self.buffers),
            "total": int(self.total),
            "reserved": int(self.reserved),
            "capacity": int(self.capacity),
            "fits": bool(self.fits),
            "rank": int(self.rank),
            "host": int(self.host),
            "host_capacity": int(self.host_capacity),
        }


@dataclass
class TimeBreakdown:
    step_s: float = 0.0
    compute_s: float = 0.0
    comm_exposed_s: float = 0.0
    bubble_s: float = 0.0
    optimizer_s: float = 0.0
    overhead_s: float = 0.0
    """A calibration's per-step time outside the other terms (data wait, clipping, ...)."""
    comm_total_s: float = 0.0
    """All communication time, overlapped or not."""
    overlap_sm_s: float = 0.0
    """Compute lost to the SMs the overlapped NCCL collectives hold (time.overlap_sm)."""
    host_bound_s: float = 0.0
    """What the host's issue time adds beyond the device-side terms (ZeRO-3's module hooks,
    time.zero3_fetch.zero3_hook_host_s); in step_s."""
    comm_terms: dict[str, float] = field(default_factory=dict)
    """Seconds per collective family per step (e.g. 'dp_allreduce', 'tp_allgather')."""

    def to_json(self) -> dict[str, Any]:
        return {
            "step_s": self.step_s,
            "compute_s": self.compute_s,
            "comm_exposed_s": self.comm_exposed_s,
            "bubble_s": self.bubble_s,
        }


@dataclass
class Estimate:
    plan: PlanInput
    memory: MemoryBreakdown
    time: TimeBreakdown
    flops_per_token: float
    tokens_per_s: float
    mfu: float
    notes: list[str] = field(default_factory=list)
    """Conventions used (causal halving, optimizer bytes convention, ...)."""

    def to_json(self) -> dict[str, Any]:
        p, L = self.plan, self.plan.layout
        return {
            "plan": {
                "model": p.model.name,
                "params": p.model.num_params(),
                "gpus": p.num_gpus,
                "dp": L.dp,
                "zero": L.zero,
                "tp": L.tp,
                "sp": L.sp,
                "pp": L.pp,
                "pp_schedule": L.pp_schedule,
                "pp_virtual": L.pp_virtual,
                "cp": L.cp,
                "ep": L.ep,
                "micro_batch": p.micro_batch,
                "grad_accum": p.grad_accum,
                "seq_len": p.seq_len,
                "precision": p.precision,
                "ac": p.ac,
                "offload": p.offload,
                **({"recipe": p.recipe} if p.recipe != "scaletrain" else {}),
                **(
                    {"lora": {"rank": p.lora_rank, "base_dtype": p.lora_base}}
                    if p.lora_rank
                    else {}
                ),
            },
            "memory": self.memory.to_json(),
            "time": self.time.to_json(),
            "flops_per_token": int(self.flops_per_token),
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
        }


PLANNED_FIELDS: dict[str, frozenset[str]] = {
    "model": frozenset({"*"}),
    "hardware": frozenset({"*"}),
    "parallel": frozenset(
        {"dp", "zero", "dp_replicate", "tp", "sp", "pp", "pp_schedule", "pp_virtual", "cp", "ep"}
        | {"layout"}
    ),
    "batch": frozenset({"global_batch", "micro_batch", "seq_len"}),
    "precision": frozenset(
        {"dtype", "tf32", "fp8_all_gather", "fp8_backend", "fp8_scaling", "fp8_amax", "fp8_matmul"}
    ),
    "memory": frozenset({"ac", "offload", "loss_chunk_tokens"}),
    "optim": frozenset({"name", "beta1"}),
    "train": frozenset({"compile"}),
    "lora": frozenset({"rank", "targets", "base_dtype"}),
}
"""The job fields a plan reads, by section ("*": all of them), as `plan_input_from_job` maps
them: the whole model (`ModelConfig`) and hardware (`HardwareConfig.spec`, the price and
energy figures), the layout (`parallel.layout` says whether it is searched), the batch, the
optimizer's state size, and what changes bytes or rates (the fp8 recipe fields pick fp8's
backend: `config.fp8_backend_for`). The rest (learning rate, schedule, loss scaling, delayed
scaling's history length, gradient compression, data, checkpoints, guard, monitor, LoRA's
alpha and dropout, ...) changes neither memory nor time in the planner's model; `plan` says
so when one is given on its command line (`cli._job.unplanned`).
tests/planner/test_planned_fields.py holds this set to what `plan_input_from_job` reads."""


def plan_input_from_job(
    job: JobConfig, layout: Layout, *, hardware: HardwareSpec | None = None
) -> PlanInput:
    """The planner's view of a training job run with `layout`: the one place that maps a
    JobConfig onto a PlanInput (trainer ledger, verify, dry-run, report all use it)."""
    return PlanInput(
        model=job.model,
        hardware=hardware or job.hardware_spec(),
        num_gpus=layout.world_size,
        layout=layout,
        seq_len=job.batch.seq_len,
        global_batch=job.batch.global_batch,
        micro_batch=job.batch.micro_batch,
        precision=job.precision.dtype,
        ac=job.memory.ac,
        offload=job.memory.offload,
        optimizer=job.optim.name,
        beta1=job.optim.beta1,
        compile=job.train.compile,
        efficiency=job.hardware.efficiency,
        fp8_all_gather=(job.precision.dtype == "fp8" and job.precision.fp8_all_gather),
        fp8_backend=_fp8_backend(job, hardware or job.hardware_spec()),
        loss_chunk_tokens=job.memory.loss_chunk_tokens,
        lora_rank=job.lora.rank,
        lora_targets=job.lora.target_names if job.lora.enabled else (),
        lora_base=job.lora.base_dtype if job.lora.enabled else "auto",
    )


def _fp8_backend(job: JobConfig, hardware: HardwareSpec) -> str:
    """Whose Float8Linear a run of `job` on `hardware` converts its Linears to: the trainer's
    rule (`config.fp8_backend_for`, as `PrecisionConfig.fp8_backend_on`), its fields read here
    so that `PLANNED_FIELDS` sees them; 'scaletrain' off fp8 (unused)."""
    p = job.precision
    if p.dtype != "fp8":
        return "scaletrain"
    return fp8_backend_for(
        p.fp8_backend,
        scaling=p.fp8_scaling,
        amax=p.fp8_amax,
        matmul=p.fp8_matmul,
        device_type=hardware.device_type,
    )


def layout_label(e: Estimate) -> str:
    """Compact plan name, e.g. 'dp2 z3 tp2+sp pp8(1f1b) cp4 mb1x8 ac=selective': the layout's
    own label (`Layout.label`) plus micro-batching, checkpointing and offload."""
    p = e.plan
    parts = [p.layout.label(), f"mb{p.micro_batch}x{p.grad_accum}"]
    if p.ac != "none":
        parts.append(f"ac={p.ac}")
    if p.offload != "none":
        parts.append(f"offload={p.offload}")
    if p.lora_rank:
        parts.append(f"lora r{p.lora_rank}" + (f" {p.lora_base}" if p.lora_base != "auto" else ""))
    return " ".join(parts)
