"""Orchestration above the trainer and the dry-run: what `scaletrain train` does before and
around `trainer.train`.

`parallel.layout = "auto"` is resolved here: the planner's search picks a fitting layout for
the world size (its rule of thumb: the simplest within 10% of the fastest), and a preflight
dry-run (the trainer's own step under fake tensors, in a fresh process) checks the chosen
layout's memory before any rank allocates. This module sits above both `trainer/` and
`dryrun/`, so neither imports the other's caller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from scaletrain import clock
from scaletrain.config import ConfigError, HardwareSpec, JobConfig, ParallelConfig, fmt_bytes
from scaletrain.config.launch_env import launch_env

__all__ = [
    "auto_layout",
    "available_memory",
    "fit_check",
    "preflight",
    "resolve_layout",
    "train_job",
]


def resolve_layout(job: JobConfig) -> JobConfig:
    """`job` with its layout resolved: unchanged unless `parallel.layout = "auto"` names no
    degree and the run has more than one rank (the process group is joined here)."""
    from scaletrain.trainer.build import detect_hardware, init_distributed

    if job.parallel.layout != "auto" or job.parallel.names_degrees:
        return job
    env = init_distributed(
        device_pref=job.train.device, rendezvous_timeout_s=job.train.rendezvous_timeout_s
    )
    if env.world_size == 1:
        return job
    return auto_layout(job, env.world_size, detect_hardware(job, env.device))


def check_job_paths(job: JobConfig) -> None:
    """The folders a training job writes, checked before any work (one line naming the field):
    the run directory and the data cache."""
    from scaletrain.config.user_files import check_output_dir

    check_output_dir(job.train.run_dir, "train.run_dir")
    check_output_dir(job.data.cache_dir, "data.cache_dir")


def train_job(job: JobConfig) -> Any:
    """`scaletrain train`: resolve the layout, train, and leave no process group behind that
    this call created (torchrun's environment)."""
    from scaletrain.trainer import train

    created = not dist.is_initialized()
    with clock.phase("plan"), _said_once_per_node():
        check_job_paths(job)
        job = resolve_layout(job)
        env = launch_env()
        if not dist.is_initialized() and env.world_size == 1:
            print(fit_check(job))  # a single process: will it fit this host / GPU? (before
            # any tensor is allocated)
        elif "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun: this node's ranks, summed
            line = fit_check(
                job,
                world_size=env.world_size,
                local_ranks=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            )
            if int(os.environ.get("LOCAL_RANK", "0")) == 0:
                print(line)
    result = train(job)
    if created and dist.is_initialized():  # `train` leaves a group it did not create
        dist.barrier()
        dist.destroy_process_group()
    return result


@contextlib.contextmanager
def _said_once_per_node() -> Iterator[None]:
    """A ConfigError of the planning phase (every rank finds the same one) is said by each
    node's local rank 0; the other ranks leave quietly with the same exit code (2)."""
    try:
        yield
    except ConfigError:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            raise
        raise SystemExit(2) from None


def available_memory(device_pref: str) -> tuple[float, str]:
    """(bytes a single process may allocate now, where): free memory of GPU 0 (cudaMemGetInfo),
    or on CPU the host's MemAvailable (/proc/meminfo: free memory plus what the kernel can
    reclaim without swapping), capped by a cgroup v2 memory.max when one is set."""
    from scaletrain.trainer.build import resolve_device

    device = resolve_device(device_pref, 0)
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return float(free), f"GPU {torch.cuda.get_device_name(device)} (free)"
    avail = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = float(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = float(Path("/sys/fs/cgroup/memory.current").read_text())
            avail = min(avail, float(limit) - used)
    return avail, "host memory (MemAvailable)"


def fit_check(
    job: JobConfig,
    available: tuple[float, str] | None = None,
    *,
    world_size: int = 1,
    local_ranks: int = 1,
) -> str:
    """Refuse a run the planner says cannot fit this host, before any rank allocates.

    Every launcher calls it: one process, `--nproc N` (before spawning), torchrun (each node's
    local rank 0, before the model is built). The planner's peak of the job's worst rank at
    `world_size` (`planner.estimate_memory`: the allocator's reservation on a GPU, the allocated
    peak on CPU where no caching allocator holds memory back) is compared with `available`
    (default `available_memory`): on a GPU, per rank against its own GPU; on a CPU, times the
    `local_ranks` that share this host's memory (an upper bound where pipeline stages differ).
    Raises a `ConfigError` naming train.force, the estimate and the shortfall; with
    `train.force = true` it returns a warning line instead. Returns the line to print.
    """
    from scaletrain.planner import estimate_memory
    from scaletrain.planner.types import plan_input_from_job

    avail, where = available or available_memory(job.train.device)
    m = estimate_memory(plan_input_from_job(job, job.layout(world_size)))
    gpu = "GPU" in where
    per_rank = m.reserved if gpu else m.total
    sharing = 1 if gpu else local_ranks  # ranks whose memory adds up against `avail`
    need = per_rank * sharing
    parts = ", ".join(
        f"{k} {_size(getattr(m, k))}"
        for k in ("params", "grads", "optimizer", "activations", "buffers")
    )
    if world_size == 1:
        said = f"the planner puts this single-process run at {_size(need)} ({parts})"
    elif sharing == 1:
        said = f"the planner puts each of the {world_size} ranks at {_size(per_rank)} ({parts})"
    else:
        said = (
            f"the planner puts each of the {world_size} ranks at {_size(per_rank)} ({parts}), "
            f"{sharing} of them on this host: {_size(need)}"
        )
    said += f" and the {where} is {_size(avail)}"
    if need <= avail:
        return f"fit check: {said}: margin {_size(avail - need)}"
    if job.train.force:
        return f"warning: train.force=true: {said}, short by {_size(need - avail)}; training anyway"
    # more ranks help only where they bring memory of their own: GPUs, or other hosts
    more = "more GPUs (--nproc or torchrun)" if gpu else "more hosts (torchrun --nnodes)"
    raise ConfigError(
        "train.force",
        False,
        f"{said}, short by {_size(need - avail)}: use a smaller model or "
        f"batch.micro_batch, memory.ac=full, {more}, or set train.force=true to try anyway",
    )


def _size(b: float) -> str:
    return fmt_bytes(b)


def auto_layout(job: JobConfig, world_size: int, hardware: HardwareSpec) -> JobConfig:
    """The job with the planner's pick for `world_size` ranks (the simplest fitting layout
    within `search.SIMPLER_LAYOUT_MARGIN` of the fastest).

    Only degrees (dp, ZeRO stage, tp, sp, pp + schedule, cp, ep) are chosen: the micro-batch
    and activation-checkpointing policy stay as configured, so the data stream is the one asked
    for. Prints the choice and why the runner-up families lost.
    """
    from scaletrain.planner.search.layouts import search
    from scaletrain.planner.types import layout_label

    result = search(
        job.model,
        hardware,
        world_size,
        seq_len=job.batch.seq_len,
        global_batch=job.batch.global_batch,
        precision=job.precision.dtype,
        optimizer=job.optim.name,
        beta1=job.optim.beta1,
        top_k=1,
        micro_batch=job.batch.micro_batch,
        ac=job.memory.ac,
        offload=job.memory.offload,
    )
    best = result.best
    if best is None:
        raise ConfigError(
            "parallel.layout",
            "auto",
            f"no layout of {world_size} ranks fits {hardware.name} memory for this "
            "model and batch: lower batch.micro_batch, set memory.ac=full, or add "
            "ranks",
        )
    L = best.plan.layout
    chosen = dataclasses.replace(job, parallel=ParallelConfig.from_layout(L))
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        print(
            f"layout auto: planner chose {layout_label(best)} "
            f"(predicted {best.time.step_s * 1e3:.1f} ms/step, "
            f"{fmt_bytes(best.memory.total)}/rank)"
        )
        for family, why in list(result.why_others_lost().items())[:4]:
            print(f"  {family}: {why}")
    verdict: list[Any] = [preflight(chosen, world_size, best) if rank == 0 else None]
    if dist.is_initialized():  # every rank learns the verdict before any of them goes on
        dist.broadcast_object_list(verdict, src=0)
    measured, text = verdict[0]
    if rank == 0:
        print(text)
    if measured is not None and measured > hardware.memory_bytes:
        raise ConfigError(
            "parallel.layout",
            "auto",
            f"the preflight dry-run of {layout_label(best)} measured "
            f"{fmt_bytes(measured, digits=2)} per rank, more than the "
            f"{hardware.capacity_text()} of {hardware.name}: name the "
            "degrees yourself (see `scaletrain plan`), lower batch.micro_batch or "
            "set memory.ac=full",
        )
    return chosen


def _preflight_child(job: JobConfig, world_size: int, rank: int, out: Any) -> None:
    from scaletrain.dryrun import dryrun

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
    return measured, (
        f"preflight dry-run (rank {rank} of {world_size}): "
        f"{fmt_bytes(measured)} measured, planner {err:+.1%}"
    )
