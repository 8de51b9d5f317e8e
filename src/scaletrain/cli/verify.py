"""`scaletrain verify RUN_DIR`: the planner's prediction against what a run measured."""

from __future__ import annotations

import argparse
import json

from scaletrain.config import ConfigError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser, name: str = "verify") -> None:
    parser.add_argument("run_dir", help="a run directory (config.json + measurement.json)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--calibrate",
        metavar="OUT.toml",
        help="write the planner's efficiency constants this run measured on its device (GEMM "
        "rate per shape class, attention, non-GEMM, optimizer, collectives: split by "
        "RUN/profile/profile.json when `scaletrain profile` wrote one, else one rate for the "
        "step) for `scaletrain plan --calibration OUT.toml`",
    )


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    from scaletrain.measure.verify import format_table, verify_run

    if extra:
        raise ConfigError("verify", " ".join(extra), "unknown arguments: see --help")
    if args.calibrate is not None:
        _check_out(args.calibrate)
    measurement, comparison, _ = verify_run(args.run_dir)
    calibrated = _calibrate(args) if args.calibrate is not None else None
    if args.json:
        print(
            json.dumps(
                {
                    "plan": measurement.plan,
                    "source": measurement.source,
                    "rank": measurement.rank,
                    "world_size": measurement.world_size,
                    **comparison.to_json(),
                    **({"calibration": calibrated} if calibrated is not None else {}),
                },
                indent=1,
            )
        )
        return 0
    title = (
        f"verify {args.run_dir} ({measurement.source}, rank {measurement.rank}/"
        f"{measurement.world_size})"
    )
    print(format_table(comparison, title=title))
    if calibrated is not None:
        print("\n".join(calibrated["lines"]))
    return 0


def _check_out(path: str) -> None:
    """--calibrate OUT.toml: a file name in an existing directory, checked before any work."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise ConfigError("--calibrate", path, "it is a directory: name a file such as cal.toml")
    if not p.resolve().parent.is_dir():
        raise ConfigError(
            "--calibrate", path, f"its directory {p.parent} does not exist: create it first"
        )


def _calibrate(args: argparse.Namespace) -> dict:
    """Write the calibration; its constants and the self-check as lines and as JSON."""
    from scaletrain.measure.calibrate import calibrate_run, write_calibration
    from scaletrain.planner.time.calibration import describe_calibration

    res = calibrate_run(args.run_dir)
    out = write_calibration(res, args.calibrate)
    c = res.calibration
    lines = [
        f"calibration written to {out} ({c.split} split, {c.clock} clock)",
        *describe_calibration(c),
        f"  check: measured step {c.measured_step_s * 1e3:.4g} ms, calibrated plan "
        f"{res.planned_s * 1e3:.4g} ms, default plan {res.default_s * 1e3:.4g} ms",
        *(f"note: {n}" for n in res.notes),
    ]
    return {
        "path": str(out),
        "split": c.split,
        "clock": c.clock,
        "measured_step_s": c.measured_step_s,
        "planned_step_s": res.planned_s,
        "default_step_s": res.default_s,
        "notes": res.notes,
        "lines": lines,
    }
