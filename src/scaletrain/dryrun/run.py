"""Dry-run: the trainer's real training step under fake tensors, as one rank of any world size.

No memory is allocated and no kernel runs: `FakeTensorMode` propagates shapes and dtypes, the
`fake` process-group backend (with a `FakeStore`) answers every collective locally, and
`torch.distributed._tools`' trackers (`FSDPMemTracker` for FSDP, `MemTracker` otherwise) count
the bytes each storage would hold, by category. The run is the trainer's own: `build_run`
builds it (with the explicit options a fake run needs: this rank's fake world, no data, no
weight draws, materialization and optimizer inside fake mode, no DDP wrapper, the pipeline
schedule of `torch_compat.ActionSchedule`) and every step is the trainer's `train_step` +
`apply_update`, observed through `StepHooks` (tracker resets, the timeline, state sizes).

Two optimizer steps run; the second one is measured. The first (optimizer-state creation,
FSDP lazy init, DTensor sharding caches) runs before the tracker is created: the tracker's
per-op bookkeeping costs about as much as the step, and what step 1 leaves behind
(parameters, gradients, optimizer states) is registered when the tracker is built, so the
figures are the same as tracking both steps. Each unpipelined step runs min(grad_accum, 2)
micro-batches (`train_step(num_microbatches=...)`): the second already sees accumulated
gradients, which is every state a longer accumulation reaches (peak activations are per
micro-batch), so running all of them would only cost time.

Pipeline parallelism (pp > 1): this rank's stages from the trainer's own build. torch's
schedules cannot run under fake tensors (`torch_compat`), so `ActionSchedule` runs the stages
through the planner's `pipeline_order` for this pp rank, lowered with torch's own passes, with
the receives, sends and their release where the trainer's stages post and let them go
(`parallel/pipeline_stage.py`). Every micro-batch of the step runs, so the activations in
flight at the peak are the schedule's (GPipe: all m; 1F1B: p - rank), and so are the
communication buffers: `memory.detail['pp_boundary_bytes']` is the most stage-boundary tensor
bytes held at once (the planner's `pp_p2p`).

MoE / expert parallelism: the expert dispatch needs token counts as Python ints, which fake
tensors do not have; under fake tensors `models.moe` and `parallel.expert_parallel` assume a
perfectly balanced router (N*k/E assignments per expert on every rank). Real runs with a
skewed router hold more activations on their busiest expert than this measures.

Reading the categories: they are the tracker's breakdown *at the peak moment* (so they add up
to `total`), which is not the size of each state at rest: gradients of step 1 are freed by
`zero_grad`, so at a forward-time peak `grads` is small. The exact sizes at rest are in
`memory.detail['state.params' | 'state.grads' | 'state.optimizer']` (local bytes, shards
counted as held). Known attribution quirks of torch 2.13's trackers: under an FSDP2
mixed-precision policy the unsharded bf16 copies are not always filed as 'Unsharded Param'
(seen on gpt2-124m: they land in activations/temp; `total` is unaffected), nor are FSDP+TP
unsharded DTensor parameters; every allocation inside `optimizer.step()` is filed as optimizer
state, so the excess over the states is moved to `buffer_terms['optimizer_step_temp']`.

DDP cannot be built under fake tensors (its reducer verifies parameter shapes across ranks by
reading storage): zero 0/1 are measured without the DDP wrapper (`build_run(ddp=False)`; the
local computation is the same) and its gradient buckets are added as
`buffer_terms['ddp_buckets']`.

The optimizer is the one the target device would run (`--gpu` other than 'cpu': fused AdamW,
no foreach temporaries), and so are fp8's Linears: `precision.fp8_backend='auto'` picks
torchao's Float8Linear for a GPU target where torchao is installed, whatever the host has
(torchao's casts and `_scaled_mm` run under fake tensors on a CPU); the notes name it, and
the planner plans the same backend (`PlanInput.fp8_backend`, `config.fp8_backend_for`:
torchao's 16-bit saved inputs and eager casts, `planner.memory.torchao_fp8`). One difference
from a GPU run: torchao's Float8Linear casts its input to the autocast dtype only under CUDA
autocast (`torch.is_autocast_enabled()`), so under ZeRO-0/1 (autocast) the CPU dry-run
skips those casts (planned 3.5% over at h 256, dp1 ZeRO-0 tp4). FLOPs are counted
with `FlopCounterMode` on step 1 (the same
computation as step 2; under the tracker the counter would keep alive what activation
checkpointing frees) for one step of this rank (scaled from the micro-batches run to all of
them): matmuls only, attention over the full T x T matrix, flash backward with its QK^T
recomputation; DTensor (TP) matmuls are counted at their global shapes, so under tp > 1 the
figure is the tensor-parallel group's. The step runs eagerly (`train.compile` is ignored):
with compile on, the measurement is an eager stand-in for the compiled step, and says so in
its notes. What differs is what inductor fuses: fp8's casts hold an fp32 quotient per operand
here and none compiled, and a recomputed block's fp8 linears keep w2's output until the
checkpoint's early stop; the planner counts either (`planner.memory.buffers.fp8_quantize_bytes`
by `compile`), so hold a compiled plan against a dry-run only with `compile` off.

Not supported (raise `ConfigError`): offload other than 'none'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.config import ConfigError, JobConfig, Layout, grad_accum_steps, offload_states
from scaletrain.measure.schema import Measurement, plan_dict
from scaletrain.parallel import local_state_bytes
from scaletrain.planner.types import MemoryBreakdown
from scaletrain.trainer.build import DistEnv, Run, build_run
from scaletrain.trainer.step import StepHooks, apply_update, train_step

from .flops import flop_counter
from .timeline import Timeline
from .torch_compat import (
    ActionSchedule,
    frozen_aware_mem_tracker,
    fsdp_mem_tracker,
    gradless_module_hooks,
    pp_actions,
    pp_io_dtype,
)

__all__ = ["dryrun", "DRYRUN_MICROBATCHES", "HOST_DEVICE"]

HOST_DEVICE = "meta"
"""Where the dry-run's offloaded activations go (`build_run(activation_host=...)`): fake
tensors on 'meta' are host memory, counted apart from the device's ('cpu', the fake device)
as `memory.detail['host.activations']`."""

DRYRUN_MICROBATCHES = 2
"""Micro-batches run per dry-run step at most (see module docstring)."""

# Tracker category -> schema category. FSDPMemTracker's names first, MemTracker's after.
_CATEGORY = {
    "Sharded Param": "params",
    "Unsharded Param": "params",
    "Parameter": "params",
    "Sharded Grad": "grads",
    "Unsharded Grad": "grads",
    "Gradient": "grads",
    "Optstate": "optimizer",
    "OptState": "optimizer",
    "Activation": "activations",
    "Buffer": "buffers",
    "Temp": "buffers",
    "All Gather": "buffers",
    "Reduce Scatter": "buffers",
    "Inputs": "buffers",
    "Other": "buffers",
}
_BUFFER_NAMES = {
    "Buffer": "module_buffers",
    "Temp": "temp",
    "All Gather": "all_gather",
    "Reduce Scatter": "reduce_scatter",
    "Inputs": "inputs",
    "Other": "other",
}
_DETAIL_NAMES = {
    "Unsharded Param": "params.unsharded",
    "Sharded Param": "params.sharded",
    "Unsharded Grad": "grads.unsharded",
    "Sharded Grad": "grads.sharded",
}


def _unsupported(job: JobConfig, layout: Layout) -> None:
    if offload_states(job.memory.offload) != "none":
        raise ConfigError(
            "memory.offload",
            job.memory.offload,
            "the dry-run measures device memory without model-state offload: use 'none' "
            "or 'activations'",
        )


@contextlib.contextmanager
def _fake_world(rank: int, world_size: int) -> Iterator[None]:
    """A `fake` process group as `rank` of `world_size`, destroyed on exit."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("dryrun: a process group is already initialized in this process")
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _add_ddp_buckets(memory: MemoryBreakdown, model: torch.nn.Module, notes: list[str]) -> None:
    """DDP's reducer buckets: one flat copy of every gradient (`gradient_as_bucket_view=False`,
    torch's default, keeps `param.grad` and the bucket separately), allocated at the first
    backward and kept for the run, so they add to the peak."""
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    memory.buffer_terms["ddp_buckets"] = float(nbytes)
    memory.buffers += nbytes
    memory.total += nbytes
    notes.append(
        "DDP cannot be built under fake tensors: measured without its wrapper, its "
        "gradient buckets added as buffer_terms['ddp_buckets']"
    )


def _breakdown(peak: dict[Any, dict[str, int]], rank: int, capacity: float) -> MemoryBreakdown:
    mem = MemoryBreakdown(rank=rank, capacity=capacity)
    for device, dev_snap in peak.items():
        if torch.device(device).type == HOST_DEVICE:  # offloaded activations: host memory
            mem.detail["host.activations"] = float(dev_snap.get("Total", 0))
            continue
        for key, nbytes in dev_snap.items():
            if key == "Total":
                mem.total += nbytes
                continue
            cat = _CATEGORY.get(key, "buffers")
            setattr(mem, cat, getattr(mem, cat) + nbytes)
            if cat == "buffers":
                name = _BUFFER_NAMES.get(key, key.lower().replace(" ", "_"))
                mem.buffer_terms[name] = mem.buffer_terms.get(name, 0.0) + nbytes
            if key in _DETAIL_NAMES:
                mem.detail[_DETAIL_NAMES[key]] = mem.detail.get(_DETAIL_NAMES[key], 0.0) + nbytes
    mem.fits = capacity <= 0 or mem.total <= capacity
    return mem


class _DryrunHooks(StepHooks):
    """The dry-run's observers of the trainer's step: the tracker's per-forward resets, the
    timeline's marks, and the exact state sizes at rest (after the last backward and after
    the update)."""

    def __init__(self, *, pipelined: bool) -> None:
        self.pipelined = pipelined
        self.tracker: Any = None
        self.timeline: Timeline | None = None
        self.run: Run | None = None
        self.state: dict[str, float] = {}

    def microbatch(self, k: int) -> contextlib.AbstractContextManager:
        if self.tracker is not None and not self.pipelined:
            # the trackers refuse a second forward of the root without a reset of their
            # per-module statistics (the running totals and the peak are kept)
            self.tracker.reset_mod_stats()
        return contextlib.nullcontext()

    def stage_forward(self, stage: torch.nn.Module) -> None:
        if self.tracker is not None and stage in self.tracker.memory_tracking:
            # a second forward of a stage root: forget this stage's own entry only (other
            # stages' entries are still needed by the backward of their in-flight batches)
            del self.tracker.memory_tracking[stage]

    def event(self, name: str) -> None:
        if self.timeline is not None and name not in ("grads_ready", "forward_backward_done"):
            self.timeline.mark(name)
        if (
            self.tracker is not None
            and self.run is not None
            and name in ("grads_ready", "optimizer_step")
        ):
            for k, v in local_state_bytes(self.run.model, self.run.optimizer).items():
                self.state[f"state.{k}"] = max(self.state.get(f"state.{k}", 0.0), float(v))


def _batches(job: JobConfig, n: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """`n` micro-batches of random (B, T) token ids, as the data loader yields them."""
    b, t, v = job.batch.micro_batch, job.batch.seq_len, job.model.vocab_size
    return iter([(torch.randint(0, v, (b, t)), torch.randint(0, v, (b, t))) for _ in range(n)])


def _schedule_cls(
    job: JobConfig, layout: Layout, rank: int, world_size: int, hooks: StepHooks
) -> Any:
    """`ActionSchedule` bound to this rank's actions and the inter-stage tensor's shape."""
    from scaletrain.parallel import ParallelDims

    dims = ParallelDims.from_layout(layout, world_size)
    grad_accum = grad_accum_steps(job.batch.global_batch, job.batch.micro_batch, layout.dp)
    # this cp rank's load-balanced share of the sequence, further sharded under sp (the block
    # plans' Shard(1) local tensors)
    t_local = job.batch.seq_len // layout.cp
    if layout.sp and layout.tp > 1:
        t_local //= layout.tp
    return functools.partial(
        ActionSchedule,
        hooks=hooks,
        split_backward=layout.pp_schedule in ("zero-bubble", "dualpipev"),
        actions=pp_actions(
            layout.pp_schedule, layout.pp, grad_accum, layout.pp_virtual, layout.pp_rank_of(rank)
        ),
        io_shape=(job.batch.micro_batch, t_local, job.model.dim),
        io_dtype=pp_io_dtype(job, dims),
    )


def _tracker(run: Run) -> Any:
    if run.dims.zero >= 2 and run.dims.fsdp_enabled:
        # FSDPMemTracker takes one FSDP root; with several stages its walk over `modules()`
        # is pointed at all of them (the only use it makes of the root)
        roots = run.pipeline.stages if run.pipeline is not None else [run.model]
        fsdp_tracker = fsdp_mem_tracker(roots[0], run.optimizer)
        fsdp_tracker._root_mod = run.model  # type: ignore[assignment]  # any module tree walks
        return fsdp_tracker
    tracker = frozen_aware_mem_tracker()  # MemTracker, frozen parameters (LoRA) allowed
    # ZeroRedundancyOptimizer keeps its states in the local optimizer `.optim`
    inner = getattr(run.optimizer, "optim", None)
    extra = [inner] if isinstance(inner, torch.optim.Optimizer) else []
    tracker.track_external(run.model, run.optimizer, *extra)
    return tracker


def _build_fake_run(
    job: JobConfig,
    layout: Layout,
    rank: int,
    world_size: int,
    fake: contextlib.AbstractContextManager,
    hooks: _DryrunHooks,
) -> Run:
    """`rank`'s run built by the trainer's own `build_run`, allocated under `fake`: no data,
    no initial values, no DDP wrapper (its buckets are added analytically)."""
    env = DistEnv(rank=rank, world_size=world_size, local_rank=0, device=torch.device("cpu"))
    # the optimizer the target device would run: fused AdamW on GPUs (no foreach
    # temporaries; torch has a fused CPU kernel too), foreach on CPU
    target = job.hardware.spec().device_type
    pp = layout.pp > 1
    return build_run(
        job,
        env=env,
        data=False,
        init_weights=False,
        materialize_in=fake,
        ddp=False,
        optimizer_device=target,
        fp8_device=target,
        schedule_cls=_schedule_cls(job, layout, rank, world_size, hooks) if pp else None,
        activation_host=HOST_DEVICE,
    )


def _measured_steps(
    run: Run, hooks: _DryrunHooks, *, n_micro: int, grad_accum: int, count_flops: bool
) -> tuple[Any, float, Timeline]:
    """Two steps under the fake mode: the peak snapshot and timeline of the second, and the
    FLOPs of the first scaled to `grad_accum` micro-batches."""
    job = run.job
    roots: list[tuple[str, torch.nn.Module]] = (
        [
            (f"stage{sid}", mod)
            for sid, mod in zip(run.pipeline.stage_ids, run.pipeline.stages, strict=True)
        ]
        if run.pipeline is not None
        else [("model", run.model)]
    )
    # Step 1 (warm-up: optimizer states, lazy FSDP / DTensor state) runs before the
    # tracker exists; FLOPs are counted on it (the same computation as step 2: under
    # the tracker the counter would keep alive what activation checkpointing frees).
    counter = flop_counter() if count_flops else None
    with counter or contextlib.nullcontext():
        apply_update(
            run,
            train_step(run, _batches(job, n_micro), hooks, num_microbatches=n_micro),
            hooks,
        )
    flops = float(counter.get_total_flops()) * grad_accum / n_micro if counter else 0.0
    if run.pipeline is not None:
        run.pipeline.schedule.release_buffers()  # re-allocated under the tracker
    tracker = _tracker(run)
    hooks.tracker, hooks.run = tracker, run
    hooks.timeline = timeline = Timeline(tracker, roots)
    with gradless_module_hooks(), tracker:
        timeline.recording = True
        timeline.mark("step_start")
        apply_update(
            run,
            train_step(run, _batches(job, n_micro), hooks, num_microbatches=n_micro),
            hooks,
        )
    peak = tracker.get_tracker_snapshot("peak")
    timeline.remove()
    return peak, flops, timeline


def _step_memory(
    run: Run, peak: Any, hooks: _DryrunHooks, *, capacity: float, rank: int, notes: list[str]
) -> MemoryBreakdown:
    """The peak snapshot by category, optimizer temporaries and DDP's buckets named."""
    from scaletrain.parallel.parallelize import uses_ddp

    memory = _breakdown(peak, rank, capacity)
    # The trackers label every allocation inside optimizer.step() as optimizer state, so a
    # peak inside the step counts foreach temporaries (e.g. AdamW's denominators) there. Keep
    # `optimizer` = the states themselves, and name the rest.
    states = local_state_bytes(run.model, run.optimizer)["optimizer"]
    if memory.optimizer > states:
        memory.buffer_terms["optimizer_step_temp"] = memory.optimizer - states
        memory.buffers += memory.optimizer - states
        memory.optimizer = float(states)
    memory.detail.update(hooks.state)
    if uses_ddp(run.dims, run.job.memory):
        _add_ddp_buckets(memory, run.model, notes)
    return memory


def _fp8_note(run: Run, cpu_target: bool) -> str:
    """Which backend converted the Linears, chosen for the target device as a run on it
    would choose (`precision.apply_fp8`, through `build_run(fp8_device=...)`)."""
    from scaletrain.precision import fp8_backend_of

    roots = run.pipeline.stages if run.pipeline is not None else [run.model]
    backend = next((b for b in map(fp8_backend_of, roots) if b != "none"), "none")
    target = "a CPU" if cpu_target else "a GPU"
    note = f"fp8 linears: {backend}'s Float8Linear, as on {target}"
    return note


def dryrun(
    job: JobConfig, *, world_size: int, rank: int = 0, count_flops: bool = True
) -> Measurement:
    """Measure one training step of `job` as `rank` of `world_size` ranks, without allocating.

    Returns the step's peak memory by category (`Measurement.memory`), a timeline of allocated
    bytes at block boundaries, and this rank's FLOPs for that step.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    layout = job.layout(world_size)
    _unsupported(job, layout)
    if not 0 <= rank < world_size:
        raise ConfigError("rank", rank, f"choose a rank in [0, {world_size})")
    t0 = time.perf_counter()
    compiled = job.train.compile
    job = dataclasses.replace(job, train=dataclasses.replace(job.train, compile=False))
    grad_accum = grad_accum_steps(job.batch.global_batch, job.batch.micro_batch, layout.dp)
    pp = layout.pp > 1
    # the schedule's peak in-flight activations need all of its micro-batches
    n_micro = grad_accum if pp else min(grad_accum, DRYRUN_MICROBATCHES)
    notes = [f"dry-run ran {n_micro} of {grad_accum} micro-batches per step"]
    if compiled:
        notes.append(
            "train.compile is on: the step ran eagerly, a stand-in for the compiled one "
            "(fp8's casts hold fp32 quotients here that a compiled step fuses away; compare "
            "with a plan made with compile off)"
        )
    spec = job.hardware.spec()
    capacity = 0.0 if spec.is_cpu else spec.memory_bytes
    hooks = _DryrunHooks(pipelined=pp)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with _fake_world(rank, world_size):
        run = _build_fake_run(job, layout, rank, world_size, fake, hooks)
        if job.precision.dtype == "fp8":
            notes.append(_fp8_note(run, spec.is_cpu))
        with fake:
            peak, flops, timeline = _measured_steps(
                run, hooks, n_micro=n_micro, grad_accum=grad_accum, count_flops=count_flops
            )
    memory = _step_memory(run, peak, hooks, capacity=capacity, rank=rank, notes=notes)
    if run.pipeline is not None:
        memory.detail["pp_boundary_bytes"] = run.pipeline.schedule.peak_boundary_bytes
        notes.append(
            f"pipeline: stages {run.pipeline.stage_ids} of {run.pipeline.num_stages} "
            f"driven in the {layout.pp_schedule} order of pp rank "
            f"{layout.pp_rank_of(rank)}"
        )
    return Measurement(
        source="dryrun",
        rank=rank,
        world_size=world_size,
        memory=memory,
        timeline=timeline.events,
        flops=flops,
        plan=plan_dict(job, layout),
        wall_s=time.perf_counter() - t0,
        notes=notes,
    )
