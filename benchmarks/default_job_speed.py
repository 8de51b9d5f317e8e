"""Issue 24's second check: the default `scaletrain train` job's tokens/s before and after.

"Before" is the tree when issue 24 was filed (f675546^1, the last commit of 2026-11-24,
extracted with `git archive` into a scratch directory unless --before names a tree); "after"
is this tree. Each runs the embedded default job (`_common.default_job_args`: no evaluation,
sample or resume) as its own `python -m scaletrain train` process, alternating before/after
for --pairs pairs so that drift in host load hits both; the figure per run is the median of
the per-step `tokens_per_s` the trainer logs after the first tenth of the steps (warm-up),
and the result the median of the per-pair after/before ratios. Threads: inherited (torch's
default), as a user runs it.

Caveat: "before" also lacks what other issues changed since (the memory recipe, the one-step
restructuring); the ratio is the whole tree's, not #24's alone.

    python benchmarks/default_job_speed.py [--pairs 3] [--steps 200] [--before TREE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import default_job_records, write_results  # noqa: E402
from recipe_losses import extract_before  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "f675546^1"


def tokens_per_s(tree: Path, steps: int, run_dir: Path) -> float:
    """Median steady-state tokens/s of the default job run from `tree`."""
    recs = default_job_records(tree, steps, run_dir)
    rates = [float(r["tokens_per_s"]) for r in recs if "tokens_per_s" in r]
    return statistics.median(rates[len(rates) // 10 :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--before", type=Path, help=f"tree before (default: {BEFORE_COMMIT})")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="default_job_speed-") as tmp_s:
        tmp = Path(tmp_s)
        before = args.before or extract_before(tmp / "before", BEFORE_COMMIT)
        trees = {"before": before, "after": ROOT}
        pairs = []
        for i in range(args.pairs):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            pair = {who: tokens_per_s(trees[who], args.steps, tmp / f"{who}-{i}") for who in order}
            pair["ratio"] = pair["after"] / pair["before"]
            print(f"pair {i + 1}: {pair}", flush=True)
            pairs.append(pair)
    med = statistics.median(p["ratio"] for p in pairs)
    rows = "\n".join(
        f"| {i + 1} | {p['before']:,.0f} | {p['after']:,.0f} | {p['ratio']:.3f}x |"
        for i, p in enumerate(pairs)
    )
    md = (
        f"The default `scaletrain train` job, {args.steps} steps per run, tokens/s (median of "
        f"the logged per-step rates after the first tenth), before = "
        f"{'--before ' + str(args.before) if args.before else BEFORE_COMMIT} (issue 24 filed), "
        "after = this tree, alternating.\n\n"
        "| pair | before tokens/s | after tokens/s | after / before |\n|---|---|---|---|\n"
        f"{rows}\n\n**Median after / before: {med:.3f}x**"
    )
    write_results(
        "default_job_speed",
        {
            "steps": args.steps,
            "before": str(args.before or BEFORE_COMMIT),
            "pairs": pairs,
            "median_ratio": med,
        },
        md,
    )
    print(md)


if __name__ == "__main__":
    main()
