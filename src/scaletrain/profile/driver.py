"""Run a few training steps of a plan under `torch.profiler` and measure where the time goes.

The run is built by the trainer's own `build_run`, and each step is the trainer's `train_step`
followed by its `apply_update` (optimizer step, loss-scale update, zero_grad), as the training
loop runs them: the profile measures the code that trains, not a copy of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from scaletrain.config import JobConfig, precision_spec
from scaletrain.planner.time.flops import flops_per_token
from scaletrain.trainer.build import Run, build_run
from scaletrain.trainer.optim import lr_at, set_lr
from scaletrain.trainer.step import apply_update, train_step

from .ops import OpAnalysis, analyse_events
from .phases import PhaseClock, TimedBatches, install_hooks

__all__ = ["ProfileResult", "profile_run", "profile_job"]


@dataclass
class ProfileResult:
    """One profile: per-step times (seconds, mean over the profiled steps) and the op analysis."""

    model: str
    layout: str
    device: str
    world_size: int
    rank: int
    hardware: str
    peak_flops: float
    memory_bw: float
    steps: int
    step_s: float
    """Mean wall time of a profiled step (perf_counter around the whole step)."""
    step_times: list[float]
    unprofiled_step_s: float | None
    """Mean wall time of the warm-up steps after the first (no profiler overhead), if any."""
    phase_s: dict[str, float]
    """Per-step time of each phase, from the trace's scaletrain::<phase> ranges."""
    clock_s: dict[str, float]
    """The same phases from the hooks' own perf_counter clock (cross-check)."""
    analysis: OpAnalysis
    tokens_per_step: int
    model_flops_per_step: float
    """O in the iron law: the planner's model FLOPs per token x tokens per step (all ranks)."""
    tokens_per_s: float
    mfu: float
    predicted: dict[str, Any] | None
    """The planner's estimate for the same plan (mfu, step_s, ...); None if unavailable."""
    planner_error: str | None
    config: dict[str, Any] = field(repr=False, default_factory=dict)
    trace_path: Path | None = None
    job: JobConfig | None = field(default=None, repr=False)
    plan: Any = field(default=None, repr=False)
    """The planner's PlanInput for this run (for what-if checks of recommendations)."""

    @property
    def parts_s(self) -> float:
        return sum(self.phase_s.values())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step(run: Run, batches: TimedBatches, clock: PhaseClock, step: int) -> float:
    """One optimizer step exactly as the training loop makes it; returns its wall time."""
    set_lr(
        run.optimizer,
        lr_at(step, optim=run.job.optim, batch=run.job.batch, total_steps=run.job.train.steps),
    )
    _sync(run.device)
    t0 = time.perf_counter()
    clock.start_step()
    out = train_step(run, batches)
    clock.switch("optimizer")  # the optimizer step, the loss scale's update and zero_grad
    apply_update(run, out)
    clock.end_step()
    _sync(run.device)
    return time.perf_counter() - t0


def _label(run: Run) -> str:
    """Compact plan name, e.g. 'dp2 z3 tp2 | mb4x2 seq128 fp32 attn=sdpa ac=none'."""
    job = run.job
    return (
        f"{run.dims.layout.label()} | mb{job.batch.micro_batch}x{run.grad_accum} "
        f"seq{job.batch.seq_len} {job.precision.dtype} attn={job.model.attention} "
        f"ac={job.memory.ac}"
    )


def _planner(run: Run) -> tuple[Any, dict[str, Any] | None, str | None]:
    try:
        from scaletrain.planner import estimate
        from scaletrain.trainer.report import plan_input

        plan = plan_input(run)
        est = estimate(plan)
    except Exception as e:  # the planner is advisory here: a profile must not depend on it
        return None, None, f"{type(e).__name__}: {e}"
    t = est.time
    return (
        plan,
        {
            "mfu": est.mfu,
            "step_s": t.step_s,
            "tokens_per_s": est.tokens_per_s,
            "compute_s": t.compute_s,
            "comm_exposed_s": t.comm_exposed_s,
            "bubble_s": t.bubble_s,
            "optimizer_s": t.optimizer_s,
            "activations_bytes": est.memory.activations,
            "bubble_fraction": t.bubble_s / t.compute_s if t.compute_s else 0.0,
        },
        None,
    )


def _per_step(a: OpAnalysis, steps: int) -> OpAnalysis:
    """Totals over the profiled steps -> per-step means (op FLOPs and bytes too)."""
    for d in (a.phase_s, a.class_s, a.compute_class_s, a.phase_op_s, a.comm_op_s):
        for k in d:
            d[k] /= steps
    a.comm_total_s /= steps
    a.phase_overlap_s /= steps
    a.comm_exposed_s /= steps
    a.p2p_exposed_s /= steps
    for op in a.ops:
        op.count, op.time_s = max(1, round(op.count / steps)), op.time_s / steps
        op.flops, op.bytes = op.flops / steps, op.bytes / steps
    return a


def profile_run(
    run: Run, *, steps: int = 3, warmup: int = 2, out_dir: str | Path | None = None
) -> ProfileResult:
    """Profile `steps` steps of an already built run after `warmup` unprofiled ones."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps={steps}, warmup={warmup}: use steps >= 1 and warmup >= 0")
    out = Path(out_dir) if out_dir is not None else run.run_dir / "profile"
    clock = PhaseClock(sync_cuda=run.device.type == "cuda")
    tops: list[torch.nn.Module] = [run.model] if run.pipeline is None else list(run.pipeline.stages)
    handles = install_hooks(
        tops, clock, pipelined=run.pipeline is not None, submodules=not run.job.train.compile
    )
    if run.data is None:
        raise ValueError("profile needs a run built with data (build_run(..., data=True))")
    data = run.data
    batches = TimedBatches(data.train_batches(), clock)
    activities = [ProfilerActivity.CPU]
    if run.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    try:
        warm = [_step(run, batches, clock, i) for i in range(warmup)]
        clock.reset()
        with profile(
            activities=activities, record_shapes=True, profile_memory=True, with_flops=True
        ) as prof:
            walls = [_step(run, batches, clock, warmup + i) for i in range(steps)]
    finally:
        for h in handles:
            h.remove()
        data.close()
    # one Chrome trace per rank; the `.pt.trace.json` suffix is what TensorBoard's PyTorch
    # profiler plugin looks for (`tensorboard --logdir RUN/profile`); Perfetto opens any name
    out.mkdir(parents=True, exist_ok=True)
    trace = out / f"rank{run.env.rank}.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    dtype_bytes = precision_spec(run.job.precision.dtype).bytes
    analysis = _per_step(
        analyse_events(prof.events(), device=run.device.type, default_bytes=dtype_bytes), steps
    )
    step_s = sum(walls) / len(walls)
    unprofiled = sum(warm[1:]) / (len(warm) - 1) if len(warm) >= 2 else None
    tok_s = run.tokens_per_step / (unprofiled or step_s)
    plan, predicted, err = _planner(run)
    hw = run.hardware
    return ProfileResult(
        model=run.job.model.name,
        layout=_label(run),
        device=run.device.type,
        world_size=run.env.world_size,
        rank=run.env.rank,
        hardware=hw.name,
        peak_flops=hw.flops(run.job.precision.dtype),
        memory_bw=hw.memory_bw,
        steps=steps,
        step_s=step_s,
        step_times=walls,
        unprofiled_step_s=unprofiled,
        phase_s=dict(analysis.phase_s),
        clock_s={k: v / steps for k, v in clock.totals.items()},
        analysis=analysis,
        tokens_per_step=run.tokens_per_step,
        tokens_per_s=tok_s,
        model_flops_per_step=run.tokens_per_step
        * flops_per_token(run.job.model, run.job.batch.seq_len),
        mfu=run.mfu(tok_s),
        predicted=predicted,
        planner_error=err,
        config=run.job.to_dict(),
        trace_path=trace,
        job=run.job,
        plan=plan,
    )


def profile_job(
    job: JobConfig, *, steps: int = 3, warmup: int = 2, out_dir: str | Path | None = None
) -> ProfileResult:
    """Build the run with the trainer's `build_run`, then `profile_run` it."""
    return profile_run(build_run(job), steps=steps, warmup=warmup, out_dir=out_dir)
