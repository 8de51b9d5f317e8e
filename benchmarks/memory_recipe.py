"""The memory recipe (issue 16) before and after: the dry-run's rank-0 peak on realistic layouts.

"Before" is the source tree of the commit before the recipe (56e20cf^1), "after" this tree.
Each tree's own CLI runs in its own process (`PYTHONPATH=TREE/src python -m scaletrain dryrun
... --json`), so the two never share imports; a layout the old tree refuses is recorded "n/a"
with the CLI's last error line. Beside each row: this tree's `scaletrain plan` for the same
flags (allocated peak and reserved, i.e. with the planner's fragmentation allowance).

Checks from the issue's acceptance, each with its figures:
- the torchtitan layout (llama3-8b, 8 x H100, FSDP / ZeRO-3, seq 8192, micro-batch 2, selective
  AC, bf16): dry-run <= 82.4 GiB allocated (torchtitan docs/performance.md, Table 1: 82.4 GiB max
  reserved per GPU) and planned reserved <= 80 GB;
- loss-backward temporaries <= 1 GB at default chunking, divided by tp: the planner's
  `loss_backward_temp` line of `scaletrain explain` for the issue's 1B Llama with a 131,072
  vocabulary (tp 8 + SP, micro-batch 16, seq 4096), both trees;
- the default CPU job's tokens/s may not drop by more than 5%: `scaletrain train` (the embedded
  default run) from each tree, alternated, OMP_NUM_THREADS=1; tokens/s of the steady steps
  (metrics.jsonl, first step dropped); the median of the after/before ratios of each pair.

    python benchmarks/memory_recipe.py [--before /work/wt-before16] [--jobs 2] [--reps 3]
    python benchmarks/memory_recipe.py --quick     # tiny models, 2 training steps: a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

AFTER = Path(__file__).resolve().parents[1]
BEFORE = Path("/work/wt-before16")
GB, GIB = 1e9, 2.0**30
TORCHTITAN_GIB = 82.4  # torchtitan docs/performance.md (2024-12-26), Table 1: Llama 3.1 8B
TIMEOUT_S = 900

# The 1B Llama of the issue (Llama 3.2 1B's shape with a 131,072 vocabulary), as a config.json.
LLAMA_1B_131K = {
    "model_type": "llama",
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 131072,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


def layout(
    dp: int, zero: int, seq: int, mb: int, *, tp: int = 1, sp: bool = False, ep: int = 1
) -> list[str]:
    """CLI flags of one layout on H100-SXM, one micro-batch per step (global = dp x mb)."""
    flags = [
        "--gpus",
        str(dp * tp),
        "--gpu",
        "h100-sxm",
        "--dp",
        str(dp),
        "--zero",
        str(zero),
        "--seq-len",
        str(seq),
        "--micro-batch",
        str(mb),
        "--global-batch",
        str(dp * mb),
        "--precision",
        "bf16",
    ]
    if tp > 1:
        flags += ["--tp", str(tp)] + (["--sp"] if sp else [])
    if ep > 1:
        flags += ["--ep", str(ep)]
    return flags


def label(flags: list[str]) -> str:
    f = dict(zip(flags[::2], flags[1::2], strict=False))
    out = f"dp{f['--dp']} z{f['--zero']}"
    if "--tp" in flags:
        out += f" tp{flags[flags.index('--tp') + 1]}" + ("+sp" if "--sp" in flags else "")
    if "--ep" in flags:
        out += f" ep{flags[flags.index('--ep') + 1]}"
    return out + f" s{f['--seq-len']} mb{f['--micro-batch']}"


TORCHTITAN = ("llama3-8b", layout(8, 3, 8192, 2), "selective")

FULL: list[tuple[str, list[str], tuple[str, ...]]] = [
    ("gpt2-124m", layout(8, 1, 1024, 16), ("none",)),
    ("gpt2-124m", layout(4, 1, 1024, 16, tp=2, sp=True), ("none",)),
    ("llama2-7b", layout(8, 3, 4096, 2), ("selective",)),
    ("llama2-7b", layout(4, 3, 4096, 2, tp=2, sp=True), ("selective",)),
    ("llama3-8b", layout(8, 3, 8192, 2), ("none", "selective", "full")),
    ("llama3-8b", layout(4, 3, 8192, 2, tp=2, sp=True), ("selective",)),
    ("llama3-70b", layout(8, 3, 4096, 1, tp=8, sp=True), ("selective",)),
    ("llama3-70b", layout(64, 3, 4096, 1), ("full",)),
    ("mixtral-8x7b", layout(8, 3, 4096, 1, ep=8), ("selective",)),
    ("mixtral-8x7b", layout(8, 3, 4096, 1, tp=2, sp=True, ep=8), ("selective",)),
    ("llama-1b-v131k", layout(1, 0, 4096, 16, tp=8, sp=True), ("none",)),
]

QUICK: list[tuple[str, list[str], tuple[str, ...]]] = [
    ("tiny-llama", layout(2, 3, 128, 2), ("none", "selective")),
    ("tiny-llama", layout(1, 0, 128, 2, tp=2, sp=True), ("full",)),
]


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1"}


def _cli(tree: Path, args: list[str], timeout: float = TIMEOUT_S) -> tuple[Any, str]:
    """(parsed JSON stdout, "") or (None, reason): the CLI's last stderr line, or a timeout."""
    try:
        p = subprocess.run(
            [sys.executable, "-m", "scaletrain", *args],
            env=_env(tree),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    if p.returncode < 0:
        return None, f"stopped by signal {-p.returncode}"
    if p.returncode:
        # the CLI's error line, not torch's warnings (which start with "[rank")
        lines = [
            x
            for x in (p.stderr + p.stdout).strip().splitlines()
            if x.strip() and not x.startswith("[rank")
        ]
        return None, (lines[-1].strip() if lines else f"exit {p.returncode}")[:300]
    try:
        return json.loads(p.stdout), ""
    except json.JSONDecodeError:
        return None, "no JSON on stdout"


def _model_flag(model: str, tmp: Path) -> list[str]:
    if model == "llama-1b-v131k":
        path = tmp / "llama-1b-v131k.json"
        path.write_text(json.dumps(LLAMA_1B_131K))
        return ["--model", str(path)]
    return ["--model", model]


def dryrun_peak(tree: Path, flags: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    d, why = _cli(tree, ["dryrun", *flags, "--json"])
    wall = time.perf_counter() - t0
    if d is None:
        return {"peak_gb": None, "reason": why, "wall_s": wall}
    mem = d["memory"]
    return {
        "peak_gb": mem["total"] / GB,
        "activations_gb": mem["activations"] / GB,
        "temp_gb": mem.get("buffer_terms", {}).get("temp", 0) / GB,
        "wall_s": wall,
    }


def planned(tree: Path, flags: list[str]) -> dict[str, Any]:
    d, why = _cli(tree, ["plan", *flags, "--json"], timeout=300)
    if d is None:
        return {"allocated_gb": None, "reserved_gb": None, "reason": why}
    m = d["memory"]
    return {"allocated_gb": m["total"] / GB, "reserved_gb": m["reserved"] / GB, "fits": m["fits"]}


def loss_temp_gb(tree: Path, flags: list[str]) -> tuple[float | None, str]:
    """The planner's `loss_backward_temp` line of `scaletrain explain` (GB), or (None, why)."""
    p = subprocess.run(
        [sys.executable, "-m", "scaletrain", "explain", *flags],
        env=_env(tree),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    for line in p.stdout.splitlines():
        parts = line.split()
        if parts and parts[0] == "loss_backward_temp":
            return float(parts[1]), ""
    lines = [x for x in p.stderr.strip().splitlines() if x.strip()]
    return None, (lines[-1] if lines else "no loss_backward_temp line in explain")[:300]


def row_job(before: Path, model: str, flags: list[str], ac: str, tmp: Path) -> dict[str, Any]:
    full = [*_model_flag(model, tmp), *flags, "--ac", ac]
    b, a = dryrun_peak(before, full), dryrun_peak(AFTER, full)
    pl = planned(AFTER, full)
    saved = (
        None
        if b["peak_gb"] is None or a["peak_gb"] is None
        else 100.0 * (1 - a["peak_gb"] / b["peak_gb"])
    )
    row = {
        "model": model,
        "layout": label(flags),
        "ac": ac,
        "flags": full,
        "before": b,
        "after": a,
        "saved_pct": saved,
        "planned": pl,
    }
    print(
        f"  {model:15s} {label(flags):28s} {ac:9s} before {_gb(b)} after {_gb(a)}"
        f" ({a['wall_s']:.0f} s)",
        flush=True,
    )
    return row


def _gb(r: dict[str, Any], key: str = "peak_gb") -> str:
    v = r.get(key)
    return "n/a" if v is None else f"{v:.2f}" if v >= 1 else f"{v:.4f}"


def tokens_per_s(run_dir: Path) -> float:
    """Steady tokens/s of one run: tokens of steps 2.. over their summed step time."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = recs[1:] or recs
    per_step = recs[0]["tokens_per_s"] * recs[0]["step_s"]
    return len(steady) * per_step / sum(r["step_s"] for r in steady)


def train_once(tree: Path, run_dir: Path, steps: int) -> float:
    args = [
        "train",
        f"--train.steps={steps}",
        f"--train.run_dir={run_dir}",
        "--train.progress=false",
        "--train.sample_tokens=0",
        "--checkpoint.resume=never",
        "--train.eval_every=100000",
    ]
    p = subprocess.run(
        [sys.executable, "-m", "scaletrain", *args],
        env=_env(tree),
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


def _cell(r: dict[str, Any], key: str = "peak_gb") -> str:
    return _gb(r, key) if r.get(key) is not None else f"n/a ({r.get('reason', '?')})"


def markdown(
    rows: list[dict[str, Any]], checks: dict[str, Any], thr: dict[str, Any], quick: bool
) -> str:
    out = [
        "# Memory recipe (issue 16): dry-run peak before and after",
        "",
        "Rank-0 peak allocated (GB = 1e9 B) measured by `scaletrain dryrun` (fake tensors, the",
        "real step) from the tree before the recipe (56e20cf^1) and from this tree; planned:",
        "this tree's `scaletrain plan` for the same flags (allocated / reserved). H100-SXM,",
        "bf16, one micro-batch per step. " + ("QUICK smoke run (tiny models)." if quick else ""),
        "",
        "| model | layout | ac | before GB | after GB | saved % | planned GB (alloc / reserved) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        pl = r["planned"]
        pcell = (
            "n/a (" + pl.get("reason", "?") + ")"
            if pl["allocated_gb"] is None
            else f"{pl['allocated_gb']:.2f} / {pl['reserved_gb']:.2f}"
        )
        saved = "n/a" if r["saved_pct"] is None else f"{r['saved_pct']:.1f}"
        out.append(
            f"| {r['model']} | {r['layout']} | {r['ac']} | {_cell(r['before'])} | "
            f"{_cell(r['after'])} | {saved} | {pcell} |"
        )
    out += ["", "## Checks (acceptance of issue 16)", ""]
    tt = checks.get("torchtitan")
    if tt:
        out.append(
            f"- torchtitan layout (`{' '.join(tt['flags'])}`): dry-run {tt['after_gb']}"
            f" GB = {tt['after_gib']} GiB allocated vs {TORCHTITAN_GIB} GiB published"
            f" -> {'PASS' if tt['dryrun_ok'] else 'FAIL'}; planned reserved"
            f" {tt['planned_reserved_gb']} GB vs 80 GB"
            f" -> {'PASS' if tt['plan_ok'] else 'FAIL'} (before: {tt['before_gb']} GB)."
        )
    lt = checks.get("loss_temp")
    if lt:
        out.append(
            f"- loss-backward temporaries (planner's `loss_backward_temp`, `scaletrain "
            f"explain {' '.join(lt['flags'])}`): before {lt['before_gb']} GB, after "
            f"{lt['after_gb']} GB vs 1 GB -> {'PASS' if lt['ok'] else 'FAIL'}."
        )
    if thr:
        ratios = ", ".join(f"{p['ratio']:.3f}" for p in thr["pairs"])
        out.append(
            f"- default CPU job (`scaletrain train`, embedded default, {thr['steps']} steps,"
            f" OMP_NUM_THREADS=1), {thr['reps']} alternated before/after pairs: median "
            f"before {thr['median_before']:.0f} tok/s, after {thr['median_after']:.0f}"
            f" tok/s; after/before per pair {ratios}; median ratio "
            f"{thr['median_ratio']:.3f} -> "
            f"{'PASS' if thr['median_ratio'] >= 0.95 else 'FAIL'}"
            " (may not drop by more than 5%). Tokens/s: steady steps of metrics.jsonl"
            " (first step dropped). The host is shared (2 cores), dry-runs ran beside."
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, default=BEFORE, help="tree before the recipe")
    ap.add_argument("--jobs", type=int, default=2, help="dry-run rows at once")
    ap.add_argument("--reps", type=int, default=3, help="alternated training pairs")
    ap.add_argument("--steps", type=int, default=60, help="training steps per run")
    ap.add_argument("--quick", action="store_true", help="tiny models, 2 steps, 1 pair")
    ap.add_argument("--no-train", action="store_true", help="skip the tokens/s comparison")
    args = ap.parse_args(argv)
    if not (args.before / "src" / "scaletrain").is_dir():
        print(
            f"--before {args.before}: no src/scaletrain there; give the tree before the "
            "recipe (git worktree add DIR 56e20cf^1)",
            file=sys.stderr,
        )
        return 2
    specs = QUICK if args.quick else FULL
    steps, reps = (3, 1) if args.quick else (args.steps, args.reps)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        jobs = [(m, f, ac) for m, f, acs in specs for ac in acs]
        # the torchtitan layout first, the slowest (70B) next, so a cut-short run keeps them
        jobs.sort(key=lambda j: (j[0] != TORCHTITAN[0], "70b" not in j[0]))
        rows: list[dict[str, Any]] = []
        thr: dict[str, Any] = {}
        checks: dict[str, Any] = {}
        with ThreadPoolExecutor(max(1, args.jobs) + 1) as pool:
            # the training comparison runs beside the dry-runs (alternated, so their load
            # falls on both trees alike)
            tfut = (
                None
                if args.no_train
                else pool.submit(cpu_throughput, args.before, steps, reps, tmp)
            )
            futs = {
                pool.submit(row_job, args.before, m, f, ac, tmp): i
                for i, (m, f, ac) in enumerate(jobs)
            }
            done: dict[int, dict[str, Any]] = {}
            for fut in as_completed([*futs, *([tfut] if tfut else [])]):
                if fut is tfut:
                    thr = fut.result()
                else:
                    done[futs[fut]] = fut.result()
                rows = [done[i] for i in sorted(done)]
                _write(rows, checks, thr, args, time.perf_counter() - t0, partial=True)
        if not args.quick:
            m, f, ac = TORCHTITAN
            tt = next(
                r for r in rows if r["model"] == m and r["layout"] == label(f) and r["ac"] == ac
            )
            a = tt["after"]["peak_gb"]
            checks["torchtitan"] = {
                "flags": tt["flags"],
                "after_gb": round(a, 2) if a else None,
                "after_gib": round(a * GB / GIB, 2) if a else None,
                "before_gb": _gb(tt["before"]),
                "planned_reserved_gb": round(tt["planned"]["reserved_gb"], 2),
                "dryrun_ok": bool(a and a * GB / GIB <= TORCHTITAN_GIB),
                "plan_ok": tt["planned"]["reserved_gb"] <= 80.0,
            }
        lflags = [
            *_model_flag("tiny-llama" if args.quick else "llama-1b-v131k", tmp),
            *layout(1, 0, 128 if args.quick else 4096, 16, tp=8 if not args.quick else 2, sp=True),
        ]
        lb, why_b = loss_temp_gb(args.before, lflags)
        la, why_a = loss_temp_gb(AFTER, lflags)
        shown = ["--model", "llama-1b-v131k.json" if not args.quick else "tiny-llama", *lflags[2:]]
        checks["loss_temp"] = {
            "flags": shown,
            "before_gb": lb if lb is not None else why_b,
            "after_gb": la if la is not None else why_a,
            "ok": la is not None and la <= 1.0,
        }
    print(_write(rows, checks, thr, args, time.perf_counter() - t0, partial=False))
    return 0


def _write(
    rows: list[dict[str, Any]],
    checks: dict[str, Any],
    thr: dict[str, Any],
    args: argparse.Namespace,
    wall: float,
    *,
    partial: bool,
) -> str:
    """Write results (also after every finished row, so a cut-short run keeps what it has)."""
    data = {
        "rows": rows,
        "checks": checks,
        "cpu_throughput": thr,
        "quick": args.quick,
        "partial": partial,
        "meta": {"before_tree": str(args.before), "wall_s": wall, "jobs": args.jobs},
    }
    md = markdown(rows, checks, thr, args.quick)
    md += (
        f"\nWhole benchmark: {wall / 60:.1f} min wall, {args.jobs} dry-runs at a time"
        f" beside the training runs.{' PARTIAL (still running).' if partial else ''}\n"
    )
    write_results("memory_recipe", data, md)
    return md


if __name__ == "__main__":
    sys.exit(main())
