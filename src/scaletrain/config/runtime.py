"""How a run is driven, as typed sections of `JobConfig`: steps and logging (`train`), the
loss-spike guard (`guard`), checkpoints (`checkpoint`) and the hardware it runs on or is
priced for (`hardware`). Each validates itself on construction.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import require
from .choices import Device, check_choices
from .hardware import GB, HARDWARE_PRESETS, HardwareSpec, hardware_preset
from .strict import did_you_mean

__all__ = ["TrainConfig", "GuardConfig", "CheckpointConfig", "HardwareConfig"]


@dataclass
class TrainConfig:
    steps: int = 800
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = 0
    device: Device = "auto"
    """'auto' (cuda if available), 'cpu' or 'cuda'."""
    compile: bool = False
    run_dir: str = "runs/default"
    sample_tokens: int = 200
    """Length of the text sample generated at the end (0 = none)."""
    progress: bool = True
    """Live progress bar (rich) on rank 0, and (stderr, every 5 s) the ingestion progress
    line while a large corpus is tokenized."""
    tensorboard: bool = True
    force: bool = False
    """Train a single process even when the planner's peak exceeds the free host/GPU memory
    (`scaletrain train` refuses it before allocating otherwise: orchestrate.fit_check)."""
    rendezvous_timeout_s: float = 300.0
    """Seconds a rank waits for all WORLD_SIZE ranks to arrive before a one-line error."""

    def __post_init__(self) -> None:
        require(self.steps >= 1, "train.steps", self.steps, "use a positive integer")
        for f in ("log_every", "eval_every", "eval_batches"):
            v = getattr(self, f)
            require(v >= 1, f"train.{f}", v, "use a positive integer")
        require(
            self.eval_batches <= 10_000,
            "train.eval_batches",
            self.eval_batches,
            "use at most 10000 (validation batches are held in memory for the whole run)",
        )
        require(self.sample_tokens >= 0, "train.sample_tokens", self.sample_tokens, "use >= 0")
        check_choices(self, "train")  # device
        require(
            0 < self.rendezvous_timeout_s <= 86_400,
            "train.rendezvous_timeout_s",
            self.rendezvous_timeout_s,
            "use seconds in (0, 86400]",
        )
        require(
            bool(self.run_dir.strip()),
            "train.run_dir",
            self.run_dir,
            "give a directory such as runs/default (empty would write into the current one)",
        )


@dataclass
class GuardConfig:
    """Loss-spike guard (PaLM recipe): roll back to the last good checkpoint, skip the data."""

    enabled: bool = True
    window: int = 50
    """Recent applied steps whose median/MAD define 'normal'."""
    min_history: int = 20
    """Steps of history before spikes are judged (non-finite values are judged always)."""
    threshold: float = 6.0
    """Robust z-score above which a loss is a spike."""
    min_increase: float = 0.2
    """...and it must also exceed the median by this fraction."""
    skip_steps: int = 200
    """Optimizer steps of data skipped past the spike after a rollback (PaLM: 200-500 batches)."""
    max_rollbacks: int = 3

    def __post_init__(self) -> None:
        for f in ("window", "min_history", "max_rollbacks"):
            v = getattr(self, f)
            require(v >= 1, f"guard.{f}", v, "use a positive integer")
        require(
            self.min_history <= self.window,
            "guard.min_history",
            self.min_history,
            f"must not exceed guard.window={self.window}",
        )
        require(self.threshold > 0, "guard.threshold", self.threshold, "use a positive float")
        require(self.min_increase >= 0, "guard.min_increase", self.min_increase, "use >= 0")
        require(self.skip_steps >= 0, "guard.skip_steps", self.skip_steps, "use >= 0")


@dataclass
class CheckpointConfig:
    every: int = 0
    """Save every N steps (0 = only at the end)."""
    keep_last_n: int = 2
    resume: str = "auto"
    """'auto' (latest good checkpoint in run_dir, if any), 'never', or a checkpoint path."""
    async_save: bool = False
    """Write checkpoints from a background thread (torch.distributed.checkpoint.async_save)
    while training continues; each is published (manifest + rename) only once fully written,
    at most one is in flight, and the run waits for the last before it ends."""
    export_hf: bool = False
    """Also export safetensors + config.json with Hugging Face names at the end."""
    init_from: str = ""
    """A Hugging Face model directory (config.json + *.safetensors, sharded or not) whose
    weights initialize the model; its config.json is the model config unless model.name is
    given. A resume from this run's own checkpoint wins over it."""

    def __post_init__(self) -> None:
        require(self.every >= 0, "checkpoint.every", self.every, "use >= 0 (0 = end only)")
        require(self.keep_last_n >= 1, "checkpoint.keep_last_n", self.keep_last_n, "use >= 1")
        require(
            isinstance(self.async_save, bool),
            "checkpoint.async_save",
            self.async_save,
            "use true or false",
        )
        if self.resume not in ("auto", "never"):
            from .strict import did_you_mean

            require(
                bool(self.resume.strip()) and Path(self.resume).is_dir(),
                "checkpoint.resume",
                self.resume,
                "give 'auto', 'never' or an existing checkpoint directory (a step_* "
                f"folder){did_you_mean(self.resume, ('auto', 'never'))}",
            )
        if self.init_from:
            require(
                (Path(self.init_from) / "config.json").is_file(),
                "checkpoint.init_from",
                self.init_from,
                "give a Hugging Face model directory holding config.json",
            )


@dataclass
class HardwareConfig:
    gpu: str = "cpu"
    """Accelerator preset (see scaletrain.config.HARDWARE_PRESETS)."""
    gpus: int = 0
    """Number of accelerators; 0 = the world size of the run."""
    gpus_per_node: int = 0
    """0 = the preset's value."""
    usd_per_gpu_hour: float = 0.0
    """0 = the preset's rough cloud price."""
    efficiency: float = 0.0
    """Achievable fraction of peak matmul FLOP/s; 0 = the planner's default."""
    grid_kg_co2_per_kwh: float = 0.43
    """Grid carbon intensity, kg CO2 per kWh (0.43: the average grid of seed 004's carbon
    napkin math)."""
    pue: float = 1.2
    """Data-centre power usage effectiveness (energy multiplier)."""
    host_watts_per_node: float = 0.0
    """Host (CPU, NIC, fans) power per node, watts, added to the GPUs' board power in the
    energy line; 0 = not counted (seed 004's carbon example uses 200 W per 8-GPU host)."""
    host_memory_gb: float = 0.0
    """Host RAM per node, GB (1e9 bytes): what CPU offload (`memory.offload`) may fill; the
    planner refuses layouts whose offloaded bytes per node exceed it. 0 = the preset's (2 TB
    for the 8-GPU H100 / H200 nodes; unknown, so unchecked, for the others)."""

    def __post_init__(self) -> None:
        require(
            self.gpu in HARDWARE_PRESETS,
            "hardware.gpu",
            self.gpu,
            f"use one of {', '.join(HARDWARE_PRESETS)}{did_you_mean(self.gpu, HARDWARE_PRESETS)}",
        )
        require(self.gpus >= 0, "hardware.gpus", self.gpus, "use >= 0 (0 = world size)")
        require(self.gpus_per_node >= 0, "hardware.gpus_per_node", self.gpus_per_node, "use >= 0")
        require(0 <= self.efficiency <= 1, "hardware.efficiency", self.efficiency, "use 0..1")
        require(self.pue >= 1, "hardware.pue", self.pue, "use >= 1.0")
        require(
            self.usd_per_gpu_hour >= 0,
            "hardware.usd_per_gpu_hour",
            self.usd_per_gpu_hour,
            "use a price >= 0 (0 = the preset's)",
        )
        require(
            self.grid_kg_co2_per_kwh >= 0,
            "hardware.grid_kg_co2_per_kwh",
            self.grid_kg_co2_per_kwh,
            "use kg CO2 per kWh >= 0, e.g. 0.43",
        )
        require(
            math.isfinite(self.host_memory_gb) and self.host_memory_gb >= 0,
            "hardware.host_memory_gb",
            self.host_memory_gb,
            "use the node's RAM in GB, e.g. 128 (0 = the preset's)",
        )
        require(
            self.host_watts_per_node >= 0,
            "hardware.host_watts_per_node",
            self.host_watts_per_node,
            "use watts >= 0",
        )

    def spec(self) -> HardwareSpec:
        spec = hardware_preset(self.gpu)
        changes: dict[str, Any] = {}
        if self.gpus_per_node:
            changes["gpus_per_node"] = self.gpus_per_node
        if self.usd_per_gpu_hour:
            changes["usd_per_hour"] = self.usd_per_gpu_hour
        if self.host_memory_gb:
            changes["host_memory_bytes"] = self.host_memory_gb * GB
        return dataclasses.replace(spec, **changes) if changes else spec
