"""`scaletrain dryrun`: one rank's real training step under fake tensors, next to the planner.

Same layout flags and `--section.key=value` overrides as `scaletrain plan` (or a TOML job
file), plus `--rank`. Prints measured memory per category (one binary unit, `config.units`)
beside the planner's prediction for the same layout, with relative errors; `--json` prints
{"plan", "memory", "flops_per_step", "predicted", ...}.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from scaletrain.cli._job import add_job_flags, resolve_from_flags, unplanned
from scaletrain.cli._types import finite_json
from scaletrain.cli._verdict import verdict_line
from scaletrain.config import ConfigError, JobConfig, split_overrides

__all__ = ["add_arguments", "run", "job_from_args"]


def add_arguments(parser: argparse.ArgumentParser, name: str = "dryrun") -> None:
    add_job_flags(parser)  # the same flags and defaults as `scaletrain plan`
    parser.add_argument("--rank", type=int, default=0, help="which rank to simulate")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def job_from_args(
    args: argparse.Namespace, overrides: list[str] | None = None
) -> tuple[JobConfig, int]:
    """The job and world size the flags and overrides describe (over --config)."""
    res = resolve_from_flags(args, overrides)
    return res.job, res.world_size


def _pp_ep(plan: dict[str, Any]) -> str:
    """' pp 4 (1f1b)' / ' ep 8' for the title, when those axes are used."""
    out = ""
    if plan.get("pp", 1) > 1:
        virtual = f" x{plan['pp_virtual']}" if plan.get("pp_virtual", 1) > 1 else ""
        out += f" pp {plan['pp']} ({plan['pp_schedule']}{virtual})"
    if plan.get("ep", 1) > 1:
        out += f" ep {plan['ep']}"
    return out


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    rest, overrides = split_overrides(extra or [])
    if rest:
        raise ConfigError("dryrun", " ".join(rest), "unknown arguments: see --help")
    res = resolve_from_flags(args, overrides)
    job, world = res.job, res.world_size
    ignored = unplanned(res.overrides)  # the dry-run runs them; its planner column does not
    unplanned_note = (
        f"the planner's column does not model {', '.join(ignored)} (the dry-run ran with them)"
        if ignored
        else None
    )
    # torch loads only now: a bad flag or override is refused first, in one line
    from scaletrain.dryrun import dryrun
    from scaletrain.measure.verify import compare, format_table, predict, table_unit

    if sys.stderr.isatty():
        # a large model's fake-tensor step takes minutes on a laptop CPU (llama3-8b: ~30 s on
        # 2 cores): say that work has started, on a terminal only (scripts parse stdout)
        print(
            f"dry-run: tracing rank {args.rank} of {world} under fake tensors "
            f"({job.model.num_layers} layers)...",
            file=sys.stderr,
            flush=True,
        )
    measurement = dryrun(job, world_size=world, rank=args.rank)
    estimate = predict(job, job.layout(world))
    comparison = compare(measurement, estimate)
    if args.json:
        out = measurement.to_json()
        out["predicted"] = estimate.to_json() if estimate is not None else None
        out["comparison"] = comparison.to_json()
        out["derived"] = res.notes()
        if unplanned_note:
            out["unplanned"] = ignored
        print(finite_json(out, "dryrun", args))
        return 0
    plan = measurement.plan
    title = (
        f"dry-run {plan['model']} rank {measurement.rank}/{world}: dp {plan['dp']} zero "
        f"{plan['zero']} tp {plan['tp']} cp {plan['cp']}{_pp_ep(plan)} | seq "
        f"{plan['seq_len']} micro "
        f"{plan['micro_batch']} x {plan['grad_accum']} | {plan['precision']} ac "
        f"{plan['ac']}  ({measurement.wall_s:.1f} s)"
    )
    print(format_table(comparison, title=title))
    unit, size = table_unit(comparison)  # the detail rows in the table's unit
    for k, v in sorted(measurement.memory.buffer_terms.items()):
        if v:
            print(f"  buffers.{k:<22} {v / size:8.3f} {unit}")
    for k, v in sorted(measurement.memory.detail.items()):
        print(f"  {k:<30} {v / size:8.3f} {unit}")
    print(f"FLOPs this rank per step: {measurement.flops:.4g}")
    notes = [*measurement.notes, *res.notes(), *([unplanned_note] if unplanned_note else [])]
    for note in notes:
        print(f"note: {note}")
    print(
        verdict_line(
            measurement.memory.total,
            job.hardware_spec(),
            what=f"rank {measurement.rank} measured peak allocated",
        )
    )
    return 0
