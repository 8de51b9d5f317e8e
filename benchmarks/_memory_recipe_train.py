"""The default CPU job's tokens/s from two trees, alternated (benchmarks/memory_recipe.py)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import default_job_args

AFTER = Path(__file__).resolve().parents[1]


def tree_env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1"}


def tokens_per_s(run_dir: Path) -> float:
    """Steady tokens/s of one run: tokens of steps 2.. over their summed step time."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = recs[1:] or recs
    per_step = recs[0]["tokens_per_s"] * recs[0]["step_s"]
    return len(steady) * per_step / sum(r["step_s"] for r in steady)


def train_once(tree: Path, run_dir: Path, steps: int) -> float:
    args = default_job_args(steps, run_dir)
    p = subprocess.run(
        [sys.executable, "-m", "scaletrain", *args],
        env=tree_env(tree),
        capture_output=True,
        text=True,
        check=False,
        cwd=run_dir.parent,
    )
    if p.returncode:
        raise RuntimeError(f"train in {tree} failed: {p.stderr[-1500:]}")
    return tokens_per_s(run_dir)


def cpu_throughput(before: Path, steps: int, reps: int, tmp: Path) -> dict[str, Any]:
    """Alternate before/after (pair i: before then after for even i, after then before for
    odd i, so neither always goes first); the ratio of each pair, then their median."""
    pairs: list[dict[str, Any]] = []
    for i in range(reps):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        got: dict[str, float] = {}
        for which in order:
            tree = before if which == "before" else AFTER
            got[which] = train_once(tree, tmp / f"train-{which}-{i}", steps)
        pairs.append(
            {
                "before": got["before"],
                "after": got["after"],
                "order": order,
                "ratio": got["after"] / got["before"],
            }
        )
        print(f"  pair {i}: before {got['before']:.0f} after {got['after']:.0f} tok/s", flush=True)
    return {
        "steps": steps,
        "reps": reps,
        "pairs": pairs,
        "median_before": statistics.median(p["before"] for p in pairs),
        "median_after": statistics.median(p["after"] for p in pairs),
        "median_ratio": statistics.median(p["ratio"] for p in pairs),
    }
