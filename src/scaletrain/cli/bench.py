"""`scaletrain bench NAME [--out DIR] [args...]`: run benchmarks/NAME.py from the source checkout.

The script runs as its own Python process (as `python benchmarks/NAME.py` would, so its
`_common` helpers import from any working directory) and writes its results files into `--out`
(default: a fresh runs/bench-NAME-N under the current directory), never over the committed
benchmarks/results/ — run the script directly to refresh those.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from scaletrain.config import ConfigError

__all__ = ["add_arguments", "run", "benchmark_dir", "fresh_out_dir"]

OUT_ENV = "SCALETRAIN_BENCH_OUT"  # read by benchmarks/_common.py


def benchmark_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "benchmarks"


def _names() -> list[str]:
    return sorted(p.stem for p in benchmark_dir().glob("*.py") if not p.stem.startswith("_"))


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("name", help=f"one of: {', '.join(_names()) or '(none found)'}")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="where the results files go (default: a fresh runs/bench-NAME-N)",
    )
    parser.epilog = "Arguments after NAME (other than --out) are passed to the script."


def fresh_out_dir(name: str, root: Path) -> Path:
    """root/runs/bench-NAME-N for the first N not taken."""
    n = 1
    while (root / "runs" / f"bench-{name}-{n}").exists():
        n += 1
    return root / "runs" / f"bench-{name}-{n}"


def run(args: argparse.Namespace, extra: list[str]) -> int:
    script = benchmark_dir() / f"{args.name}.py"
    if not script.is_file():
        raise ConfigError("bench.name", args.name, f"choose one of {', '.join(_names())}")
    out = Path(args.out) if args.out else fresh_out_dir(args.name, Path.cwd())
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, OUT_ENV: str(out.resolve())}
    src = str(Path(__file__).resolve().parents[2])  # this scaletrain, not another install
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    rc = subprocess.run([sys.executable, str(script), *extra], env=env, check=False).returncode
    print(
        f"bench {args.name}: results in {out}"
        if rc == 0
        else f"bench {args.name}: exit status {rc}",
        file=sys.stderr if rc else sys.stdout,
    )
    return rc
