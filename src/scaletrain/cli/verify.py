"""`scaletrain verify RUN_DIR`: the planner's prediction against what a run measured."""

from __future__ import annotations

import argparse
import json

from scaletrain.config import ConfigError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser, name: str = "verify") -> None:
    parser.add_argument("run_dir", help="a run directory (config.json + measurement.json)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    from scaletrain.measure.verify import format_table, verify_run

    if extra:
        raise ConfigError("verify", " ".join(extra), "unknown arguments: see --help")
    measurement, comparison, _ = verify_run(args.run_dir)
    if args.json:
        print(
            json.dumps(
                {
                    "plan": measurement.plan,
                    "source": measurement.source,
                    "rank": measurement.rank,
                    "world_size": measurement.world_size,
                    **comparison.to_json(),
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
    return 0
