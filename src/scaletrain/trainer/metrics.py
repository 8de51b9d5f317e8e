"""Per-step metrics to metrics.jsonl and TensorBoard, plus a live progress bar on rank 0."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "perplexity"]


def perplexity(loss: float) -> float:
    """exp(mean next-token loss in nats); inf past float range (a diverged run)."""
    return math.exp(loss) if loss < 700 else float("inf")


class MetricsLogger:
    """Writes one JSON object per logged step; mirrors scalars to TensorBoard; drives rich."""

    def __init__(
        self,
        run_dir: Path,
        *,
        total_steps: int,
        enabled: bool,
        tensorboard: bool,
        progress: bool,
        start_step: int = 0,
    ):
        self.enabled = enabled
        self._tb = None
        self._progress = None
        self._task = None
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(run_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # a queue of 100 events: the loop hands a step's event over without waiting
                # for the writer thread (the default 10 made it wait)
                self._tb = SummaryWriter(str(run_dir / "tb"), max_queue=100)
            except ImportError:  # tensorboard is a dependency, but keep training without it
                self._tb = None
        if progress and sys.stdout.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("{task.fields[status]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=total_steps, completed=start_step, status=""
            )

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            self._tb_scalars(record)

    def _tb_scalars(self, record: dict[str, Any]) -> None:
        """The record's numbers as one TensorBoard event (one Summary, a value per tag), not
        one event each as `add_scalar` writes: 0.46 -> 0.10 ms CPU per logged step (JSON line
        included) for the loop's 12 numbers, one thread. TensorBoard reads both alike
        (tests/unit/test_metrics_logger.py)."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        assert self._tb is not None
        values = [
            Summary.Value(tag=k, simple_value=float(v))
            for k, v in record.items()
            if k != "step" and isinstance(v, int | float)
        ]
        self._tb._get_file_writer().add_summary(Summary(value=values), record["step"])

    def advance(self, step: int, status: str) -> None:
        if self._progress is not None and self._task is not None:  # set together
            self._progress.update(self._task, completed=step, status=status)

    def print(self, text: str) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.stop()
        if self._tb is not None:
            self._tb.close()
        self._file.close()
