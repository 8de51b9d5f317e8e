"""What `scaletrain plan` prints or writes beside its estimates: the textbook memory, the
preflight dry-run of the best layout, the plots and the cost line (`cli.plan` calls these),
and the checks of the flags asking for them, run before any work."""

from __future__ import annotations

import argparse
from typing import Any

from scaletrain.config import ConfigError

__all__ = [
    "check_plot_path",
    "check_textbook_flags",
    "textbook",
    "preflight",
    "plots",
    "cost_line",
]

_PLOT_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def check_plot_path(path: str | None) -> None:
    """--plot FILE: a file name with an image suffix in an existing directory, checked before
    any work (matplotlib would otherwise fail after the plan, or add '.png' to a directory's
    name and write beside it)."""
    if path is None:
        return
    from pathlib import Path

    p = Path(path)
    if p.suffix.lower() not in _PLOT_FORMATS:
        raise ConfigError(
            "--plot",
            path,
            f"name an image file ending in {', '.join(_PLOT_FORMATS)}, e.g. memory.png",
        )
    if p.is_dir():
        raise ConfigError(
            "--plot", path, f"it is a directory: name a file such as {p / 'memory.png'}"
        )
    if not p.resolve().parent.is_dir():
        raise ConfigError(
            "--plot",
            path,
            f"its directory {p.parent} does not exist: create it or name a file in an existing one",
        )


def check_textbook_flags(args: argparse.Namespace) -> None:
    """--convention / --params / --ckpt-every: checked before any work."""
    from scaletrain.planner.napkin.textbook import convention

    if args.convention is None:
        for flag in ("params", "ckpt_every"):
            if getattr(args, flag) is not None:
                raise ConfigError(
                    f"--{flag.replace('_', '-')}",
                    getattr(args, flag),
                    "it sizes the textbook memory: add --convention 12|16|18|20",
                )
        return
    convention(args.convention, args.precision or "bf16")  # unknown: one line
    if args.json:
        raise ConfigError(
            "--convention", args.convention, "the textbook memory is printed as text: drop --json"
        )
    if args.params is not None and args.params <= 0:
        raise ConfigError("--params", args.params, "give a positive count such as 7e9")
    if args.ckpt_every is not None and args.ckpt_every < 1:
        raise ConfigError("--ckpt-every", args.ckpt_every, "use a positive integer")


def textbook(est: Any, args: argparse.Namespace) -> str:
    """--convention: the textbook memory of `est` beside the planner's."""
    from scaletrain.planner.napkin.textbook import textbook_lines

    return "\n".join(
        textbook_lines(est, args.convention, params=args.params, ckpt_every=args.ckpt_every or 1)
    )


def _job_for(est: Any) -> Any:
    """The training job that runs exactly the layout of `est` (for the dry-run)."""
    from scaletrain.config import (
        BatchConfig,
        HardwareConfig,
        JobConfig,
        MemoryConfig,
        ParallelConfig,
        PrecisionConfig,
    )

    p, L = est.plan, est.plan.layout
    return JobConfig(
        model=p.model,
        parallel=ParallelConfig.from_layout(L),
        precision=PrecisionConfig(dtype=p.precision),
        memory=MemoryConfig(ac=p.ac, offload=p.offload),
        batch=BatchConfig(
            global_batch=p.global_batch, micro_batch=p.micro_batch, seq_len=p.seq_len
        ),
        hardware=HardwareConfig(gpu=p.hardware.name, gpus=p.num_gpus),
    )


def preflight(est: Any) -> str:
    """Dry-run `est`'s layout as its worst rank and put the measurement beside the prediction."""
    from scaletrain.dryrun import dryrun
    from scaletrain.measure.verify import compare, format_table

    try:
        measured = dryrun(_job_for(est), world_size=est.plan.num_gpus, rank=est.memory.rank)
    except ConfigError as e:  # a layout the dry-run cannot drive yet (PP, EP, offload)
        return f"preflight: not run ({e})"
    verdict = "fits" if measured.memory.total <= est.plan.hardware.memory_bytes else "DOES NOT FIT"
    return (
        f"preflight dry-run of the best layout (rank {est.memory.rank}): {verdict}\n"
        + format_table(compare(measured, est))
    )


def plots(estimates: list[Any], path: str) -> list[str]:
    """The memory bars at `path`; when the best layout pipelines (pp > 1), also its simulated
    schedule as a Gantt chart at FILE_pipeline.png beside it."""
    from pathlib import Path

    from scaletrain.planner.output.plot import plot_memory, plot_pipeline

    out = [str(plot_memory(estimates, path))]
    best = estimates[0]
    L = best.plan.layout
    if L.pp > 1:
        from scaletrain.planner.time.pipeline import simulate

        t = best.time
        # one micro-batch's forward/backward on the slowest rank, from the estimate's compute
        m = max(1, best.plan.grad_accum)
        per_mb = t.compute_s / m
        # a readable chart (and a quick simulation): at most 4 rounds of pp micro-batches; a
        # multiple of pp keeps every schedule's order legal
        shown = m if m <= 4 * L.pp else 4 * L.pp
        timeline = simulate(L.pp_schedule, L.pp, shown, L.pp_virtual, per_mb / 3, 2 * per_mb / 3)
        p = Path(path)
        out.append(str(plot_pipeline(timeline, p.with_name(f"{p.stem}_pipeline{p.suffix}"))))
        note = "" if shown == m else f" (first {shown} of {m} micro-batches)"
        print(f"wrote {out[0]} and {out[1]}{note}")
    else:
        print(f"wrote {out[0]}")
    return out


def cost_line(est: Any, tokens: float, energy: dict[str, float]) -> str:
    """--tokens: days, GPU-hours, dollars, energy and CO2 of training `est` on `tokens`."""
    from scaletrain.planner.time.cost import training_cost

    c = training_cost(est, tokens, **energy)
    return (
        f"{tokens:.3g} tokens: {c.seconds / 86400:.1f} days, {c.gpu_hours:,.0f} GPU-hours, "
        f"${c.usd:,.0f}, {c.kwh:,.0f} kWh, {_tonnes(c.kg_co2)} t CO2"
    )


def _tonnes(kg: float) -> str:
    t = kg / 1000
    return f"{t:,.1f}" if t >= 10 else f"{t:.3g}"
