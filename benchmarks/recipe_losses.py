"""Issue 16's numerics check: the default job's losses before and after the memory recipe.

The memory recipe (fused chunked head + loss, GQA without K/V copies, per-op selective AC,
vocab-parallel embedding) must not change what the trainer learns. The default `scaletrain train`
job runs 200 steps from the tree before the recipe (commit 56e20cf^1, extracted with `git
archive` into a scratch directory unless --before names a tree) and from this tree, each at 1
and 2 intra-op threads (OMP_NUM_THREADS). fp32 noise is measured, not assumed: the spread
between the two thread counts of the same tree (a different reduction order inside the same
kernels). The verdict compares the largest before/after gap at either thread count with the
largest thread spread of either tree, step by step over all 200 losses.

Caveat: "after" is this tree, so every other change since 56e20cf^1 that touches numerics is
in the gap too (e.g. the fused AdamW on CPU: parameters within 2.4e-7 of foreach's after 50
steps).

    python benchmarks/recipe_losses.py [--before TREE] [--steps 200]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import default_job_records, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "56e20cf^1"
THREADS = (1, 2)


def extract_before(dest: Path, commit: str = BEFORE_COMMIT) -> Path:
    """The tree before a change (default: the memory recipe): `git archive COMMIT src`
    unpacked into dest."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "src"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def losses(tree: Path, threads: int, steps: int, run_dir: Path) -> list[float]:
    """The default job's per-step training losses from `tree` at `threads` threads."""
    recs = default_job_records(tree, steps, run_dir, {"OMP_NUM_THREADS": str(threads)})
    return [float(r["loss"]) for r in recs if "loss" in r]


def max_gap(a: list[float], b: list[float]) -> tuple[float, int]:
    """Largest |a - b| over the steps both have, and the (1-based) step where it is."""
    gaps = [abs(x - y) for x, y in zip(a, b)]
    i = max(range(len(gaps)), key=gaps.__getitem__)
    return gaps[i], i + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, default=None, help="tree before the recipe")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        before = args.before or extract_before(tmp / "before")
        trees = {"before": before, "after": ROOT}
        runs: dict[str, dict[int, list[float]]] = {}
        for name, tree in trees.items():
            runs[name] = {}
            for t in THREADS:
                runs[name][t] = losses(tree, t, args.steps, tmp / f"{name}-t{t}")
                print(f"{name} threads={t}: final loss {runs[name][t][-1]:.6f}", flush=True)
    spread = {n: max_gap(runs[n][1], runs[n][2]) for n in runs}
    gap = {t: max_gap(runs["before"][t], runs["after"][t]) for t in THREADS}
    noise = max(s for s, _ in spread.values())
    worst = max(g for g, _ in gap.values())
    data: dict[str, Any] = {
        "steps": args.steps,
        "before_commit": BEFORE_COMMIT,
        "losses": {n: {str(t): v for t, v in r.items()} for n, r in runs.items()},
        "thread_spread": {n: {"max": s, "step": i} for n, (s, i) in spread.items()},
        "recipe_gap": {str(t): {"max": g, "step": i} for t, (g, i) in gap.items()},
        "within_noise": worst <= noise,
    }
    lines = [
        "# The memory recipe's numerics: the default job's losses before and after",
        "",
        f"`scaletrain train` (the embedded default job), {args.steps} steps, from the tree "
        f"before the recipe ({BEFORE_COMMIT}) and this tree, at OMP_NUM_THREADS = 1 and 2. "
        "fp32 noise = the largest per-step loss difference between the two thread counts of "
        "one tree.",
        "",
        "| | max per-step |loss difference| | at step |",
        "|---|---|---|",
    ]
    for n, (s, i) in spread.items():
        lines.append(f"| thread spread, {n} (1 vs 2 threads) | {s:.2e} | {i} |")
    for t, (g, i) in gap.items():
        lines.append(f"| recipe gap, before vs after at {t} thread(s) | {g:.2e} | {i} |")
    final = {n: runs[n][1][-1] for n in runs}
    lines += [
        "",
        f"Final loss at 1 thread: before {final['before']:.6f}, after {final['after']:.6f}.",
        "",
        f"**Verdict: the recipe gap ({worst:.2e}) is "
        + ("within" if worst <= noise else "larger than")
        + f" the thread spread ({noise:.2e}).**",
    ]
    write_results("recipe_losses", data, "\n".join(lines))
    print("\n".join(lines[-1:]))


if __name__ == "__main__":
    main()
