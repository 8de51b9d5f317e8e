"""build_* functions: each takes the narrow config sections it reads and returns one object."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from scaletrain import clock
from scaletrain.config import (
    ConfigError,
    HardwareSpec,
    JobConfig,
    grad_accum_steps,
    hardware_preset,
    offload_states,
    offloads_activations,
)
from scaletrain.config.launch_env import launch_env
from scaletrain.data import DataBundle, build_data
from scaletrain.models import Transformer, build_model, causal_lm_loss, materialize
from scaletrain.models.lora import apply_lora
from scaletrain.parallel import ParallelDims, parallelize
from scaletrain.parallel.launch import rendezvous_store
from scaletrain.parallel.pipeline import PipelineRuntime
from scaletrain.planner.time.flops import flops_per_token
from scaletrain.precision.fp8_matmul import Fp8MatmulChoice, choose_fp8_matmul

from .activation_offload import NO_OFFLOAD, ActivationOffload, build_activation_offload
from .optim import build_optimizer
from .precision import LossScaler, check_device_precision, set_tf32

__all__ = [
    "DistEnv",
    "Run",
    "build_run",
    "init_distributed",
    "detect_hardware",
    "resolve_device",
    "tp_mesh",
    "require_data",
]


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(pref: str, local_rank: int) -> torch.device:
    if pref == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device", pref, "no CUDA device is visible: use 'cpu' or 'auto'")
    if pref == "cpu" or (pref == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def init_distributed(*, device_pref: str, rendezvous_timeout_s: float = 300.0) -> DistEnv:
    """Join the torchrun/spawn process group if one is described by the environment.

    gloo on CPU, NCCL on GPU. A plain `python` run is world size 1 with no process group: the
    parallel code treats every degree-1 axis as a no-op. The environment is checked first
    (`config.launch_env`), and a rank whose peers do not all arrive within
    `rendezvous_timeout_s` ends in a one-line `ConfigError` (`parallel.launch.rendezvous_store`).
    """
    le = launch_env()
    rank, world_size, local_rank = le.rank, le.world_size, le.local_rank
    device = resolve_device(device_pref, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        store = rendezvous_store(le, datetime.timedelta(seconds=rendezvous_timeout_s))
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(minutes=10),
        )
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


_GPU_NAMES = (
    ("H200", "h200"),
    ("H100 PCIe", "h100-pcie"),
    ("H100", "h100-sxm"),
    ("B200", "b200"),
    ("A100-SXM4-40GB", "a100-40gb"),
    ("A100", "a100-80gb"),
    ("V100", "v100-32gb"),
    ("4090", "rtx4090"),
    ("3090", "rtx3090"),
    ("MI300X", "mi300x"),
)


def detect_hardware(job: JobConfig, device: torch.device) -> HardwareSpec:
    """The hardware preset for MFU: the configured one, or the visible GPU's, or 'cpu'."""
    if not job.hardware.spec().is_cpu or device.type != "cuda":
        return job.hardware_spec()
    name = torch.cuda.get_device_name(device)
    for key, preset in _GPU_NAMES:
        if key in name:  # the job's TF32 choice sets its fp32 rate (JobConfig.hardware_spec)
            return dataclasses.replace(hardware_preset(preset), tf32=job.precision.tf32)
    return job.hardware_spec()


def tp_mesh(dims: ParallelDims) -> DeviceMesh | None:
    """The tensor-parallel submesh when tp > 1 (the loss runs under loss_parallel), else None."""
    return dims.submesh("tp") if dims.mesh is not None and dims.tp > 1 else None


@dataclass
class Run:
    """Everything built from the plan for one rank."""

    job: JobConfig
    env: DistEnv
    dims: ParallelDims
    grad_accum: int
    data: DataBundle | None
    """None when built without data (`build_run(data=False)`: the dry-run feeds batches)."""
    model: torch.nn.Module
    """The module the optimizer and checkpoints see (pipeline: this rank's stages)."""
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scaler: LossScaler
    hardware: HardwareSpec
    pipeline: PipelineRuntime | None = None
    fp8_matmul: Fp8MatmulChoice | None = None
    """fp8 runs: the GEMM kernel on this device and why (`precision.fp8_matmul`), for the
    run's start line; None otherwise."""
    activation_offload: ActivationOffload = NO_OFFLOAD
    """The saved-tensor hooks the step's forwards run under (`memory.offload` with
    '+activations'; `trainer.activation_offload`)."""

    @property
    def device(self) -> torch.device:
        return self.env.device

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    @property
    def run_dir(self) -> Path:
        return Path(self.job.train.run_dir)

    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def tokens_per_step(self) -> int:
        return self.job.batch.global_batch * self.job.batch.seq_len

    def mfu(self, tokens_per_s: float) -> float:
        """Model FLOPs utilisation with the planner's FLOPs-per-token formula (one convention
        for predicted and measured MFU: model FLOPs, causal attention halved)."""
        peak = self.hardware.flops(self.job.precision.dtype) * self.env.world_size
        return tokens_per_s * flops_per_token(self.job.model, self.job.batch.seq_len) / peak

    def describe(self) -> str:
        m = self.job.model
        return (
            f"scaletrain: {m.name} ({m.num_params():,} params) | {self.dims.layout} | "
            f"world {self.env.world_size} on {self.device.type} | grad accum "
            f"{self.grad_accum} | {self.data.describe() if self.data else 'no data'}"
        )


def require_data(run: Run, use: str) -> DataBundle:
    """`run.data` for code that reads the corpus or the tokenizer (`use` says which); a run
    built with `build_run(data=False)` (the dry-run) has none."""
    if run.data is None:
        raise RuntimeError(
            f"{use} needs the run's data, and this run was built without it "
            "(build_run(..., data=False)): build it with data=True"
        )
    return run.data


def _check_vocab(job: JobConfig, data: DataBundle) -> None:
    if data.tokenizer.vocab_size > job.model.vocab_size:
        raise ConfigError(
            "model.vocab_size",
            job.model.vocab_size,
            f"the {data.tokenizer.name} tokenizer has {data.tokenizer.vocab_size} "
            "ids: raise model.vocab_size or choose a smaller tokenizer",
        )


def _build_pipeline(
    job: JobConfig,
    dims: ParallelDims,
    model: Transformer,
    scaler: LossScaler,
    device: torch.device,
    grad_accum: int,
    *,
    ddp: bool,
    schedule_cls: Any,
    fp8_device: str,
) -> tuple[torch.nn.Module, PipelineRuntime]:
    """This rank's pipeline stages (parallelized on meta, not yet materialized) and runtime."""
    from scaletrain.parallel.pipeline import build_pipeline

    def parallelize_stage(stage: Transformer) -> Transformer:
        return parallelize(
            stage,
            dims,
            precision=job.precision,
            memory=job.memory,
            compile=job.train.compile,
            loss_parallel=False,
            ddp=ddp,
            fp8_device=fp8_device,
        )

    runtime = build_pipeline(
        model,
        pp_group=dims.submesh("pp"),
        pp_rank=dims.pp_rank,
        pp_size=dims.pp,
        schedule=dims.layout.pp_schedule,
        virtual=dims.layout.pp_virtual,
        n_microbatches=grad_accum,
        device=device,
        parallelize_stage=parallelize_stage,
        loss_fn=lambda logits, targets: scaler.scale_loss(causal_lm_loss(logits, targets)),
        loss_scale=lambda: scaler.scale,
        schedule_cls=schedule_cls,
        cp_group=dims.submesh("cp"),
    )
    stages = torch.nn.ModuleDict(
        {f"stage{sid}": mod for sid, mod in zip(runtime.stage_ids, runtime.stages, strict=True)}
    )
    return stages, runtime


def _build_data_bundle(
    job: JobConfig, dims: ParallelDims, env: DistEnv, grad_accum: int
) -> DataBundle:
    """This dp rank's corpus and loader, checked against the model's vocabulary."""
    with clock.phase("data"):  # corpus download/tokenization/shards, or the cached shards
        bundle = build_data(
            job.data,
            seq_len=job.batch.seq_len,
            micro_batch=job.batch.micro_batch,
            grad_accum=grad_accum,
            dp_rank=dims.dp_rank,
            dp_size=dims.layout.dp,
            seed=job.data.seed,
            progress=job.train.progress and env.is_main,
            sweep_stale=env.local_rank == 0,  # leftovers are judged per host: one per host
        )
    _check_vocab(job, bundle)
    return bundle


def _build_parallel_model(
    job: JobConfig,
    dims: ParallelDims,
    scaler: LossScaler,
    device: torch.device,
    grad_accum: int,
    *,
    ddp: bool,
    schedule_cls: Any,
    fp8_device: str,
) -> tuple[torch.nn.Module, PipelineRuntime | None]:
    """The model built on meta and parallelized (not yet materialized): this rank's pipeline
    stages and runtime when pp > 1, else the whole model and None."""
    full = apply_lora(build_model(job.model, device="meta"), job.lora)  # rank 0: no-op
    if dims.layout.pp > 1:
        return _build_pipeline(
            job,
            dims,
            full,
            scaler,
            device,
            grad_accum,
            ddp=ddp,
            schedule_cls=schedule_cls,
            fp8_device=fp8_device,
        )
    model = parallelize(
        full,
        dims,
        precision=job.precision,
        memory=job.memory,
        compile=job.train.compile,
        ddp=ddp,
        fp8_device=fp8_device,
    )
    return model, None


def _materialize_and_optimizer(
    job: JobConfig,
    dims: ParallelDims,
    model: torch.nn.Module,
    pipeline: PipelineRuntime | None,
    *,
    device: torch.device,
    init_weights: bool,
    optimizer_device: str,
) -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer]:
    """Allocate (and initialize) the weights, then build the optimizer over the trainable ones
    (with LoRA: the adapters only, `models.lora`)."""
    # each pipeline stage on its own, as a whole model otherwise (same seed: the weights
    # do not depend on the layout)
    for root in pipeline.stages if pipeline is not None else [model]:
        materialize(root, device=device, seed=job.train.seed, init=init_weights)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(
        params,
        optim=job.optim,
        device_type=optimizer_device,
        dims=dims,
        offload=offload_states(job.memory.offload),
    )
    return params, optimizer


def _fp8_matmul(job: JobConfig, device_type: str) -> Fp8MatmulChoice | None:
    """fp8 runs: the GEMM kernel for `device_type` (on a CPU with 'auto': measured, once per
    process, here — before any fake-tensor context); None otherwise."""
    if job.precision.dtype != "fp8":
        return None
    return choose_fp8_matmul(job.precision.fp8_matmul, device_type)


def _with_fp8_kernel(job: JobConfig, choice: Fp8MatmulChoice | None) -> JobConfig:
    """`job` with 'auto' replaced by the kernel chosen, for building the model: its
    Float8Linears then run that kernel whatever device their tensors report (the dry-run's
    fake tensors are CPU tensors standing for the target's)."""
    if choice is None or job.precision.fp8_matmul == choice.kernel:
        return job
    precision = dataclasses.replace(job.precision, fp8_matmul=choice.kernel)
    return dataclasses.replace(job, precision=precision)


def build_run(
    job: JobConfig,
    *,
    env: DistEnv | None = None,
    data: bool = True,
    init_weights: bool = True,
    materialize_in: contextlib.AbstractContextManager | None = None,
    ddp: bool = True,
    optimizer_device: str | None = None,
    fp8_device: str | None = None,
    schedule_cls: Any = None,
    activation_host: str | None = None,
) -> Run:
    """Process group, mesh, data, model (built on meta, parallelized, materialized), optimizer.

    The defaults build what `scaletrain train` runs. The options are the seams the dry-run
    needs to build the same run under fake tensors, each explicit:
    - `env`: this rank's world (the dry-run's fake process group) instead of joining the one
      the environment describes;
    - `data=False`: no corpus or loader (`Run.data` is None; the caller feeds batches);
    - `init_weights=False`: allocate without drawing initial values (`materialize(init=...)`);
    - `materialize_in`: a context the allocation and the optimizer are built in (the dry-run's
      `FakeTensorMode`); the model is built and parallelized on meta outside it;
    - `ddp=False`: no DDP wrapper (`parallelize(ddp=...)`);
    - `optimizer_device`: the device type the optimizer is chosen for (fused AdamW on GPUs);
    - `fp8_device`: the device type fp8 is resolved for, `precision.fp8_matmul='auto'`'s
      kernel and the Linears' backend (`precision.apply_fp8`: torchao on CUDA): the dry-run
      models the target's, not its host's;
    - `schedule_cls`: the pipeline schedule class (`parallel.pipeline.build_pipeline`);
    - `activation_host`: where offloaded activations go (default the CPU; the dry-run's
      'meta' tells its fake host copies apart from device memory).
    `parallel.layout = "auto"` is resolved above the trainer (`scaletrain.orchestrate`).
    """
    if env is None:
        env = init_distributed(
            device_pref=job.train.device, rendezvous_timeout_s=job.train.rendezvous_timeout_s
        )
        check_device_precision(job.precision, env.device)
        set_tf32(job.precision, env.device)
    layout = job.layout(env.world_size)
    dims = ParallelDims.from_layout(layout, env.world_size)
    if env.world_size > 1:  # a 1-rank job needs no process group: every axis is a no-op
        dims.build_mesh(env.device.type)
    grad_accum = grad_accum_steps(job.batch.global_batch, job.batch.micro_batch, layout.dp)
    torch.manual_seed(job.train.seed)
    bundle = _build_data_bundle(job, dims, env, grad_accum) if data else None
    scaler = LossScaler(job.precision)
    fp8_target = fp8_device or env.device.type
    fp8_matmul = _fp8_matmul(job, fp8_target)
    model, pipeline = _build_parallel_model(
        _with_fp8_kernel(job, fp8_matmul),
        dims,
        scaler,
        env.device,
        grad_accum,
        ddp=ddp,
        schedule_cls=schedule_cls,
        fp8_device=fp8_target,
    )
    with materialize_in or contextlib.nullcontext():
        params, optimizer = _materialize_and_optimizer(
            job,
            dims,
            model,
            pipeline,
            device=env.device,
            init_weights=init_weights,
            optimizer_device=optimizer_device or env.device.type,
        )
    return Run(
        job=job,
        env=env,
        dims=dims,
        grad_accum=grad_accum,
        data=bundle,
        model=model,
        params=params,
        optimizer=optimizer,
        scaler=scaler,
        hardware=detect_hardware(job, env.device),
        pipeline=pipeline,
        fp8_matmul=fp8_matmul,
        activation_offload=build_activation_offload(
            offloads_activations(job.memory.offload),
            env.device,
            torch.device(activation_host) if activation_host else None,
        ),
    )
