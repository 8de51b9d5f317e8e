"""A run's result: what `train` returns, and the files rank 0 writes from it (run_info.json,
sample.txt, measurement.json)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from scaletrain import clock
from scaletrain.measure.schema import Measurement, plan_dict

from .build import Run
from .metrics import perplexity

__all__ = ["RunResult", "write_run_files"]


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


def write_run_files(run: Run, r: RunResult) -> None:
    """run_info.json (headline numbers), sample.txt, and measurement.json (this rank's measured
    memory in the planner's schema: exact state bytes, saved activations, process peak; see
    `Measurement.from_live`)."""
    d = run.run_dir
    info = {
        "steps": r.steps,
        "final_loss": r.final_loss,
        "val_loss": r.val_loss,
        "best_loss": r.best_loss,
        "tokens_per_s": r.tokens_per_s,
        "mfu": r.mfu,
        "skipped_steps": r.skipped_steps,
        "rollbacks": r.rollbacks,
        "world_size": run.env.world_size,
        # ranks this launch put on one host (torchrun's / --nproc's LOCAL_WORLD_SIZE): they
        # share its cores and memory bandwidth, which a calibration's rates then include
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "device": run.device.type,
        # intra-op threads of each rank: a one-thread CPU rank's CPU seconds are its device
        # time (measure/calibrate.py reads the step's CPU clock then)
        "threads": torch.get_num_threads(),
        "hardware": run.hardware.name,
        "params": run.job.model.num_params(),
        "eval": {k: {"val_loss": v, "ppl": perplexity(v)} for k, v in r.eval_losses.items()},
        # this process's wall seconds by phase so far (`scaletrain.clock`) and when they
        # were taken: a caller that timed the process can name the rest (imports, exit)
        "phases_s": clock.totals(),
        "phases_written_unix": time.time(),
    }
    if r.memory_snapshot is not None:  # CUDA: every rank wrote its own, rank 0's is noted
        info["memory_snapshot"] = str(r.memory_snapshot)
    (d / "run_info.json").write_text(json.dumps(info, indent=1))
    if r.sample:
        (d / "sample.txt").write_text(r.sample)
    m = Measurement.from_live(
        r.measured,
        device_type=run.device.type,
        rank=run.env.rank,
        world_size=run.env.world_size,
        plan=plan_dict(run.job, run.dims.layout),
        tokens_per_s=r.tokens_per_s,
    )
    if r.memory_snapshot is not None:  # the schema's only free-text field
        m.notes.append(
            f"memory_snapshot: {r.memory_snapshot.name} (per rank: "
            "memory_snapshot_rank{r}.pickle; view at pytorch.org/memory_viz)"
        )
    m.write(d)
