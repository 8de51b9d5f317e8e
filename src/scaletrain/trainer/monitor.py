"""Everything that watches a run from beside the loop, behind three calls from it:
`begin(step)` before a step, `end(record)` once its metrics record is built, `close(...)` at the
end. Heartbeat and hang watchdog (`watchdog`), straggler report (`stragglers`), W&B
(`tracking`); configured by `[monitor]` (`config.monitor.MonitorConfig`)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from scaletrain.data.loader import Batch

from .build import Run
from .metrics import MetricsLogger
from .stragglers import StragglerTracker
from .tracking import WandbTracker
from .watchdog import Heartbeat, Watchdog

__all__ = ["Monitor"]


class _TimedBatches(Iterator[Batch]):
    """The loop's batch iterator, timing how long this rank waits for each batch."""

    def __init__(self, inner: Iterator[Batch], monitor: Monitor) -> None:
        self.inner, self.monitor = inner, monitor

    def __next__(self) -> Batch:
        m = self.monitor
        t0 = time.perf_counter()
        if m.watchdog is not None:
            m.watchdog.in_data = True
        try:
            return next(self.inner)
        finally:
            if m.watchdog is not None:
                m.watchdog.in_data = False
            m.data_wait_s += time.perf_counter() - t0


class Monitor:
    def __init__(self, run: Run, logger: MetricsLogger, *, start_step: int):
        cfg = run.job.monitor
        rank, world = run.env.rank, run.env.world_size
        self.run, self.logger, self.step = run, logger, start_step
        self.data_wait_s = 0.0
        self.heartbeat = Heartbeat(run.run_dir, rank=rank, enabled=cfg.heartbeat)
        self.heartbeat.beat(step=start_step, state="started")
        self.watchdog = None
        if cfg.watchdog_timeout_s > 0:
            backend = dist.get_backend() if dist.is_initialized() else None
            self.watchdog = Watchdog(
                run.run_dir,
                rank=rank,
                world_size=world,
                timeout_s=cfg.watchdog_timeout_s,
                factor=cfg.watchdog_factor,
                backend=backend,
            )
        self.stragglers = StragglerTracker(
            every=cfg.straggler_every, factor=cfg.straggler_factor, device=run.device
        )
        self.tracker = None
        if cfg.wandb and run.is_main:
            self.tracker = WandbTracker(
                run.run_dir, project=cfg.wandb_project, config=run.job.to_dict()
            )

    def timed(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        return _TimedBatches(batches, self)

    def begin(self, step: int) -> None:
        self.data_wait_s = 0.0
        if self.watchdog is not None:  # the caller's frame: the loop the watchdog guards
            self.watchdog.begin(step, loop_frame=sys._getframe(1))

    def end(self, record: dict[str, Any]) -> None:
        """After a step: adds data_wait_s (and, every k steps, the ranks' timings) to `record`,
        beats the heartbeat, logs to W&B. Collective every `monitor.straggler_every` steps."""
        if self.watchdog is not None:
            self.watchdog.end()
        self.step = step = int(record["step"])
        record["data_wait_s"] = self.data_wait_s
        self.stragglers.add(step_s=float(record["step_s"]), data_wait_s=self.data_wait_s)
        report = self.stragglers.maybe_report(step)
        if report is not None:
            record.update(report.record())
            if report.stragglers and self.run.is_main:
                self.logger.print(report.line())
                with open(self.run.run_dir / "stragglers.jsonl", "a") as f:
                    f.write(
                        json.dumps({"step": step, "reasons": report.reasons, **report.record()})
                        + "\n"
                    )
        self.heartbeat.beat(
            step=step,
            state="running",
            loss=record.get("loss"),
            tokens_per_s=record.get("tokens_per_s"),
        )
        if self.tracker is not None:
            self.tracker.log(record)

    def close(self, *, ledger: str = "") -> None:
        if self.watchdog is not None:
            self.watchdog.close()
        self.heartbeat.beat(step=self.step, state="exited")  # cleanly; done or not
        if self.tracker is not None:
            from scaletrain.measure.schema import plan_dict

            self.tracker.finish(plan=plan_dict(self.run.job, self.run.dims.layout), ledger=ledger)
