"""`scaletrain bench NAME [args...]`: run benchmarks/NAME.py from the source checkout."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from scaletrain.config import ConfigError

__all__ = ["add_arguments", "run", "benchmark_dir"]


def benchmark_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "benchmarks"


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    names = sorted(p.stem for p in benchmark_dir().glob("*.py") if not p.stem.startswith("_"))
    parser.add_argument("name", help=f"one of: {', '.join(names) or '(none found)'}")


def run(args: argparse.Namespace, extra: list[str]) -> int:
    script = benchmark_dir() / f"{args.name}.py"
    if not script.is_file():
        names = sorted(p.stem for p in benchmark_dir().glob("*.py") if not p.stem.startswith("_"))
        raise ConfigError("bench.name", args.name, f"choose one of {', '.join(names)}")
    sys.argv = [str(script), *extra]
    runpy.run_path(str(script), run_name="__main__")
    return 0
