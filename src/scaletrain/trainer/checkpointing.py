"""What the training loop saves and restores: checkpoints of the run (model, optimizer, scaler,
every rank's data position, RNG), resuming, the spike guard's rollback, and the fresh run
directory a finished run's second invocation gets.

`save` and `restore` are the only calls that write and read a checkpoint here (the fault
tests patch them on this module).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.checkpoint.dcp import (
    AsyncCheckpointer,
    CheckpointError,
    latest_good,
    load_checkpoint,
    save_checkpoint,
)
from scaletrain.checkpoint.manifest import list_checkpoints, verify_checkpoint
from scaletrain.config import ConfigError, JobConfig

from .build import Run, require_data
from .guard import SpikeGuard, SpikeVerdict
from .metrics import MetricsLogger
from .resume_check import check_resume

__all__ = ["save", "save_step", "restore", "resume", "rollback", "fresh_run_dir"]


def _checkpoint_state(run: Run, step: int, wall_s: float) -> dict[str, Any]:
    # every dp rank's data position, gathered so rank 0 can write one JSON state
    mine = {str(run.dims.dp_rank): require_data(run, "a checkpoint").state_dict()}
    if dist.is_initialized():
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        mine = {k: v for d in everyone for k, v in d.items()}
    return {
        "step": step,
        "model": run.job.model.to_dict(),
        "scaler": run.scaler.state_dict(),
        "data": mine,
        "wall_s": wall_s,
    }


def _payload(run: Run, step: int, wall_s: float) -> dict[str, Any]:
    return {"trainer_state": _checkpoint_state(run, step, wall_s), "extra": {"rng": _rng_state()}}


def save(run: Run, step: int, wall_s: float) -> Path:
    """Synchronous save: returns once the checkpoint is published."""
    return save_checkpoint(
        run.ckpt_dir,
        step,
        run.model,
        run.optimizer,
        keep_last_n=run.job.checkpoint.keep_last_n,
        **_payload(run, step, wall_s),
    )


def save_step(run: Run, step: int, wall_s: float, saver: AsyncCheckpointer | None) -> None:
    """The loop's save: synchronous, or handed to the background writer `saver`."""
    if saver is None:
        save(run, step, wall_s)
    else:  # returns once the state is copied; published when the background write completes
        saver.save(step, run.model, run.optimizer, **_payload(run, step, wall_s))


def restore(run: Run, path: Path) -> tuple[int, float]:
    """Load a checkpoint into the run; returns (step, wall seconds already spent)."""
    check_resume(path, run.job)  # JSON only, before any tensor is read
    state, extra = load_checkpoint(path, run.model, run.optimizer)
    _check_trainer_state(path, state, extra)
    if state["model"] != run.job.model.to_dict():
        raise ConfigError(
            "checkpoint.resume",
            str(path),
            "this checkpoint was written for a different model: use "
            "--checkpoint.resume=never or another train.run_dir",
        )
    run.scaler.load_state_dict(state["scaler"])
    # the data position is global (step, micro-step); any dp rank's record resumes any layout
    positions = state["data"]
    require_data(run, "resuming from a checkpoint").load_state_dict(
        positions.get(str(run.dims.dp_rank), positions["0"])
    )
    _set_rng_state(extra["rng"])
    return int(state["step"]), float(state.get("wall_s", 0.0))


def _check_trainer_state(path: Path, state: dict[str, Any], extra: dict[str, Any]) -> None:
    """The fields `restore` reads, of the types `_payload` writes: a checkpoint whose files
    match its manifest can still hold others (written by hand, or by another version), which
    would otherwise surface as a KeyError or ValueError traceback mid-restore."""
    step, data = state.get("step"), state.get("data")
    problem = ""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        problem = f"trainer_state.json's step is {step!r}, not a non-negative integer"
    elif not isinstance(state.get("model"), dict) or not isinstance(state.get("scaler"), dict):
        problem = "trainer_state.json lacks its model or scaler record"
    elif not isinstance(data, dict) or not isinstance(data.get("0"), dict):
        problem = "trainer_state.json lacks the data position (its 'data' record of rank 0)"
    elif not isinstance(state.get("wall_s", 0.0), int | float):
        problem = f"trainer_state.json's wall_s is {state.get('wall_s')!r}, not a number"
    elif not isinstance(extra.get("rng"), dict) or "cpu" not in extra["rng"]:
        problem = "its extra_rank file lacks the RNG state"
    if problem:
        raise CheckpointError(
            f"checkpoint {path} is unusable: {problem}; resume another checkpoint, or use "
            "--checkpoint.resume=never / another train.run_dir"
        )


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def resume(run: Run) -> tuple[Path | None, int, float]:
    """Load the checkpoint `checkpoint.resume` names into the run, if any: (its path, step,
    wall seconds already spent); (None, 0, 0.0) for a fresh start."""
    path = _initial_checkpoint(run)
    if path is None:
        return None, 0, 0.0
    step, wall_s = restore(run, path)
    return path, step, wall_s


def _initial_checkpoint(run: Run) -> Path | None:
    resume = run.job.checkpoint.resume
    if resume == "never":
        return None
    if resume == "auto":
        path = latest_good(run.ckpt_dir, log=lambda m: run.is_main and print(m))
        saved = list_checkpoints(run.ckpt_dir)
        if path is None and saved:
            # starting over would train from step 0 with exit 0 and write over their steps:
            # the user decides (the lines above said why each is unusable)
            raise CheckpointError(
                f"every checkpoint in {run.ckpt_dir} is unusable ({len(saved)}, newest "
                f"{saved[-1].name}: {verify_checkpoint(saved[-1])}); repair one and resume it "
                "by path (checkpoint.resume=DIR), or set checkpoint.resume=never to start "
                "over (they are kept)"
            )
        return path
    return Path(resume)


def rollback(
    run: Run,
    guard: SpikeGuard,
    step: int,
    verdict: SpikeVerdict,
    logger: MetricsLogger,
    saver: AsyncCheckpointer | None,
) -> int:
    """Restore the last good checkpoint and skip the data window of the spike; the new step."""
    if saver is not None:  # a save in flight holds accepted steps only: publish it first
        saver.wait()
    path = latest_good(run.ckpt_dir, log=logger.print)
    restored = restore(run, path)[0] if path is not None else step
    skip_to = step + 1 + run.job.guard.skip_steps  # data steps [restored, skip_to) are skipped
    require_data(run, "a spike rollback").skip_steps(skip_to - restored)
    run.optimizer.zero_grad(set_to_none=True)
    logger.print(
        f"step {step + 1}: SPIKE ({verdict.reason}) -> rolled back to step {restored}, "
        f"skipping data steps {restored}..{skip_to - 1}"
    )
    guard.record_rollback(
        step=step + 1, verdict=verdict, restored_step=restored, data_skip=(restored, skip_to)
    )
    return restored


def fresh_run_dir(job: JobConfig) -> JobConfig:
    """With resume=auto, a run directory whose run already finished gets a sibling instead
    (runs/default -> runs/default-2, ...): running the same command twice trains twice rather
    than resuming a finished run and doing nothing. A worker torchrun restarted (a rank died
    after the final checkpoint was published) is not a new command: it resumes its own run,
    which is already done, instead of training again elsewhere."""
    run_dir = Path(job.train.run_dir)
    done = latest_good(run_dir / "checkpoints", log=lambda _: None)
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0  # set by torchrun
    if (
        job.checkpoint.resume != "auto"
        or done is None
        or restarted
        or int(done.name.split("_")[-1]) < job.train.steps
    ):
        return job
    n = 2
    while Path(f"{run_dir}-{n}").exists():
        n += 1
    if int(os.environ.get("RANK", "0")) == 0:  # every rank moves; one says so
        print(f"{run_dir} holds a finished run ({done.name}); training again in {run_dir}-{n}")
    return dataclasses.replace(job, train=dataclasses.replace(job.train, run_dir=f"{run_dir}-{n}"))
