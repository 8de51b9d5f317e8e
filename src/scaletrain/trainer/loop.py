"""The training loop: build everything from the plan, then a loop you can read top to bottom.

The single-process run is the distributed run at world size 1: every parallel axis of degree 1
is a no-op inside `parallelize`, so CPU tests exercise the real code path.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.checkpoint.dcp import latest_good, load_checkpoint, save_checkpoint
from scaletrain.config import ConfigError, JobConfig
from scaletrain.data import build_data
from scaletrain.measure.live import SavedActivations, peak_process_memory, state_bytes
from scaletrain.models import build_model, causal_lm_loss, materialize, moe_aux_loss
from scaletrain.parallel import (
    ParallelDims,
    clip_grad_norm_,
    loss_context,
    maybe_no_sync,
    parallelize,
)
from scaletrain.parallel.context_parallel import cp_positions, cp_shard
from scaletrain.planner.flops import flops_per_token

from .build import DistEnv, detect_hardware, init_distributed
from .metrics import MetricsLogger
from .optim import build_optimizer, lr_at, set_lr
from .precision import LossScaler, autocast
from .sample import generate

__all__ = ["train", "RunResult"]


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
    sample: str = ""
    losses: list[float] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)
    model: Any = field(default=None, repr=False)
    """The trained module (for tests, export and evaluation by the caller)."""


def _all_mean(x: torch.Tensor) -> float:
    if dist.is_initialized():
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.AVG if x.device.type == "cuda" else dist.ReduceOp.SUM)
        if x.device.type != "cuda":
            x /= dist.get_world_size()
    return float(x.item())


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _local_batch(inputs: torch.Tensor, targets: torch.Tensor, dims: ParallelDims,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Move a micro-batch to the device; with cp > 1 keep this rank's load-balanced chunks."""
    inputs, targets = inputs.to(device), targets.to(device)
    if dims.cp == 1:
        return inputs, targets, None
    rank, size = dims.cp_rank, dims.cp
    positions = cp_positions(inputs.shape[1], rank, size).to(device)
    return cp_shard(inputs, rank, size), cp_shard(targets, rank, size), positions


def _tp_mesh(dims: ParallelDims):
    return dims.submesh("tp") if dims.mesh is not None and dims.tp > 1 else None


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list, *, job: JobConfig, env: DistEnv,
             dims: ParallelDims) -> float:
    model.eval()
    total = torch.zeros((), device=env.device)
    for inputs, targets in batches:
        inputs, targets, positions = _local_batch(inputs, targets, dims, env.device)
        with autocast(job.precision, env.device.type):
            logits = model(inputs, positions=positions)
        with loss_context(_tp_mesh(dims)):
            total += causal_lm_loss(logits, targets).detach().float()
    model.train()
    return _all_mean(total / max(1, len(batches)))


def train(job: JobConfig, *, max_steps: int | None = None) -> RunResult:
    """Train `job` to `job.train.steps` (or stop after `max_steps` more steps, for tests)."""
    env = init_distributed(device_pref=job.train.device)
    layout = job.layout(env.world_size)
    dims = ParallelDims.from_layout(layout, env.world_size)
    if env.world_size > 1:  # a 1-rank job needs no process group: every axis is a no-op
        dims.build_mesh(env.device.type)
    grad_accum = job.batch.global_batch // (job.batch.micro_batch * layout.dp)
    run_dir = Path(job.train.run_dir)
    torch.manual_seed(job.train.seed)

    data = build_data(job.data, seq_len=job.batch.seq_len, micro_batch=job.batch.micro_batch,
                      grad_accum=grad_accum, dp_rank=dims.dp_rank, dp_size=layout.dp,
                      seed=job.data.seed)
    if data.tokenizer.vocab_size > job.model.vocab_size:
        raise ConfigError("model.vocab_size", job.model.vocab_size,
                          f"the {data.tokenizer.name} tokenizer has {data.tokenizer.vocab_size} "
                          "ids: raise model.vocab_size or choose a smaller tokenizer")

    model = build_model(job.model, device="meta")
    model = parallelize(model, dims, precision=job.precision, memory=job.memory,
                        compile=job.train.compile)
    materialize(model, device=env.device, seed=job.train.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, optim=job.optim, device_type=env.device.type, dims=dims)
    scaler = LossScaler(job.precision)

    step, wall_offset = 0, 0.0
    ckpt_dir = run_dir / "checkpoints"
    resume_from = None
    if job.checkpoint.resume == "auto":
        resume_from = latest_good(ckpt_dir, log=lambda m: env.is_main and print(m))
    elif job.checkpoint.resume != "never":
        resume_from = Path(job.checkpoint.resume)
    if resume_from is not None:
        state, extra = load_checkpoint(resume_from, model, optimizer)
        if state["model"] != job.model.to_dict():
            raise ConfigError("checkpoint.resume", str(resume_from),
                              "this checkpoint was written for a different model: use "
                              "--checkpoint.resume=never or a matching run_dir")
        step, wall_offset = state["step"], state.get("wall_s", 0.0)
        scaler.load_state_dict(state["scaler"])
        data.load_state_dict(state["data"][str(dims.dp_rank)])
        _set_rng_state(extra["rng"])

    hw = detect_hardware(job, env.device)
    peak_flops = hw.flops(job.precision.dtype) * env.world_size
    fpt = flops_per_token(job.model, job.batch.seq_len)
    tokens_per_step = job.batch.global_batch * job.batch.seq_len
    logger = MetricsLogger(run_dir, total_steps=job.train.steps, enabled=env.is_main,
                           tensorboard=job.train.tensorboard, progress=job.train.progress,
                           start_step=step)
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(job.to_dict(), indent=1))
        logger.print(f"scaletrain: {job.model.name} {job.model.num_params():,} params | "
                     f"layout {layout} | world {env.world_size} on {env.device.type} | "
                     f"{data.describe()}")

    val_batches = data.val_batches(job.train.eval_batches)
    batches = data.train_batches()
    end_step = job.train.steps if max_steps is None else min(job.train.steps, step + max_steps)
    losses: list[float] = []
    measured: dict[str, Any] = {}
    val_loss: float | None = None
    t_start = time.perf_counter()
    tokens_seen, timed_s = 0, 0.0
    loss_value = float("nan")

    while step < end_step:
        t0 = time.perf_counter()
        lr = lr_at(step, optim=job.optim, total_steps=job.train.steps)
        set_lr(optimizer, lr)
        loss_sum = torch.zeros((), device=env.device)
        for micro in range(grad_accum):
            inputs, targets, positions = _local_batch(*next(batches), dims, env.device)
            probe = SavedActivations(model) if (step == 0 and micro == 0) else None
            with maybe_no_sync(model, micro == grad_accum - 1), loss_context(_tp_mesh(dims)):
                with autocast(job.precision, env.device.type), \
                        (probe.track() if probe else _null()):
                    logits = model(inputs, positions=positions)
                    loss = causal_lm_loss(logits, targets)
                    total = loss + moe_aux_loss(model)
                scaler.scale_loss(total / grad_accum).backward()
            if probe is not None:
                measured["activations"] = probe.bytes
            loss_sum += loss.detach().float()
        finite = scaler.unscale_and_check(params)
        grad_norm = float(clip_grad_norm_(params, job.optim.grad_clip or float("inf")))
        finite = finite and math.isfinite(grad_norm)
        if finite:
            optimizer.step()
        scaler.update(finite)
        if step == 0:
            measured.update(state_bytes(model, optimizer))
        optimizer.zero_grad(set_to_none=True)
        loss_value = _all_mean(loss_sum / grad_accum)
        losses.append(loss_value)
        step += 1

        dt = time.perf_counter() - t0
        if step > 1:  # the first step pays one-time costs (allocation, lazy init, compile)
            tokens_seen += tokens_per_step
            timed_s += dt
        tok_s = tokens_per_step / dt
        mfu = tok_s * fpt / peak_flops
        record = {"step": step, "loss": loss_value, "lr": lr, "grad_norm": grad_norm,
                  "tokens_per_s": tok_s, "mfu": mfu, "step_s": dt,
                  "loss_scale": scaler.scale, "skipped": not finite}
        if step % job.train.eval_every == 0 or step == job.train.steps:
            val_loss = evaluate(model, val_batches, job=job, env=env, dims=dims)
            record["val_loss"] = val_loss
        record.update({f"mem_{k}": v for k, v in peak_process_memory(env.device).items()})
        logger.log(record)
        logger.advance(step, f"loss {loss_value:.3f} | {tok_s:,.0f} tok/s | mfu {mfu:.1%}")
        if step % job.train.log_every == 0 or step == 1 or "val_loss" in record:
            val = f" | val {val_loss:.4f}" if "val_loss" in record else ""
            skip = " | SKIPPED (non-finite)" if not finite else ""
            logger.print(f"step {step:5d} | loss {loss_value:.4f}{val} | lr {lr:.2e} | "
                         f"grad {grad_norm:.3f} | {tok_s:,.0f} tok/s | mfu {mfu:.2%}{skip}")
        stopping = step == end_step  # the planned end, or an early stop (max_steps)
        if (job.checkpoint.every and step % job.checkpoint.every == 0) or stopping:
            _save(ckpt_dir, step, model, optimizer, job=job, scaler=scaler, data=data, dims=dims,
                  wall_s=wall_offset + time.perf_counter() - t_start)

    data.close()
    tok_s = tokens_seen / timed_s if timed_s else (tokens_per_step / max(dt, 1e-9))
    sample = ""
    if step >= job.train.steps and job.train.sample_tokens and layout.pp == layout.cp == 1:
        ids = generate(model, data.tokenizer.encode("The "), num_tokens=job.train.sample_tokens,
                       context=job.batch.seq_len, seed=job.train.seed, device=env.device)
        sample = data.tokenizer.decode(ids)
    measured.update({f"peak_{k}": v for k, v in peak_process_memory(env.device).items()})
    result = RunResult(run_dir=run_dir, steps=step, final_loss=loss_value, val_loss=val_loss,
                       best_loss=data.best_loss_nats, tokens_per_s=tok_s,
                       mfu=tok_s * fpt / peak_flops, skipped_steps=scaler.skipped_steps,
                       sample=sample, losses=losses, measured=measured, model=model)
    if env.is_main:
        _summary(logger, result, job=job)
    logger.close()
    return result


def _null():
    import contextlib

    return contextlib.nullcontext()


def _save(ckpt_dir: Path, step: int, model, optimizer, *, job: JobConfig, scaler: LossScaler,
          data, dims: ParallelDims, wall_s: float) -> None:
    # every dp rank's data position, gathered so rank 0 can write one JSON state
    mine = {str(dims.dp_rank): data.state_dict()}
    if dist.is_initialized():
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        positions = {k: v for d in everyone for k, v in d.items()}
    else:
        positions = mine
    state = {"step": step, "model": job.model.to_dict(), "scaler": scaler.state_dict(),
             "data": positions, "wall_s": wall_s}
    save_checkpoint(ckpt_dir, step, model, optimizer, trainer_state=state,
                    extra={"rng": _rng_state()}, keep_last_n=job.checkpoint.keep_last_n)


def _summary(logger: MetricsLogger, r: RunResult, *, job: JobConfig) -> None:
    gib = 1024**2
    lines = [f"done: {r.steps} steps | final loss {r.final_loss:.4f}"]
    if r.val_loss is not None:
        lines[-1] += f" | val loss {r.val_loss:.4f}"
    if r.best_loss is not None:
        lines[-1] += f" | best achievable {r.best_loss:.4f} (corpus entropy)"
    lines.append(f"throughput {r.tokens_per_s:,.0f} tokens/s | MFU {r.mfu:.2%} | "
                 f"skipped steps {r.skipped_steps}")
    m = r.measured
    if m:
        lines.append("memory (MiB, this rank): " + ", ".join(
            f"{k} {v / gib:,.1f}" for k, v in m.items()))
    if r.sample:
        lines.append("sample:\n" + r.sample)
    lines.append(f"run directory: {r.run_dir.resolve()}")
    logger.print("\n".join(lines))
