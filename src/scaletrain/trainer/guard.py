"""Loss-spike guard: detect a spike, roll back to the last good checkpoint, skip its data window.

The recipe of PaLM (Chowdhery et al. 2022, §5.1): "restart training from a checkpoint roughly 100
steps before the spike started, and skip roughly 200-500 data batches". A spike here is a loss
far above its recent robust statistics — median and MAD of the last `window` losses, a robust
z-score above `threshold` AND at least `min_increase` relative to the median (so a flat, noiseless
curve does not trigger on tiny wiggles) — or a non-finite loss, or (outside fp16, whose loss
scaler owns overflow) a non-finite gradient norm. The step that spiked is never applied.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from scaletrain.config import GuardConfig

__all__ = ["SpikeGuard", "SpikeVerdict", "TooManyRollbacks"]


class TooManyRollbacks(RuntimeError):
    """The guard rolled back `max_rollbacks` times: the run is not recovering by itself."""


@dataclass(frozen=True)
class SpikeVerdict:
    spike: bool
    reason: str = ""
    median: float = float("nan")
    zscore: float = float("nan")


class SpikeGuard:
    def __init__(self, cfg: GuardConfig, *, fp16: bool, log_path: Path | None):
        self.cfg, self.fp16, self.log_path = cfg, fp16, log_path
        self.history: list[float] = []
        self.rollbacks = 0

    def check(self, loss: float, grad_norm: float) -> SpikeVerdict:
        """Judge this step's loss (before its update is applied)."""
        if not self.cfg.enabled:
            return SpikeVerdict(False)
        if not math.isfinite(loss):
            return SpikeVerdict(True, f"non-finite loss {loss}")
        if not self.fp16 and not math.isfinite(grad_norm):
            return SpikeVerdict(True, f"non-finite gradient norm {grad_norm}")
        recent = self.history[-self.cfg.window :]
        if len(recent) < self.cfg.min_history:
            return SpikeVerdict(False)
        med = statistics.median(recent)
        # 1.4826 * MAD estimates the standard deviation of normal data robustly
        mad = 1.4826 * statistics.median(abs(x - med) for x in recent)
        z = (loss - med) / max(mad, 1e-12)
        if z > self.cfg.threshold and loss > med * (1.0 + self.cfg.min_increase):
            return SpikeVerdict(
                True,
                f"loss {loss:.4f} is {z:.1f} robust sigmas above the "
                f"median {med:.4f} of the last {len(recent)} steps",
                med,
                z,
            )
        return SpikeVerdict(False, median=med, zscore=z)

    def accept(self, loss: float) -> None:
        """Record a step that was applied."""
        self.history.append(loss)
        del self.history[: -4 * self.cfg.window]

    def record_rollback(
        self,
        *,
        step: int,
        verdict: SpikeVerdict,
        restored_step: int | None,
        data_skip: tuple[int, int],
    ) -> None:
        """Count a rollback, append it to guard.jsonl, stop after too many."""
        self.rollbacks += 1
        self.history.clear()  # statistics from before the restored checkpoint no longer apply
        event = {
            "event": "rollback",
            "spike_step": step,
            "reason": verdict.reason,
            "restored_step": restored_step,
            "skipped_data_steps": list(data_skip),
            "rollbacks": self.rollbacks,
        }
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as f:
                f.write(json.dumps(event) + "\n")
        if self.rollbacks > self.cfg.max_rollbacks:
            raise TooManyRollbacks(
                f"loss-spike guard rolled back {self.rollbacks} times (last at step {step}: "
                f"{verdict.reason}); stopping. Lower optim.lr, raise optim.warmup_steps, check "
                f"the data around the skipped windows in {self.log_path}, or raise "
                "guard.max_rollbacks"
            )
