"""The training loop: build everything from the plan, then a loop you can read top to bottom.

The single-process run is the distributed run at world size 1: every parallel axis of degree 1
is a no-op inside `parallelize`, so CPU tests exercise the real code path. Pipeline parallelism
changes what one step is (a schedule drives the micro-batches), so it has its own step function.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scaletrain import clock
from scaletrain.checkpoint.dcp import (
    AsyncCheckpointer,
    latest_good,
    load_checkpoint,
    save_checkpoint,
)
from scaletrain.checkpoint.hf_load import load_initial_weights
from scaletrain.config import ConfigError, JobConfig
from scaletrain.data.loader import Batch
from scaletrain.data.tokenizer import Tokenizer, save_hf_tokenizer
from scaletrain.measure.live import SavedActivations, peak_process_memory, state_bytes
from scaletrain.measure.schema import Measurement, plan_dict

from . import runlock, signals
from ._start import start_line
from .build import Run, build_run, require_data
from .documents import enable_document_masking
from .guard import SpikeGuard, SpikeVerdict
from .metrics import MetricsLogger, perplexity
from .monitor import Monitor
from .oom import is_allocation_failure
from .optim import lr_at, set_lr
from .precision import autocast
from .report import memory_ledger, out_of_memory, summary
from .resume_check import check_resume
from .sample import generate, layout_logits_fn
from .step import StepHooks, all_mean, apply_update, local_batch, plain, train_step

__all__ = ["train", "RunResult", "evaluate", "train_step"]


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    final_loss: float
    val_loss: float | None
    best_loss: float | None
    tokens_per_s: float
    mfu: float
    skipped_steps: int
    rollbacks: int = 0
    sample: str = ""
    losses: list[float] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)
    ledger: str = ""
    model: torch.nn.Module | None = field(default=None, repr=False)
    """The trained module (for tests, export and evaluation by the caller)."""
    memory_snapshot: Path | None = None
    """This rank's CUDA allocator snapshot of the measured step (None on CPU)."""
    eval_losses: dict[str, float] = field(default_factory=dict)
    """Last loss on each `data.eval_sources` set (perplexity = exp of it), by name."""


class _ProbeHooks(StepHooks):
    """The first step's memory probe: the bytes autograd saves for one micro-batch (the first;
    pipelined: each stage's first forward and the first loss), and the exact state bytes right
    after the optimizer step, written into `measured`."""

    def __init__(self, run: Run, measured: dict[str, Any]) -> None:
        self.run, self.measured = run, measured
        self.probe = SavedActivations(run.model)

    def microbatch(self, k: int) -> contextlib.AbstractContextManager:
        return self.probe.track() if k == 0 else contextlib.nullcontext()

    def pipeline_step(self, stages: Sequence[torch.nn.Module]
                      ) -> contextlib.AbstractContextManager:
        return self.probe.track_first_forward(stages)

    def event(self, name: str) -> None:
        if name == "optimizer_step":
            self.measured.update(state_bytes(self.run.model, self.run.optimizer))
            self.measured["activations"] = self.probe.bytes  # one micro-batch


NO_PROBE = StepHooks()


def val_batch_count(run: Run) -> int:
    """`train.eval_batches`, rounded up to whole pipeline steps under pipelining."""
    n = run.job.train.eval_batches
    k = run.grad_accum if run.pipeline is not None else 1
    return -(-n // k) * k


@torch.no_grad()
def evaluate(run: Run, batches: list[Batch]) -> float | None:
    """Mean validation loss over `batches` (all ranks). Pipelined: forward-only schedule runs
    over groups of `grad_accum` batches (the step's micro-batch count; `val_batch_count`
    rounds the count up to whole groups), the same mean over the same batches."""
    run.model.eval()
    if run.pipeline is not None:
        k = run.grad_accum
        losses = []
        for i in range(0, len(batches) - k + 1, k):
            inputs = torch.cat([x for x, _ in batches[i:i + k]]).to(run.device)
            targets = torch.cat([y for _, y in batches[i:i + k]]).to(run.device)
            with autocast(run.job.precision, run.device.type):
                losses.append(run.pipeline.eval_loss(inputs, targets) / run.scaler.scale)
        run.model.train()
        return all_mean(torch.stack(losses).mean()) if losses else None
    total = torch.zeros((), device=run.device)
    for inputs, targets in batches:
        inputs, targets, model_kw = local_batch(run, inputs, targets)
        with autocast(run.job.precision, run.device.type):
            loss = run.model(inputs, targets=targets, **model_kw)  # fused head+loss
        total += plain(loss).detach().float()
    run.model.train()
    return all_mean(total / max(1, len(batches)))


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


def _checkpoint_state(run: Run, step: int, wall_s: float) -> dict[str, Any]:
    # every dp rank's data position, gathered so rank 0 can write one JSON state
    mine = {str(run.dims.dp_rank): require_data(run, "a checkpoint").state_dict()}
    if dist.is_initialized():
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        mine = {k: v for d in everyone for k, v in d.items()}
    return {"step": step, "model": run.job.model.to_dict(), "scaler": run.scaler.state_dict(),
            "data": mine, "wall_s": wall_s}


def _payload(run: Run, step: int, wall_s: float) -> dict[str, Any]:
    return {"trainer_state": _checkpoint_state(run, step, wall_s), "extra": {"rng": _rng_state()}}


def save(run: Run, step: int, wall_s: float) -> Path:
    """Synchronous save: returns once the checkpoint is published."""
    return save_checkpoint(run.ckpt_dir, step, run.model, run.optimizer,
                           keep_last_n=run.job.checkpoint.keep_last_n,
                           **_payload(run, step, wall_s))


def _save(run: Run, step: int, wall_s: float, saver: AsyncCheckpointer | None) -> None:
    if saver is None:
        save(run, step, wall_s)
    else:  # returns once the state is copied; published when the background write completes
        saver.save(step, run.model, run.optimizer, **_payload(run, step, wall_s))


def restore(run: Run, path: Path) -> tuple[int, float]:
    """Load a checkpoint into the run; returns (step, wall seconds already spent)."""
    check_resume(path, run.job)  # JSON only, before any tensor is read
    state, extra = load_checkpoint(path, run.model, run.optimizer)
    if state["model"] != run.job.model.to_dict():
        raise ConfigError("checkpoint.resume", str(path),
                          "this checkpoint was written for a different model: use "
                          "--checkpoint.resume=never or another train.run_dir")
    run.scaler.load_state_dict(state["scaler"])
    # the data position is global (step, micro-step); any dp rank's record resumes any layout
    positions = state["data"]
    require_data(run, "resuming from a checkpoint").load_state_dict(
        positions.get(str(run.dims.dp_rank), positions["0"]))
    _set_rng_state(extra["rng"])
    return int(state["step"]), float(state.get("wall_s", 0.0))


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _initial_checkpoint(run: Run) -> Path | None:
    resume = run.job.checkpoint.resume
    if resume == "never":
        return None
    if resume == "auto":
        return latest_good(run.ckpt_dir, log=lambda m: run.is_main and print(m))
    return Path(resume)


def _rollback(run: Run, guard: SpikeGuard, step: int, verdict: SpikeVerdict,
              logger: MetricsLogger, saver: AsyncCheckpointer | None) -> int:
    """Restore the last good checkpoint and skip the data window of the spike; the new step."""
    if saver is not None:  # a save in flight holds accepted steps only: publish it first
        saver.wait()
    path = latest_good(run.ckpt_dir, log=logger.print)
    restored = restore(run, path)[0] if path is not None else step
    skip_to = step + 1 + run.job.guard.skip_steps  # data steps [restored, skip_to) are skipped
    require_data(run, "a spike rollback").skip_steps(skip_to - restored)
    run.optimizer.zero_grad(set_to_none=True)
    logger.print(f"step {step + 1}: SPIKE ({verdict.reason}) -> rolled back to step {restored}, "
                 f"skipping data steps {restored}..{skip_to - 1}")
    guard.record_rollback(step=step + 1, verdict=verdict, restored_step=restored,
                          data_skip=(restored, skip_to))
    return restored


def _save_tokenizer(tok: Tokenizer, directory: Path) -> None:
    """The run directory is self-contained: the tokenizer in its own format (what
    `data.tokenizer.load_tokenizer` reads) and as a transformers-loadable tokenizer.json."""
    directory.mkdir(exist_ok=True)
    tok.save(directory)
    save_hf_tokenizer(tok, directory)
    (directory / "name").write_text(tok.name + "\n")


def _fresh_run_dir(job: JobConfig) -> JobConfig:
    """With resume=auto, a run directory whose run already finished gets a sibling instead
    (runs/default -> runs/default-2, ...): running the same command twice trains twice rather
    than resuming a finished run and doing nothing. A worker torchrun restarted (a rank died
    after the final checkpoint was published) is not a new command: it resumes its own run,
    which is already done, instead of training again elsewhere."""
    run_dir = Path(job.train.run_dir)
    done = latest_good(run_dir / "checkpoints", log=lambda _: None)
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0  # set by torchrun
    if job.checkpoint.resume != "auto" or done is None or restarted \
            or int(done.name.split("_")[-1]) < job.train.steps:
        return job
    n = 2
    while Path(f"{run_dir}-{n}").exists():
        n += 1
    print(f"{run_dir} holds a finished run ({done.name}); training again in {run_dir}-{n}")
    return dataclasses.replace(job, train=dataclasses.replace(job.train,
                                                              run_dir=f"{run_dir}-{n}"))


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
    job = _fresh_run_dir(job)
    run = build_run(job)
    data = require_data(run, "training")
    load_initial_weights(run)  # checkpoint.init_from; a resume below wins over it
    enable_document_masking(run)  # data.document_masking
    runlock.acquire(run.run_dir, enabled=run.is_main)  # one training per run directory
    job = run.job  # with the layout the planner chose, when parallel.layout is auto
    step, wall_offset = 0, 0.0
    if (path := _initial_checkpoint(run)) is not None:
        step, wall_offset = restore(run, path)
    logger = MetricsLogger(run.run_dir, total_steps=job.train.steps, enabled=run.is_main,
                           tensorboard=job.train.tensorboard, progress=job.train.progress,
                           start_step=step)
    if run.is_main:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / "config.json").write_text(json.dumps(job.to_dict(), indent=1))
        _save_tokenizer(data.tokenizer, run.run_dir / "tokenizer")
        logger.print(run.describe())
        logger.print(start_line(path, step, resume=job.checkpoint.resume, ckpt_dir=run.ckpt_dir,
                                total_steps=job.train.steps))
    # collective when distributed (its own gloo group for the background writes)
    saver = AsyncCheckpointer(run.ckpt_dir, keep_last_n=job.checkpoint.keep_last_n) \
        if job.checkpoint.async_save else None
    guard = SpikeGuard(job.guard, fp16=job.precision.dtype == "fp16",
                       log_path=run.run_dir / "guard.jsonl")
    monitor = Monitor(run, logger, start_step=step)  # heartbeat, watchdog, stragglers, W&B
    val_batches = data.val_batches(val_batch_count(run))
    eval_sets = data.eval_batches(val_batch_count(run))  # data.eval_sources, by name
    eval_losses: dict[str, float] = {}
    batches = monitor.timed(data.train_batches())
    end_step = job.train.steps if max_steps is None else min(job.train.steps, step + max_steps)
    losses: list[float] = []
    measured: dict[str, Any] = {}
    val_loss: float | None = None
    t_start, tokens_seen, timed_s, dt = time.perf_counter(), 0, 0.0, float("nan")
    loss_value = float("nan")
    snapshot_path: Path | None = None
    signals.install()  # SIGINT/SIGTERM: finish the step, save, exit (checked after each step)
    clock.switch("steps")  # the loop's own work: steps and their logging

    while step < end_step:
        t0 = time.perf_counter()
        monitor.begin(step)
        lr = lr_at(step, optim=job.optim, total_steps=job.train.steps)
        set_lr(run.optimizer, lr)
        probe = _ProbeHooks(run, measured) if not measured else NO_PROBE
        try:
            with _memory_snapshot(run, enabled=not measured) as snap:
                out = train_step(run, batches, probe)
            snapshot_path = snapshot_path or snap
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
            if not is_allocation_failure(e):  # the CPU allocator raises RuntimeError
                raise
            if saver is not None:  # let the save in flight (of accepted steps) finish
                saver.close()
            data.close()
            logger.close()
            raise out_of_memory(run, step=step + 1, error=e) from e
        verdict = guard.check(out.loss, out.grad_norm)
        if verdict.spike:
            step = _rollback(run, guard, step, verdict, logger, saver)
            batches = monitor.timed(data.train_batches())
            continue
        apply_update(run, out, probe)
        if out.finite:
            guard.accept(out.loss)
        loss_value = out.loss
        losses.append(loss_value)
        step += 1

        dt = time.perf_counter() - t0
        if len(losses) > 1:  # the first step pays one-time costs (allocation, lazy init)
            tokens_seen += run.tokens_per_step
            timed_s += dt
        tok_s = run.tokens_per_step / dt
        record: dict[str, Any] = {
            "step": step, "loss": loss_value, "lr": lr, "grad_norm": out.grad_norm,
            "tokens_per_s": tok_s, "mfu": run.mfu(tok_s), "step_s": dt,
            "loss_scale": run.scaler.scale, "skipped": not out.finite}
        if step % job.train.eval_every == 0 or step == job.train.steps:
            with clock.phase("eval"):
                val_loss = evaluate(run, val_batches)
                record["val_loss"] = val_loss
                record.update(_evaluate_sets(run, eval_sets, eval_losses))
        record.update({f"mem_{k}": v for k, v in peak_process_memory(run.device).items()})
        monitor.end(record)
        logger.log(record)
        logger.advance(step, f"loss {loss_value:.3f} | {tok_s:,.0f} tok/s")
        if step % job.train.log_every == 0 or step == 1 or "val_loss" in record:
            logger.print(_line(record))
        stop = signals.stop_requested()
        if (job.checkpoint.every and step % job.checkpoint.every == 0) or step == end_step \
                or stop:
            with clock.phase("checkpoint"):
                _save(run, step, wall_offset + time.perf_counter() - t_start, saver)
        if stop:
            if saver is not None:
                saver.close()
            signals.exit_after_save(stop, step=step, log=logger.print)

    clock.switch("finish")  # the last background save, sample, export, run files
    if saver is not None:  # the last checkpoint is published before the run reports done
        with clock.phase("checkpoint"):
            saver.close()
            if dist.is_initialized():
                dist.barrier()
    data.close()
    tok_s = tokens_seen / timed_s if timed_s else run.tokens_per_step / max(dt, 1e-9)
    sample = ""
    if step >= job.train.steps and job.train.sample_tokens:
        # the training step's autocast: FSDP mixed precision casts only the parameters it
        # manages (expert-parallel experts stay fp32), and autocast aligns the rest
        with autocast(job.precision, run.device.type):
            ids = generate(run.model, data.tokenizer.encode("The "),
                           num_tokens=job.train.sample_tokens, context=job.batch.seq_len,
                           seed=job.train.seed, device=run.device, pad_multiple=run.dims.tp,
                           logits_fn=layout_logits_fn(run))
        sample = data.tokenizer.decode(ids)
    if job.checkpoint.export_hf and step >= job.train.steps:
        from scaletrain.checkpoint.hf import export_hf

        # collective: gathers shards (and pipeline stages); rank 0 writes
        export_hf(run.model, job.model, run.run_dir / "hf",
                  pp_group=run.pipeline.group if run.pipeline is not None else None)
        if run.is_main:
            save_hf_tokenizer(data.tokenizer, run.run_dir / "hf")
            logger.print(f"exported Hugging Face safetensors and tokenizer to "
                         f"{run.run_dir / 'hf'}")
    measured.update({f"peak_{k}": v for k, v in peak_process_memory(run.device).items()})
    result = RunResult(run_dir=run.run_dir, steps=step, final_loss=loss_value, val_loss=val_loss,
                       best_loss=data.best_loss_nats, tokens_per_s=tok_s, mfu=run.mfu(tok_s),
                       skipped_steps=run.scaler.skipped_steps, rollbacks=guard.rollbacks,
                       sample=sample, losses=losses, measured=measured, model=run.model,
                       memory_snapshot=snapshot_path, eval_losses=eval_losses)
    result.ledger = memory_ledger(run, measured)
    monitor.close(ledger=result.ledger)
    if run.is_main:
        if losses:  # a restarted run that was already done keeps the files of its last steps
            _write_run_files(run, result)
        logger.print(summary(result))
    logger.close()
    return result


def _write_run_files(run: Run, r: RunResult) -> None:
    """run_info.json (headline numbers), sample.txt, and measurement.json (this rank's measured
    memory in the planner's schema: exact state bytes, saved activations, process peak; see
    `Measurement.from_live`)."""
    d = run.run_dir
    info = {"steps": r.steps, "final_loss": r.final_loss, "val_loss": r.val_loss,
            "best_loss": r.best_loss, "tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
            "skipped_steps": r.skipped_steps, "rollbacks": r.rollbacks,
            "world_size": run.env.world_size, "device": run.device.type,
            "hardware": run.hardware.name, "params": run.job.model.num_params(),
            "eval": {k: {"val_loss": v, "ppl": perplexity(v)} for k, v in r.eval_losses.items()},
            # this process's wall seconds by phase so far (`scaletrain.clock`) and when they
            # were taken: a caller that timed the process can name the rest (imports, exit)
            "phases_s": clock.totals(), "phases_written_unix": time.time()}
    if r.memory_snapshot is not None:  # CUDA: every rank wrote its own, rank 0's is noted
        info["memory_snapshot"] = str(r.memory_snapshot)
    (d / "run_info.json").write_text(json.dumps(info, indent=1))
    if r.sample:
        (d / "sample.txt").write_text(r.sample)
    m = Measurement.from_live(r.measured, device_type=run.device.type, rank=run.env.rank,
                              world_size=run.env.world_size,
                              plan=plan_dict(run.job, run.dims.layout),
                              tokens_per_s=r.tokens_per_s)
    if r.memory_snapshot is not None:  # the schema's only free-text field
        m.notes.append(f"memory_snapshot: {r.memory_snapshot.name} (per rank: "
                       "memory_snapshot_rank{r}.pickle; view at pytorch.org/memory_viz)")
    m.write(d)


def _evaluate_sets(run: Run, sets: dict[str, list[Batch]], last: dict[str, float]
                   ) -> dict[str, float]:
    """Loss and perplexity of each eval source (all ranks), as metric fields; `last` keeps
    the latest loss per name (the run's result)."""
    out = {}
    for name, batches in sets.items():
        loss = evaluate(run, batches)
        if loss is None:
            continue
        last[name] = loss
        out[f"val_loss/{name}"], out[f"ppl/{name}"] = loss, perplexity(loss)
    return out


def _line(r: dict[str, Any]) -> str:
    val = f" | val {r['val_loss']:.4f}" if r.get("val_loss") is not None else ""
    val += "".join(f" | {k[9:]} {v:.4f} (ppl {r['ppl/' + k[9:]]:.2f})" for k, v in r.items()
                   if k.startswith("val_loss/"))
    skip = " | SKIPPED (non-finite grads)" if r["skipped"] else ""
    return (f"step {r['step']:5d} | loss {r['loss']:.4f}{val} | lr {r['lr']:.2e} | "
            f"grad {r['grad_norm']:.3f} | {r['tokens_per_s']:,.0f} tok/s | "
            f"mfu {r['mfu']:.2%}{skip}")
