"""`verify`'s input line: the loader's measured wait per step against the input rate the plan
requires (`planner.time.input_rate`), and the source named when it held the steps.

Measured: `data_wait_s`, the seconds rank 0 waited for its batches in each step (the trainer's
monitor times every `next()` on the loader, inside `step_s`), averaged over the timed steps
(`throughput.timed_steps`: the first step, which starts the prefetch thread, excluded), and
the tokens/s the rank consumed (its tokens per step over the measured step). Required: the
plan's tokens/s per dp replica and the storage bytes per node it implies.

The plan assumes the input costs the step nothing (the loader's thread prefetches while the
step computes), so any wait is the loader falling short; a wait of `SLOW_SHARE` of the step or
more names `data.source` as the bottleneck, with the loader's settings that decide it.
"""

from __future__ import annotations

from typing import Any

from scaletrain.config import JobConfig

from .run_files import finite
from .throughput import timed_steps

__all__ = ["SLOW_SHARE", "input_check", "format_input"]

SLOW_SHARE = 0.1
"""The share of the step spent waiting for data from which `verify` names the source: a
reporting threshold (a tenth of the step is worth a look), not a fitted figure."""


def input_check(
    job: JobConfig, est: Any, rows: list[dict[str, Any]], *, dp: int
) -> tuple[dict[str, float], list[str]]:
    """(figures for `Comparison.time`, notes) of a run's metrics rows; empty without a logged
    wait (a run from before the monitor timed it) or without timed steps."""
    timed = [r for r in timed_steps(rows) if finite(r.get("data_wait_s")) is not None]
    if not timed:
        return {}, []
    wait = sum(float(r["data_wait_s"]) for r in timed) / len(timed)
    step = sum(float(r["step_s"]) for r in timed) / len(timed)
    b = job.batch
    rank_tokens = b.global_batch // max(1, dp) * b.seq_len  # this rank's tokens per step
    out = {
        "measured_data_wait_s": wait,
        "measured_data_wait_share": wait / step,
        "measured_rank_tokens_per_s": rank_tokens / step,
    }
    notes = []
    if est is not None:
        from scaletrain.planner.time.input_rate import input_rate

        r = input_rate(est)
        out |= {
            "required_rank_tokens_per_s": r.replica_tokens_per_s,
            "required_node_bytes_per_s": r.node_bytes_per_s,
            "storage_bytes_per_s": r.storage_bytes_per_s,
        }
    if wait / step >= SLOW_SHARE:
        d = job.data
        why = [f"data.prefetch = {d.prefetch} batches ahead"]
        if d.delay_s:
            why.append(f"data.delay_s = {d.delay_s} s per batch, an artificial delay")
        notes.append(
            f"the input held the steps: data.source {d.source!r} kept rank 0 waiting "
            f"{wait:.3f} s per step ({wait / step:.0%} of its {step:.3f} s step; "
            f"{', '.join(why)}): read it from faster storage or pre-tokenize it "
            "(a Megatron or datatrove dataset is read in place), raise data.prefetch"
        )
    return out, notes


def format_input(time: dict[str, float]) -> str | None:
    """The table's input lines (None when the run logged no wait)."""
    if "measured_data_wait_s" not in time:
        return None
    line = (
        f"{'input':<12} loader wait {time['measured_data_wait_s']:.3f} s/step "
        f"({time['measured_data_wait_share']:.0%} of the step), fed "
        f"{time['measured_rank_tokens_per_s']:,.0f} tokens/s per rank"
    )
    if "required_rank_tokens_per_s" in time:
        need, storage = time["required_node_bytes_per_s"], time["storage_bytes_per_s"]
        line += (
            f"\n{'':<12} the plan needs {time['required_rank_tokens_per_s']:,.0f} tokens/s per "
            f"rank = {need / 1e6:,.3f} MB/s per node from storage ({storage / 1e9:.3g} GB/s)"
        )
    return line
