"""The memory recipe (issue 16) before and after: the dry-run's rank-0 peak on realistic layouts.

"Before" is the tree of the commit before the recipe, "after" this tree; each tree's CLI runs
in its own process (`PYTHONPATH=TREE/src python -m scaletrain dryrun ... --json`), so the two
never share imports; a layout the old tree refuses is recorded "n/a" with the CLI's error line.
Beside each row: this tree's `scaletrain plan` for the same flags (allocated peak and reserved).

Checks from the issue's acceptance, each with its figures:
- the torchtitan layout (llama3-8b, 8 x H100, FSDP / ZeRO-3, seq 8192, micro-batch 2, selective
  AC, bf16): dry-run <= 82.4 GiB allocated (torchtitan docs/performance.md, Table 1: 82.4 GiB max
  reserved per GPU) and planned reserved <= 80 GB;
- loss-backward temporaries <= 1 GB at default chunking, divided by tp: the planner's
  `loss_backward_temp` line of `scaletrain explain`, both trees, for the issue's 1B Llama with
  a 131,072 vocabulary (tp 8 + SP, micro-batch 16, seq 4096); this tree, llama3-8b widths with
  a 256,000 vocabulary at tp1 and tp8 (seq 8192, micro-batch 2, ZeRO-3), `head_grad` beside;
- the default CPU job's tokens/s may not drop by more than 5%: `scaletrain train` (the embedded
  default run) from each tree, alternated, OMP_NUM_THREADS=1; tokens/s of the steady steps
  (metrics.jsonl, first step dropped); the median of the after/before ratios of each pair.

"Before" is `git archive 56e20cf^1 src` in a scratch directory (recipe_losses.py's) unless
--before names a tree. --only re-measures the rows whose "model layout ac" contains one of its
strings, merged into the existing results (each row says when and at which commit it ran).

    python benchmarks/memory_recipe.py [--before TREE] [--jobs 2] [--reps 3]
    python benchmarks/memory_recipe.py --only llama3-70b --no-train   # re-measure some rows
    python benchmarks/memory_recipe.py --quick     # one tiny row, 3 training steps: a smoke test
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_revision, write_results  # noqa: E402
from _memory_recipe_md import TORCHTITAN_GIB, gb, key, markdown, merge, previous  # noqa: E402
from _memory_recipe_train import cpu_throughput, tree_env  # noqa: E402
from recipe_losses import BEFORE_COMMIT, extract_before  # noqa: E402

AFTER = Path(__file__).resolve().parents[1]
GB, GIB = 1e9, 2.0**30
TIMEOUT_S = 2400  # one dry-run; llama3-70b dp64 (80 blocks) was cut at 900 s on the loaded host
TORCH_LOG = re.compile(r"^(\[rank\d+\]:)?[WIE]\d{4} |Warning: |^\s*warnings\.warn\(")

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
    ("tiny-llama", layout(2, 3, 128, 2), ("selective",)),
]


def _cli(tree: Path, args: list[str], timeout: float = TIMEOUT_S) -> tuple[Any, str]:
    """(parsed JSON stdout, "") or (None, reason): the CLI's last stderr line, or a timeout."""
    try:
        p = subprocess.run(
            [sys.executable, "-m", "scaletrain", *args],
            env=tree_env(tree),
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
        return None, error_line(p.stderr + p.stdout, p.returncode)
    try:
        return json.loads(p.stdout), ""  # stderr may hold warnings: the result is stdout's
    except json.JSONDecodeError:
        return None, "no JSON on stdout"


def error_line(output: str, returncode: int) -> str:
    """The CLI's error line: the last line that is not a torch log or warning line
    ("[rank0]:W1125 15:49:54.643000 ... _redistribute.py:390] While redistributing ...")."""
    lines = [x for x in output.splitlines() if x.strip() and not TORCH_LOG.search(x)]
    return (lines[-1].strip() if lines else f"exit {returncode}")[:300]


def _model_flag(model: str, tmp: Path) -> list[str]:
    if model == "llama-1b-v131k":
        path = tmp / "llama-1b-v131k.json"
        path.write_text(json.dumps(LLAMA_1B_131K))
        return ["--model", str(path)]
    return ["--model", model]


def dryrun_peak(tree: Path, flags: list[str], timeout: float = TIMEOUT_S) -> dict[str, Any]:
    t0 = time.perf_counter()
    d, why = _cli(tree, ["dryrun", *flags, "--json"], timeout)
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


def explain_terms(tree: Path, flags: list[str], names: tuple[str, ...]) -> dict[str, Any]:
    """The named buffer lines of `scaletrain explain` (GB); a missing one is None, with the
    reason under "reason"."""
    p = subprocess.run(
        [sys.executable, "-m", "scaletrain", "explain", *flags],
        env=tree_env(tree),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out: dict[str, Any] = dict.fromkeys(names)
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) > 1 and parts[0] in out:
            out[parts[0]] = float(parts[1])
    if any(v is None for v in out.values()):
        out["reason"] = error_line(p.stderr, p.returncode) if p.returncode else "no such line"
    return out


def loss_temp_gb(tree: Path, flags: list[str]) -> tuple[float | None, str]:
    """The planner's `loss_backward_temp` line of `scaletrain explain` (GB), or (None, why)."""
    t = explain_terms(tree, flags, ("loss_backward_temp",))
    return t["loss_backward_temp"], t.get("reason", "")


def row_job(
    before: Path, model: str, flags: list[str], ac: str, tmp: Path, timeout: float = TIMEOUT_S
) -> dict[str, Any]:
    full = [*_model_flag(model, tmp), *flags, "--ac", ac]
    b, a = dryrun_peak(before, full, timeout), dryrun_peak(AFTER, full, timeout)
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
        "measured": {"git": _revision(), "date": _now()},
    }
    print(
        f"  {model:15s} {label(flags):28s} {ac:9s} before {gb(b)} after {gb(a)}"
        f" ({a['wall_s']:.0f} s)",
        flush=True,
    )
    return row


# llama3-8b's shape with a 256,000-token vocabulary (issue #16's loss-temporaries acceptance)
LLAMA3_8B_256K = {
    **LLAMA_1B_131K,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "intermediate_size": 14336,
    "vocab_size": 256000,
}


@functools.cache
def _revision() -> str:
    """This tree's commit, read once before any results are written (which dirty it)."""
    return git_revision()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="tree before the recipe (default: git archive)")
    ap.add_argument("--jobs", type=int, default=2, help="dry-run rows at once")
    ap.add_argument("--reps", type=int, default=3, help="alternated training pairs")
    ap.add_argument("--steps", type=int, default=60, help="training steps per run")
    ap.add_argument("--quick", action="store_true", help="one tiny row, 3 steps, 1 pair")
    ap.add_argument("--no-train", action="store_true", help="skip the tokens/s comparison")
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        help="re-measure the rows whose 'model layout ac' contains this (repeatable); "
        "merged into the existing results",
    )
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per dry-run")
    return ap.parse_args(argv)


def _measure(args, before: Path, jobs, steps: int, reps: int, tmp: Path, write) -> tuple:
    """(rows, CPU throughput); `write(rows, thr)` after each: a cut-short run keeps them."""
    rows: list[dict[str, Any]] = []
    thr: dict[str, Any] = {}
    with ThreadPoolExecutor(max(1, args.jobs) + 1) as pool:
        # the training comparison runs beside the dry-runs (alternated, so their load falls
        # on both trees alike)
        tfut = None if args.no_train else pool.submit(cpu_throughput, before, steps, reps, tmp)
        futs = {
            pool.submit(row_job, before, m, f, ac, tmp, args.timeout): i
            for i, (m, f, ac) in enumerate(jobs)
        }
        done: dict[int, dict[str, Any]] = {}
        for fut in as_completed([*futs, *([tfut] if tfut else [])]):
            if fut is tfut:
                thr = fut.result()
            else:
                done[futs[fut]] = fut.result()
            rows = [done[i] for i in sorted(done)]
            write(rows, thr)
    return rows, thr


def _checks(args, before: Path, rows: list[dict[str, Any]], tmp: Path) -> dict[str, Any]:
    """The acceptance checks this run can give: torchtitan's (when its row ran), the loss
    temporaries (both trees; and the 256k vocabulary at tp1 and tp8, this tree)."""
    checks: dict[str, Any] = {}
    m, f, ac = TORCHTITAN
    tt = next((r for r in rows if key(r) == (m, label(f), ac)), None)
    if tt is not None and not args.quick:
        a = tt["after"]["peak_gb"]
        checks["torchtitan"] = {
            "flags": tt["flags"],
            "after_gb": round(a, 2) if a else None,
            "after_gib": round(a * GB / GIB, 2) if a else None,
            "before_gb": gb(tt["before"]),
            "planned_reserved_gb": round(tt["planned"]["reserved_gb"], 2),
            "dryrun_ok": bool(a and a * GB / GIB <= TORCHTITAN_GIB),
            "plan_ok": tt["planned"]["reserved_gb"] <= 80.0,
        }
    lflags = [
        *_model_flag("tiny-llama" if args.quick else "llama-1b-v131k", tmp),
        *layout(1, 0, 128 if args.quick else 4096, 16, tp=8 if not args.quick else 2, sp=True),
    ]
    lb, why_b = loss_temp_gb(before, lflags)
    la, why_a = loss_temp_gb(AFTER, lflags)
    shown = ["--model", "llama-1b-v131k.json" if not args.quick else "tiny-llama", *lflags[2:]]
    checks["loss_temp"] = {
        "flags": shown,
        "before_gb": lb if lb is not None else why_b,
        "after_gb": la if la is not None else why_a,
        "ok": la is not None and la <= 1.0,
    }
    if not args.quick:
        path = tmp / "llama3-8b-v256k.json"
        path.write_text(json.dumps(LLAMA3_8B_256K))
        checks["loss_temp_256k"] = []
        for tp in (1, 8):
            flags = layout(8 // tp, 3, 8192, 2, tp=tp, sp=tp > 1) + ["--ac", "selective"]
            t = explain_terms(
                AFTER, ["--model", str(path), *flags], ("loss_backward_temp", "head_grad")
            )
            lt = t["loss_backward_temp"]
            checks["loss_temp_256k"].append(
                {
                    "flags": ["--model", "llama3-8b-v256k.json", *flags],
                    **t,
                    "ok": lt is not None and lt <= 1.0,
                }
            )
    return checks


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    specs = QUICK if args.quick else FULL
    jobs = [(m, f, ac) for m, f, acs in specs for ac in acs]
    if args.only:
        jobs = [j for j in jobs if any(o in f"{j[0]} {label(j[1])} {j[2]}" for o in args.only)]
        if not jobs:
            print(f"--only {args.only}: no row matches; see FULL", file=sys.stderr)
            return 2
    # the torchtitan layout first, the slowest (70B) next, so a cut-short run keeps them
    jobs.sort(key=lambda j: (j[0] != TORCHTITAN[0], "70b" not in j[0]))
    steps, reps = (3, 1) if args.quick else (args.steps, args.reps)
    _revision()
    old = previous() if args.only else {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        before = args.before
        if before is None:
            try:
                before = extract_before(tmp / "before")
            except subprocess.CalledProcessError:
                print(
                    f"git archive {BEFORE_COMMIT} failed (a shallow clone?): give --before TREE",
                    file=sys.stderr,
                )
                return 2
        if not (before / "src" / "scaletrain").is_dir():
            print(f"--before {before}: no src/scaletrain there", file=sys.stderr)
            return 2

        def write(rows, thr, checks=None, partial=True):  # noqa: ANN001, ANN202
            all_rows = merge(old.get("rows", []), rows)
            thr = thr or old.get("cpu_throughput", {})
            checks = {**old.get("checks", {}), **(checks or {})}
            wall = time.perf_counter() - t0
            return _write(all_rows, checks, thr, args, before, wall, partial=partial)

        rows, thr = _measure(args, before, jobs, steps, reps, tmp, write)
        checks = _checks(args, before, rows, tmp)
    print(write(rows, thr, checks, partial=False))
    return 0


def _write(
    rows: list[dict[str, Any]],
    checks: dict[str, Any],
    thr: dict[str, Any],
    args: argparse.Namespace,
    before: Path,
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
        "meta": {"before_tree": str(before), "wall_s": wall, "jobs": args.jobs, "only": args.only},
    }
    md = markdown(rows, checks, thr, args.quick)
    what = f"rows matching {args.only}" if args.only else "benchmark"
    md += (
        f"\nThis run ({what}): {wall / 60:.1f} min wall, {args.jobs} dry-runs at a time"
        f"{' beside the training runs' if not args.no_train else ''}."
        f"{' PARTIAL (still running).' if partial else ''}\n"
    )
    write_results("memory_recipe", data, md)
    return md


if __name__ == "__main__":
    sys.exit(main())
