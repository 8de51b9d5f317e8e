"""`scaletrain status RUN_DIR`: where a (possibly running) run is, from its directory alone."""

from __future__ import annotations

import argparse
import json

from scaletrain.config import ConfigError

__all__ = ["add_arguments", "run"]

UNHEALTHY = ("hung", "crashed", "stalled")


def add_arguments(parser: argparse.ArgumentParser, name: str = "status") -> None:
    parser.add_argument("run_dir", help="a run directory (train.run_dir), local or shared")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.epilog = (
        "Exit status 1 when the run is hung, crashed or stalled (for scripts and "
        "cron checks), 0 otherwise."
    )


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    from scaletrain.report.status import format_status, run_status

    if extra:
        raise ConfigError("status", " ".join(extra), "unknown arguments: see --help")
    s = run_status(args.run_dir)
    if args.json:
        print(json.dumps({**vars(s), "run_dir": str(s.run_dir)}, indent=1))
    else:
        print(format_status(s))
    return 1 if s.state in UNHEALTHY else 0
