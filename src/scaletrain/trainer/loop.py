"""The training loop: build everything from the plan, then a loop you can read top to bottom.

The single-process run is the distributed run at world size 1: every parallel axis of degree 1
is a no-op inside `parallelize`, so CPU tests exercise the real code path. Every layout runs
the same step, `trainer.step.train_step` + `apply_update`; under pipeline parallelism a
schedule drives the micro-batches inside it (`PipelineRuntime.step`), not a step of its own.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scaletrain import clock
from scaletrain.checkpoint.dcp import AsyncCheckpointer, clear_interrupted_saves
from scaletrain.checkpoint.hf_load import load_initial_weights
from scaletrain.config import JobConfig
from scaletrain.data import DataBundle
from scaletrain.data.loader import Batch
from scaletrain.data.tokenizer import Tokenizer, save_hf_tokenizer
from scaletrain.measure.live import SavedActivations, peak_process_memory, state_bytes

from . import runlock, signals
from ._start import start_line
from .build import Run, build_run, require_data
from .checkpointing import fresh_run_dir, resume, rollback, save_step
from .documents import enable_document_masking
from .evaluation import evaluate, evaluate_sets, val_batch_count
from .guard import SpikeGuard
from .metrics import MetricsLogger
from .monitor import Monitor
from .oom import is_allocation_failure
from .optim import lr_at, lr_scale_line, set_lr
from .precision import autocast
from .report import memory_ledger, out_of_memory, summary
from .result import RunResult, write_run_files
from .sample import generate, layout_logits_fn, prompt_ids
from .step import StepHooks, StepOut, apply_update, train_step

__all__ = ["train", "RunResult", "evaluate", "val_batch_count", "train_step"]  # (re-exported)


class _ProbeHooks(StepHooks):
    """The first step's memory probe: the bytes autograd saves for one micro-batch (the first;
    pipelined: each stage's first forward and the first loss), and the exact state bytes right
    after the optimizer step, written into `measured`."""

    def __init__(self, run: Run, measured: dict[str, Any]) -> None:
        self.run, self.measured = run, measured
        self.probe = SavedActivations(run.model)

    def microbatch(self, k: int) -> contextlib.AbstractContextManager:
        return self.probe.track() if k == 0 else contextlib.nullcontext()

    def pipeline_step(self, stages: Sequence[torch.nn.Module]) -> contextlib.AbstractContextManager:
        return self.probe.track_first_forward(stages)

    def event(self, name: str) -> None:
        if name == "optimizer_step":
            self.measured.update(state_bytes(self.run.model, self.run.optimizer))
            self.measured["activations"] = self.probe.bytes  # one micro-batch


NO_PROBE = StepHooks()


_SNAPSHOT_ENTRIES = 50_000
"""Allocator events kept while recording (a ring buffer; a few KB each with stacks): ample for
one step's allocations, which are per-layer, per-micro-batch, not per-element."""


@contextlib.contextmanager
def _memory_snapshot(run: Run, enabled: bool) -> Iterator[Path | None]:
    """Around the measured step on CUDA: record the caching allocator's history and dump it to
    run_dir/memory_snapshot_rank{r}.pickle (open it at pytorch.org/memory_viz) beside
    measurement.json, so a planner-vs-measured gap can be traced to the allocations that made
    it. Yields the path, or None: CPU runs (and later steps) record nothing and write nothing.

    Untested here (no GPU on CI); the CPU no-op is tested. Private torch API
    (torch.cuda.memory._record_memory_history / _dump_snapshot), stable since torch 2.1.
    """
    if not enabled or run.device.type != "cuda":
        yield None
        return
    path = run.run_dir / f"memory_snapshot_rank{run.env.rank}.pickle"
    torch.cuda.memory._record_memory_history(max_entries=_SNAPSHOT_ENTRIES, device=run.device)
    try:
        yield path
    finally:  # also on OOM, when the snapshot is most wanted
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(path))
        finally:
            torch.cuda.memory._record_memory_history(enabled=None, device=run.device)


def _save_tokenizer(tok: Tokenizer, directory: Path) -> None:
    """The run directory is self-contained: the tokenizer in its own format (what
    `data.tokenizer.load_tokenizer` reads) and as a transformers-loadable tokenizer.json."""
    directory.mkdir(exist_ok=True)
    tok.save(directory)
    save_hf_tokenizer(tok, directory)
    (directory / "name").write_text(tok.name + "\n")


def train(job: JobConfig, *, max_steps: int | None = None) -> RunResult:
    """Train `job` to `job.train.steps` (or stop after `max_steps` more steps, for tests).

    A process group this call creates (torchrun's environment) is destroyed when it returns;
    one that already existed (`parallel.launch.spawn`, tests) is left to its owner.
    """
    created = not dist.is_initialized()
    try:
        # phases (`scaletrain.clock`): setup (data nested in it), steps, eval, checkpoint,
        # finish; written to run_info.json
        with clock.phase("setup"):
            result = _train(job, max_steps=max_steps)
    finally:
        runlock.release_held()
        signals.uninstall()
    if created and dist.is_initialized():
        # a process that exits with its gloo group alive can abort in interpreter teardown
        # (the group's worker threads outlive it: "terminate called without an active
        # exception", seen on a restarted torchrun worker); error paths keep the old exit
        dist.barrier()  # no rank tears its connections down while a peer still uses them
        dist.destroy_process_group()
    return result


def _train(job: JobConfig, *, max_steps: int | None) -> RunResult:
    run, resumed_from, step, wall_offset = _start_run(job)
    loop = _open_loop(run, resumed_from, step, wall_offset, max_steps)
    signals.install()  # SIGINT/SIGTERM: finish the step, save, exit (checked after each step)
    clock.switch("steps")  # the loop's own work: steps and their logging
    while loop.step < loop.end_step:
        _one_step(loop)
    return _finish(loop)


@dataclass
class _Loop:
    """What the loop carries from one step to the next."""

    run: Run
    data: DataBundle
    logger: MetricsLogger
    saver: AsyncCheckpointer | None
    guard: SpikeGuard
    monitor: Monitor
    step: int
    end_step: int
    wall_offset: float
    """Wall seconds spent before this process (restored from the checkpoint)."""
    val_batches: list[Batch]
    eval_sets: dict[str, list[Batch]]
    """data.eval_sources, by name."""
    batches: Iterator[Batch]
    t_start: float
    eval_losses: dict[str, float] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)
    """The first step's memory probe (`_ProbeHooks`), then the process peaks."""
    val_loss: float | None = None
    loss_value: float = float("nan")
    tokens_seen: int = 0
    timed_s: float = 0.0
    """Tokens and seconds of every step but the first (which pays one-time costs)."""
    dt: float = float("nan")
    """The last step's seconds."""
    snapshot_path: Path | None = None


def _start_run(job: JobConfig) -> tuple[Run, Path | None, int, float]:
    """Build the run, load its initial weights, lock its directory and resume it when a
    checkpoint says so: (run, the checkpoint resumed from, step, wall seconds so far)."""
    job = fresh_run_dir(job)
    run = build_run(job)  # run.job: with the layout the planner chose (parallel.layout=auto)
    require_data(run, "training")
    load_initial_weights(run)  # checkpoint.init_from; a resume below wins over it
    enable_document_masking(run)  # data.document_masking
    runlock.acquire(run.run_dir, enabled=run.is_main)  # one training per run directory
    if run.is_main:  # (the lock proves no save is in flight in this directory)
        cleared = clear_interrupted_saves(run.ckpt_dir)
        if cleared is not None:
            print(cleared)
    path, step, wall_offset = resume(run)
    return run, path, step, wall_offset


def _open_loop(
    run: Run, resumed_from: Path | None, step: int, wall_offset: float, max_steps: int | None
) -> _Loop:
    """Logger, checkpoint writer, spike guard, monitor and the batches of the loop."""
    job, data = run.job, require_data(run, "training")
    logger = MetricsLogger(
        run.run_dir,
        total_steps=job.train.steps,
        enabled=run.is_main,
        tensorboard=job.train.tensorboard,
        progress=job.train.progress,
        start_step=step,
    )
    if run.is_main:
        _write_start_files(run, data, logger, resumed_from, step)
    # collective when distributed (its own gloo group for the background writes)
    saver = (
        AsyncCheckpointer(run.ckpt_dir, keep_last_n=job.checkpoint.keep_last_n)
        if job.checkpoint.async_save
        else None
    )
    guard = SpikeGuard(
        job.guard, fp16=job.precision.dtype == "fp16", log_path=run.run_dir / "guard.jsonl"
    )
    monitor = Monitor(run, logger, start_step=step)  # heartbeat, watchdog, stragglers, W&B
    val_batches = data.val_batches(val_batch_count(run))
    eval_sets = data.eval_batches(val_batch_count(run))
    batches = monitor.timed(data.train_batches())
    end_step = job.train.steps if max_steps is None else min(job.train.steps, step + max_steps)
    return _Loop(
        run=run,
        data=data,
        logger=logger,
        saver=saver,
        guard=guard,
        monitor=monitor,
        step=step,
        end_step=end_step,
        wall_offset=wall_offset,
        val_batches=val_batches,
        eval_sets=eval_sets,
        batches=batches,
        t_start=time.perf_counter(),
    )


def _write_start_files(
    run: Run, data: DataBundle, logger: MetricsLogger, resumed_from: Path | None, step: int
) -> None:
    """Rank 0: config.json and the tokenizer in the run directory, and the start lines."""
    job = run.job
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / "config.json").write_text(json.dumps(job.to_dict(), indent=1))
    _save_tokenizer(data.tokenizer, run.run_dir / "tokenizer")
    logger.print(run.describe())
    if run.fp8_matmul is not None:
        logger.print(run.fp8_matmul.line())
    scaled = lr_scale_line(job.optim, batch=job.batch)
    if scaled is not None:
        logger.print(scaled)
    logger.print(
        start_line(
            resumed_from,
            step,
            resume=job.checkpoint.resume,
            ckpt_dir=run.ckpt_dir,
            total_steps=job.train.steps,
        )
    )


def _one_step(loop: _Loop) -> None:
    """One optimizer step: the step, the spike guard (a spike rolls back instead of
    updating), the update, then its metrics, evaluation and checkpoint."""
    run, job = loop.run, loop.run.job
    t0, cpu0 = time.perf_counter(), time.process_time()
    loop.monitor.begin(loop.step)
    lr = lr_at(loop.step, optim=job.optim, batch=job.batch, total_steps=job.train.steps)
    set_lr(run.optimizer, lr)
    probe = _ProbeHooks(run, loop.measured) if not loop.measured else NO_PROBE
    out = _run_step(loop, probe)
    verdict = loop.guard.check(out.loss, out.grad_norm)
    if verdict.spike:
        loop.step = rollback(run, loop.guard, loop.step, verdict, loop.logger, loop.saver)
        loop.batches = loop.monitor.timed(loop.data.train_batches())
        return
    apply_update(run, out, probe)
    if out.finite:
        loop.guard.accept(out.loss)
    loop.loss_value = out.loss
    loop.losses.append(out.loss)
    loop.step += 1
    dt, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    record = _step_record(loop, out, lr, dt=dt)
    # this process's CPU seconds in the step (all its threads): on a host others share, the
    # wall clock also counts the time the OS gave them (measure.throughput reads both)
    record["step_cpu_s"] = cpu_s
    _log_step(loop, record)
    _save_or_stop(loop)


def _run_step(loop: _Loop, probe: StepHooks) -> StepOut:
    """`train_step`, the first one under the CUDA memory snapshot; an allocation failure
    closes the loop's writers and becomes the one-line out-of-memory report."""
    try:
        with _memory_snapshot(loop.run, enabled=not loop.measured) as snap:
            out = train_step(loop.run, loop.batches, probe)
        loop.snapshot_path = loop.snapshot_path or snap
        return out
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
        if not is_allocation_failure(e):  # the CPU allocator raises RuntimeError
            raise
        if loop.saver is not None:  # let the save in flight (of accepted steps) finish
            loop.saver.close()
        loop.data.close()
        loop.logger.close()
        raise out_of_memory(loop.run, step=loop.step + 1, error=e) from e


def _step_record(loop: _Loop, out: StepOut, lr: float, dt: float) -> dict[str, Any]:
    """The step's metrics (and the validation losses on evaluation steps)."""
    run, job = loop.run, loop.run.job
    loop.dt = dt
    if len(loop.losses) > 1:  # the first step pays one-time costs (allocation, lazy init)
        loop.tokens_seen += run.tokens_per_step
        loop.timed_s += dt
    tok_s = run.tokens_per_step / dt
    record: dict[str, Any] = {
        "step": loop.step,
        "loss": loop.loss_value,
        "lr": lr,
        "grad_norm": out.grad_norm,
        "tokens_per_s": tok_s,
        "mfu": run.mfu(tok_s),
        "step_s": dt,
        "loss_scale": run.scaler.scale,
        "skipped": not out.finite,
    }
    if loop.step % job.train.eval_every == 0 or loop.step == job.train.steps:
        with clock.phase("eval"):
            loop.val_loss = evaluate(run, loop.val_batches)
            record["val_loss"] = loop.val_loss
            record.update(evaluate_sets(run, loop.eval_sets, loop.eval_losses))
    record.update({f"mem_{k}": v for k, v in peak_process_memory(run.device).items()})
    return record


def _log_step(loop: _Loop, record: dict[str, Any]) -> None:
    loop.monitor.end(record)
    loop.logger.log(record)
    loop.logger.advance(
        loop.step, f"loss {loop.loss_value:.3f} | {record['tokens_per_s']:,.0f} tok/s"
    )
    if loop.step % loop.run.job.train.log_every == 0 or loop.step == 1 or "val_loss" in record:
        loop.logger.print(_line(record))


def _save_or_stop(loop: _Loop) -> None:
    """Checkpoint every `checkpoint.every` steps, at the last step and on a stop signal (then
    exit once the save is published)."""
    every, step = loop.run.job.checkpoint.every, loop.step
    stop = signals.stop_requested()
    if (every and step % every == 0) or step == loop.end_step or stop:
        with clock.phase("checkpoint"):
            save_step(
                loop.run, step, loop.wall_offset + time.perf_counter() - loop.t_start, loop.saver
            )
    if stop:
        if loop.saver is not None:
            loop.saver.close()
        signals.exit_after_save(stop, step=step, log=loop.logger.print)


def _finish(loop: _Loop) -> RunResult:
    """Publish the last checkpoint, sample and export (a finished run), write the result."""
    run, job, data = loop.run, loop.run.job, loop.data
    clock.switch("finish")  # the last background save, sample, export, run files
    if loop.saver is not None:  # the last checkpoint is published before the run reports done
        with clock.phase("checkpoint"):
            loop.saver.close()
            if dist.is_initialized():
                dist.barrier()
    data.close()
    timed = loop.timed_s
    tok_s = loop.tokens_seen / timed if timed else run.tokens_per_step / max(loop.dt, 1e-9)
    done = loop.step >= job.train.steps
    sample = _sample(run, data) if done and job.train.sample_tokens else ""
    if job.checkpoint.export_hf and done:
        _export_hf(run, data, loop.logger)
    if job.lora.enabled and done:
        _export_adapters(run, loop.logger)
    loop.measured.update({f"peak_{k}": v for k, v in peak_process_memory(run.device).items()})
    result = RunResult(
        run_dir=run.run_dir,
        steps=loop.step,
        final_loss=loop.loss_value,
        val_loss=loop.val_loss,
        best_loss=data.best_loss_nats,
        tokens_per_s=tok_s,
        mfu=run.mfu(tok_s),
        skipped_steps=run.scaler.skipped_steps,
        rollbacks=loop.guard.rollbacks,
        sample=sample,
        losses=loop.losses,
        measured=loop.measured,
        model=run.model,
        memory_snapshot=loop.snapshot_path,
        eval_losses=loop.eval_losses,
    )
    result.ledger = memory_ledger(run, loop.measured)
    loop.monitor.close(ledger=result.ledger)
    if run.is_main:
        if loop.losses:  # a restarted run that was already done keeps its last steps' files
            write_run_files(run, result)
        loop.logger.print(summary(result))
    loop.logger.close()
    return result


def _sample(run: Run, data: DataBundle) -> str:
    """`train.sample_tokens` of text generated from "The " (what of it the tokenizer encodes)."""
    job = run.job
    # the training step's autocast: FSDP mixed precision casts only the parameters it
    # manages (expert-parallel experts stay fp32), and autocast aligns the rest
    with autocast(job.precision, run.device.type):
        ids = generate(
            run.model,
            prompt_ids(data.tokenizer, "The "),
            num_tokens=job.train.sample_tokens,
            context=job.batch.seq_len,
            seed=job.train.seed,
            device=run.device,
            pad_multiple=run.dims.tp,
            logits_fn=layout_logits_fn(run),
            vocab=data.tokenizer.vocab_size,
        )
    return data.tokenizer.decode(ids)


def _export_hf(run: Run, data: DataBundle, logger: MetricsLogger) -> None:
    from scaletrain.checkpoint.hf import export_hf

    # collective: gathers shards (and pipeline stages); rank 0 writes
    export_hf(
        run.model,
        run.job.model,
        run.run_dir / "hf",
        pp_group=run.pipeline.group if run.pipeline is not None else None,
        lora_scale=run.job.lora.scale if run.job.lora.enabled else None,  # merged adapters
    )
    if run.is_main:
        save_hf_tokenizer(data.tokenizer, run.run_dir / "hf")
        logger.print(f"exported Hugging Face safetensors and tokenizer to {run.run_dir / 'hf'}")


def _export_adapters(run: Run, logger: MetricsLogger) -> None:
    """LoRA: the adapters in PEFT's format (`checkpoint.peft`) in run_dir/adapter."""
    from scaletrain.checkpoint.peft import export_peft_adapters

    # collective: gathers the adapters' shards and pipeline stages; rank 0 writes
    out = export_peft_adapters(
        run.model,
        run.job.model,
        run.job.lora,
        run.run_dir / "adapter",
        pp_group=run.pipeline.group if run.pipeline is not None else None,
    )
    if run.is_main:
        logger.print(f"exported the LoRA adapters (PEFT format) to {out}")


def _line(r: dict[str, Any]) -> str:
    val = f" | val {r['val_loss']:.4f}" if r.get("val_loss") is not None else ""
    val += "".join(
        f" | {k[9:]} {v:.4f} (ppl {r['ppl/' + k[9:]]:.2f})"
        for k, v in r.items()
        if k.startswith("val_loss/")
    )
    skip = " | SKIPPED (non-finite grads)" if r["skipped"] else ""
    return (
        f"step {r['step']:5d} | loss {r['loss']:.4f}{val} | lr {r['lr']:.2e} | "
        f"grad {r['grad_norm']:.3f} | {r['tokens_per_s']:,.0f} tok/s | "
        f"mfu {r['mfu']:.2%}{skip}"
    )
