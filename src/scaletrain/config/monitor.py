"""`[monitor]`: watching a run from the outside: heartbeat, hang watchdog, straggler report,
experiment tracking. Nothing here changes the numerics of a step."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from ._errors import require

__all__ = ["MonitorConfig"]


@dataclass
class MonitorConfig:
    heartbeat: bool = True
    """Each rank rewrites run_dir/heartbeat/rank{r}.json after every step (`scaletrain status`
    reads them; the watchdog names stuck ranks from them)."""
    watchdog_timeout_s: float = 900.0
    """A step running longer than max(this, watchdog_factor x median step time) is a hang:
    stacks and the last collectives are dumped to run_dir/watchdog/ and the job exits
    (0 = no watchdog). The first step after a (re)start only has this bound (no median yet)."""
    watchdog_factor: float = 20.0
    """Multiple of the median step time (over the steps of this process) that is a hang."""
    straggler_every: int = 50
    """Gather every rank's mean step and data-wait time every N steps (0 = never); one
    all_gather of 2 floats per rank."""
    straggler_factor: float = 1.5
    """A rank whose step or data-wait time exceeds this multiple of the ranks' median is a
    straggler (data waits under 5% of the median step time are ignored as noise)."""
    wandb: bool = False
    """Log metrics, config, plan and memory ledger to Weights & Biases (rank 0; needs the
    `wandb` extra: pip install 'scaletrain[wandb]'; WANDB_MODE=offline needs no network)."""
    wandb_project: str = "scaletrain"

    def __post_init__(self) -> None:
        require(
            self.watchdog_timeout_s >= 0,
            "monitor.watchdog_timeout_s",
            self.watchdog_timeout_s,
            "use seconds >= 0 (0 = no watchdog)",
        )
        require(
            self.watchdog_factor >= 1,
            "monitor.watchdog_factor",
            self.watchdog_factor,
            "use a multiple >= 1 of the median step time",
        )
        require(
            self.straggler_every >= 0,
            "monitor.straggler_every",
            self.straggler_every,
            "use steps >= 0 (0 = never)",
        )
        require(
            self.straggler_factor > 1,
            "monitor.straggler_factor",
            self.straggler_factor,
            "use a factor > 1 (e.g. 1.5)",
        )
        if self.wandb:  # checked here, before any work starts; imported only when training
            require(
                importlib.util.find_spec("wandb") is not None,
                "monitor.wandb",
                self.wandb,
                "install the extra (pip install 'scaletrain[wandb]') or set --monitor.wandb=false",
            )
