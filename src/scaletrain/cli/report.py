"""`scaletrain report RUN_DIR`: write RUN_DIR/report.html, one self-contained page per run."""

from __future__ import annotations

import argparse
import sys

from scaletrain.config import ConfigError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser, name: str = "report") -> None:
    parser.add_argument(
        "run_dir",
        help="a run directory (the train.run_dir of a run); exit 1 with a warning line when a "
        "file in it is damaged and the report was written without it",
    )
    parser.add_argument(
        "--out", default=None, help="where to write the page (default: RUN_DIR/report.html)"
    )


def run(args: argparse.Namespace, extra: list[str] | None = None) -> int:
    from scaletrain.report import load_run, write_report

    if extra:
        raise ConfigError("report", " ".join(extra), "unknown arguments: see --help")
    if args.out is not None:
        from scaletrain.config.user_files import check_output_file

        check_output_file(args.out, "--out")
    run = load_run(args.run_dir)
    path = write_report(run, out=args.out)
    print(f"report written to {path.resolve()} (open it in a browser; it is self-contained)")
    if run.damaged:  # written without those files' contents: say so, and exit 1 (as status)
        print(
            f"scaletrain report: warning: incomplete report, {run.damage_line()} "
            "(restore the file and run report again)",
            file=sys.stderr,
        )
        return 1
    return 0
