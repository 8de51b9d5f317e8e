"""`scaletrain report RUN_DIR`: write RUN_DIR/report.html, one self-contained page per run."""

from __future__ import annotations

import argparse

from scaletrain.config import ConfigError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser, name: str = "report") -> None:
    parser.add_argument("run_dir", help="a run directory (the train.run_dir of a run)")
    parser.add_argument(
        "--out", default=None, help="where to write the page (default: RUN_DIR/report.html)"
    )


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    from scaletrain.report import write_report

    if extra:
        raise ConfigError("report", " ".join(extra), "unknown arguments: see --help")
    path = write_report(args.run_dir, out=args.out)
    print(f"report written to {path.resolve()} (open it in a browser; it is self-contained)")
    return 0
