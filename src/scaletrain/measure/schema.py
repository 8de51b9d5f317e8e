"""`Measurement`: what a dry-run or a real run measured for one rank, in the planner's schema.

The `memory` object is the planner's `MemoryBreakdown` (docs/DESIGN.md §4), so every predicted
category has a measured twin:

- params      parameter storage this rank holds during the step's peak (sharded shards plus any
              unsharded FSDP copies in flight: `detail["params.unsharded"]`)
- grads       gradient storage (sharded plus unsharded-before-reduce-scatter)
- optimizer   optimizer state tensors (AdamW m and v, step counters)
- activations tensors saved by the forward for the backward (and recomputation)
- buffers     everything else: module buffers (RoPE tables), FSDP all-gather / reduce-scatter
              staging, backward temporaries (activation gradients), inputs; named in
              `buffer_terms`
- total       the allocated peak (the moment the categories above are read)
- reserved    the CUDA allocator's peak reservation (0 in a dry-run and on CPU)

Written as `measurement.json` next to a run's `config.json`; `scaletrain verify` reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.config import JobConfig, Layout, grad_accum_steps
from scaletrain.planner.types import MemoryBreakdown

__all__ = ["Measurement", "SOURCES", "memory_from_json", "plan_dict"]

SOURCES = ("dryrun", "cpu", "cuda")
_MEMORY_FLOATS = (
    "params",
    "grads",
    "optimizer",
    "activations",
    "buffers",
    "total",
    "reserved",
    "capacity",
)


def plan_dict(job: JobConfig, layout: Layout) -> dict[str, Any]:
    """The `plan` object of docs/DESIGN.md §4 for `job` run with `layout`."""
    b = job.batch
    return {
        "model": job.model.name,
        "params": job.model.num_params(),
        "gpus": layout.world_size,
        "dp": layout.dp,
        "zero": layout.zero,
        "tp": layout.tp,
        "sp": layout.sp,
        "pp": layout.pp,
        "pp_schedule": layout.pp_schedule,
        "pp_virtual": layout.pp_virtual,
        "cp": layout.cp,
        "ep": layout.ep,
        "micro_batch": b.micro_batch,
        "grad_accum": grad_accum_steps(b.global_batch, b.micro_batch, layout.dp),
        "seq_len": b.seq_len,
        "precision": job.precision.dtype,
        "ac": job.memory.ac,
        "offload": job.memory.offload,
    }


def memory_from_json(d: dict[str, Any]) -> MemoryBreakdown:
    """Inverse of `MemoryBreakdown.to_json()` (plus the optional named terms)."""
    floats: dict[str, Any] = {k: float(d.get(k, 0.0)) for k in _MEMORY_FLOATS}
    mem = MemoryBreakdown(**floats)
    mem.fits = bool(d.get("fits", True))
    mem.rank = int(d.get("rank", 0))
    mem.buffer_terms = {k: float(v) for k, v in d.get("buffer_terms", {}).items()}
    mem.detail = {k: float(v) for k, v in d.get("detail", {}).items()}
    return mem


@dataclass
class Measurement:
    """One rank's measured step: memory by category, timeline, FLOPs, and the plan it ran."""

    source: str
    """'dryrun' (fake tensors), 'cpu' (real CPU run) or 'cuda' (real GPU run)."""
    rank: int
    world_size: int
    memory: MemoryBreakdown
    timeline: list[tuple[str, int]] = field(default_factory=list)
    """(event, allocated bytes) through one step, e.g. ('fw_pre:layers.0', 1.2e9)."""
    flops: float = 0.0
    """FLOPs this rank executed in one optimizer step (FlopCounterMode; 0 if not counted)."""
    plan: dict[str, Any] = field(default_factory=dict)
    """The `plan` object of docs/DESIGN.md §4 for the layout that ran."""
    step_s: float = 0.0
    """Mean seconds per optimizer step of a real run (0 for a dry-run)."""
    tokens_per_s: float = 0.0
    """Whole-job tokens per second of a real run (0 for a dry-run)."""
    wall_s: float = 0.0
    """Seconds the measurement itself took (a dry-run's cost)."""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"Measurement.source={self.source!r}: use one of {SOURCES}")

    def to_json(self) -> dict[str, Any]:
        memory = self.memory.to_json()
        memory["buffer_terms"] = {k: int(v) for k, v in self.memory.buffer_terms.items()}
        memory["detail"] = {k: int(v) for k, v in self.memory.detail.items()}
        return {
            "source": self.source,
            "rank": self.rank,
            "world_size": self.world_size,
            "plan": self.plan,
            "memory": memory,
            "flops_per_step": self.flops,
            "timeline": [[e, int(b)] for e, b in self.timeline],
            "step_s": self.step_s,
            "tokens_per_s": self.tokens_per_s,
            "wall_s": self.wall_s,
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Measurement:
        return cls(
            source=str(d.get("source", "cpu")),
            rank=int(d.get("rank", 0)),
            world_size=int(d.get("world_size", 1)),
            memory=memory_from_json(d.get("memory", {})),
            timeline=[(str(e), int(b)) for e, b in d.get("timeline", [])],
            flops=float(d.get("flops_per_step", 0.0)),
            plan=dict(d.get("plan", {})),
            step_s=float(d.get("step_s", 0.0)),
            tokens_per_s=float(d.get("tokens_per_s", 0.0)),
            wall_s=float(d.get("wall_s", 0.0)),
            notes=list(d.get("notes", [])),
        )

    @classmethod
    def from_live(
        cls,
        measured: dict[str, Any],
        *,
        device_type: str,
        rank: int,
        world_size: int,
        plan: dict[str, Any],
        step_s: float = 0.0,
        tokens_per_s: float = 0.0,
    ) -> Measurement:
        """A real run's measurement from the trainer's `measured` dict (`measure.live`).

        measured: 'params', 'grads', 'optimizer' (local state bytes), 'activations' (bytes
        saved for backward in one micro-batch), and 'peak_allocated' / 'peak_reserved' (CUDA)
        or 'peak_rss' (CPU). On CUDA, `total` is the allocator's peak and `buffers` what the
        peak holds beyond the four categories; on CPU there is no allocator peak, so `total`
        is the sum of the categories and the process's max RSS is kept in `detail['rss']`.
        """
        mem = MemoryBreakdown(rank=rank)
        for k in ("params", "grads", "optimizer", "activations"):
            setattr(mem, k, float(measured.get(k, 0.0)))
        parts = mem.params + mem.grads + mem.optimizer + mem.activations
        if device_type == "cuda":
            mem.total = float(measured.get("peak_allocated", parts))
            mem.reserved = float(measured.get("peak_reserved", 0.0))
            mem.buffers = max(0.0, mem.total - parts)
            mem.buffer_terms["unattributed"] = mem.buffers
        else:
            mem.total = parts
            if "peak_rss" in measured:
                mem.detail["rss"] = float(measured["peak_rss"])
        return cls(
            source="cuda" if device_type == "cuda" else "cpu",
            rank=rank,
            world_size=world_size,
            memory=mem,
            plan=dict(plan),
            step_s=step_s,
            tokens_per_s=tokens_per_s,
        )

    def write(self, path: str | Path) -> Path:
        """Write `measurement.json` (pass a directory or a file path)."""
        p = Path(path)
        if p.is_dir():
            p = p / "measurement.json"
        p.write_text(json.dumps(self.to_json(), indent=1))
        return p

    @classmethod
    def read(cls, path: str | Path) -> Measurement:
        p = Path(path)
        if p.is_dir():
            p = p / "measurement.json"
        return cls.from_json(json.loads(p.read_text()))
