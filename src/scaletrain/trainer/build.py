"""build_* functions: each takes the narrow config sections it reads and returns one object."""

from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.config import (
    ConfigError,
    HardwareSpec,
    JobConfig,
    ParallelConfig,
    hardware_preset,
)
from scaletrain.data import DataBundle, build_data
from scaletrain.models import build_model, causal_lm_loss, materialize
from scaletrain.parallel import ParallelDims, parallelize
from scaletrain.parallel.launch import elastic_store
from scaletrain.parallel.pipeline import PipelineRuntime
from scaletrain.planner.flops import flops_per_token

from .optim import build_optimizer
from .precision import LossScaler

__all__ = ["DistEnv", "Run", "build_run", "init_distributed", "detect_hardware",
           "resolve_device", "tp_mesh"]


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


def init_distributed(*, device_pref: str) -> DistEnv:
    """Join the torchrun/spawn process group if one is described by the environment.

    gloo on CPU, NCCL on GPU. A plain `python` run is world size 1 with no process group: the
    parallel code treats every degree-1 axis as a no-op.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_pref, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(minutes=10)
        # under torchrun: a key namespace of this attempt's own in the agent's store, which
        # outlives restarts (stale keys of a killed attempt break the restarted group)
        store = elastic_store(rank, world_size, timeout)
        if store is None:
            dist.init_process_group(backend, timeout=timeout)
        else:
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=timeout)
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


_GPU_NAMES = (("H200", "h200"), ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"),
              ("B200", "b200"), ("A100-SXM4-40GB", "a100-40gb"), ("A100", "a100-80gb"),
              ("V100", "v100-32gb"), ("4090", "rtx4090"), ("3090", "rtx3090"),
              ("MI300X", "mi300x"))


def detect_hardware(job: JobConfig, device: torch.device) -> HardwareSpec:
    """The hardware preset for MFU: the configured one, or the visible GPU's, or 'cpu'."""
    if job.hardware.gpu != "cpu" or device.type != "cuda":
        return job.hardware.spec()
    name = torch.cuda.get_device_name(device)
    for key, preset in _GPU_NAMES:
        if key in name:
            return hardware_preset(preset)
    return job.hardware.spec()


def tp_mesh(dims: ParallelDims):
    """The tensor-parallel submesh when tp > 1 (the loss runs under loss_parallel), else None."""
    return dims.submesh("tp") if dims.mesh is not None and dims.tp > 1 else None


@dataclass
class Run:
    """Everything built from the plan for one rank."""

    job: JobConfig
    env: DistEnv
    dims: ParallelDims
    grad_accum: int
    data: DataBundle
    model: torch.nn.Module
    """The module the optimizer and checkpoints see (pipeline: this rank's stages)."""
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scaler: LossScaler
    hardware: HardwareSpec
    pipeline: PipelineRuntime | None = None

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
        return (f"scaletrain: {m.name} ({m.num_params():,} params) | {self.dims.layout} | "
                f"world {self.env.world_size} on {self.device.type} | grad accum "
                f"{self.grad_accum} | {self.data.describe()}")


def _check_vocab(job: JobConfig, data: DataBundle) -> None:
    if data.tokenizer.vocab_size > job.model.vocab_size:
        raise ConfigError("model.vocab_size", job.model.vocab_size,
                          f"the {data.tokenizer.name} tokenizer has {data.tokenizer.vocab_size} "
                          "ids: raise model.vocab_size or choose a smaller tokenizer")


def _build_pipeline(job: JobConfig, dims: ParallelDims, model: torch.nn.Module,
                    scaler: LossScaler, device: torch.device, grad_accum: int
                    ) -> tuple[torch.nn.Module, PipelineRuntime]:
    from scaletrain.parallel.pipeline import build_pipeline

    def parallelize_stage(stage: torch.nn.Module) -> torch.nn.Module:
        stage = parallelize(stage, dims, precision=job.precision, memory=job.memory,
                            compile=job.train.compile, loss_parallel=False)
        materialize(stage, device=device, seed=job.train.seed)
        return stage

    runtime = build_pipeline(
        model, pp_group=dims.submesh("pp"), pp_rank=dims.pp_rank, pp_size=dims.pp,
        schedule=dims.layout.pp_schedule, virtual=dims.layout.pp_virtual,
        n_microbatches=grad_accum, device=device, parallelize_stage=parallelize_stage,
        loss_fn=lambda logits, targets: scaler.scale_loss(causal_lm_loss(logits, targets)),
        loss_scale=lambda: scaler.scale, cp_group=dims.submesh("cp"))
    stages = torch.nn.ModuleDict({f"stage{sid}": mod
                                  for sid, mod in zip(runtime.stage_ids, runtime.stages,
                                                      strict=True)})
    return stages, runtime


def auto_layout(job: JobConfig, world_size: int, hardware: HardwareSpec) -> JobConfig:
    """The job with the planner's fastest fitting layout for `world_size` ranks.

    Only degrees (dp, ZeRO stage, tp, sp, pp + schedule, cp, ep) are chosen: the micro-batch
    and activation-checkpointing policy stay as configured, so the data stream is the one asked
    for. Prints the choice and why the runner-up families lost.
    """
    from scaletrain.planner.search import layout_of, search

    result = search(job.model, hardware, world_size, seq_len=job.batch.seq_len,
                    global_batch=job.batch.global_batch, precision=job.precision.dtype,
                    optimizer=job.optim.name, top_k=1, micro_batch=job.batch.micro_batch,
                    ac=job.memory.ac, offload=job.memory.offload)
    best = result.best
    if best is None:
        raise ConfigError("parallel.layout", "auto",
                          f"no layout of {world_size} ranks fits {hardware.name} memory for this "
                          "model and batch: lower batch.micro_batch, set memory.ac=full, or add "
                          "ranks")
    L = best.plan.layout
    chosen = dataclasses.replace(job, parallel=ParallelConfig.from_layout(L))
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        print(f"layout auto: planner chose {layout_of(best)} "
              f"(predicted {best.time.step_s * 1e3:.1f} ms/step, "
              f"{best.memory.total / 2**20:,.1f} MiB/rank)")
        for family, why in list(result.why_others_lost().items())[:4]:
            print(f"  {family}: {why}")
    verdict = [preflight(chosen, world_size, best) if rank == 0 else None]
    if dist.is_initialized():  # every rank learns the verdict before any of them goes on
        dist.broadcast_object_list(verdict, src=0)
    measured, text = verdict[0]
    if rank == 0:
        print(text)
    if measured is not None and measured > hardware.memory_bytes:
        raise ConfigError("parallel.layout", "auto",
                          f"the preflight dry-run of {layout_of(best)} measured "
                          f"{measured / 2**30:.2f} GiB per rank, more than the "
                          f"{hardware.memory_bytes / 2**30:.2f} GiB of {hardware.name}: name the "
                          "degrees yourself (see `scaletrain plan`), lower batch.micro_batch or "
                          "set memory.ac=full")
    return chosen


def _preflight_child(job: JobConfig, world_size: int, rank: int, out: Any) -> None:
    from scaletrain.measure.dryrun import dryrun

    try:
        m = dryrun(job, world_size=world_size, rank=rank, count_flops=False)
        out.put(("ok", m.memory.total, None))
    except ConfigError as e:  # a layout the dry-run cannot drive
        out.put(("skip", None, str(e)))
    except Exception as e:  # noqa: BLE001 - reported, never fatal: the plan stands on its own
        out.put(("error", None, f"{type(e).__name__}: {e}"))


def preflight(job: JobConfig, world_size: int, estimate: Any) -> tuple[float | None, str]:
    """Dry-run `job` as the planner's worst rank, in a fresh process (a fake process group
    cannot live beside this process's real one). Returns (measured peak bytes or None, a line).
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    rank = estimate.memory.rank
    proc = ctx.Process(target=_preflight_child, args=(job, world_size, rank, q), daemon=True)
    proc.start()
    try:
        status, measured, why = q.get(timeout=600)
    except Exception:  # noqa: BLE001 - the child died or hung: say so, train on the plan
        status, measured, why = "error", None, f"the dry-run process exited ({proc.exitcode})"
    proc.join(timeout=10)
    if status != "ok":
        return None, f"preflight: not run ({why})"
    err = (estimate.memory.total - measured) / measured
    return measured, (f"preflight dry-run (rank {rank} of {world_size}): "
                      f"{measured / 2**20:,.1f} MiB measured, planner {err:+.1%}")


def build_run(job: JobConfig) -> Run:
    """Process group, mesh, data, model (built on meta, parallelized, materialized), optimizer."""
    env = init_distributed(device_pref=job.train.device)
    if job.parallel.layout == "auto" and not job.parallel.names_degrees and env.world_size > 1:
        job = auto_layout(job, env.world_size, detect_hardware(job, env.device))
    layout = job.layout(env.world_size)
    dims = ParallelDims.from_layout(layout, env.world_size)
    if env.world_size > 1:  # a 1-rank job needs no process group: every axis is a no-op
        dims.build_mesh(env.device.type)
    grad_accum = job.batch.global_batch // (job.batch.micro_batch * layout.dp)
    torch.manual_seed(job.train.seed)
    data = build_data(job.data, seq_len=job.batch.seq_len, micro_batch=job.batch.micro_batch,
                      grad_accum=grad_accum, dp_rank=dims.dp_rank, dp_size=layout.dp,
                      seed=job.data.seed)
    _check_vocab(job, data)
    scaler = LossScaler(job.precision)
    model = build_model(job.model, device="meta")
    pipeline = None
    if layout.pp > 1:
        model, pipeline = _build_pipeline(job, dims, model, scaler, env.device, grad_accum)
    else:
        model = parallelize(model, dims, precision=job.precision, memory=job.memory,
                            compile=job.train.compile)
        materialize(model, device=env.device, seed=job.train.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, optim=job.optim, device_type=env.device.type, dims=dims,
                                offload=job.memory.offload)
    return Run(job=job, env=env, dims=dims, grad_accum=grad_accum, data=data, model=model,
               params=params, optimizer=optimizer, scaler=scaler,
               hardware=detect_hardware(job, env.device), pipeline=pipeline)
