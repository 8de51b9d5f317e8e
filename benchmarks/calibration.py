"""Calibrate the planner on one layout of the default job, predict other layouts' tokens/s.

Each round, on this CPU, with the commands a user types (`python -m scaletrain ...`):
1. `scaletrain train` of the embedded default job (gpt-mini, global batch 16 x 128 tokens, fp32),
   1 process x 1 thread: layout A; and of each target layout;
2. `scaletrain verify A --calibrate` before any profile: the one-rate calibration ('step');
3. `scaletrain profile` of the same job (into A/profile), then `verify --calibrate` again: the
   split calibration ('profile': GEMM rate per shape class, attention, non-GEMM, optimizer);
4. the same profile + calibration of layout D (2 processes), whose rates include what two ranks
   share on one host ('profile_2rank');
5. for each layout, `scaletrain plan ... --calibration` with each calibration (and the default
   planner) against its measured tokens/s.
Targets: B = sequences of 64 tokens, global batch 32 (the same tokens per step, half the
attention per token); C = micro-batch 8 x 2 accumulation steps; D = 2 gloo processes x 1
thread (`--nproc 2`, data parallel, micro-batch 8 each); E = 2 processes, sequences of 64,
global batch 32 (micro-batch 8 x 2 accumulation each: half D's GEMM rows). A one-rank layout is
judged by A's profile calibration, a two-rank one by D's (the plan names a calibration of
another count of ranks per host: `calibration.host_sharing_note`).

Tokens/s is measured on the step's process CPU clock (`step_cpu_s` in metrics.jsonl, rank 0;
the first step excluded, a ratio of sums as measure/throughput.py does), which is also the clock
the calibration reads for a one-thread CPU rank: this host's 2 cores are shared with other jobs
(load average in the results), and the wall clock then measures the queue as much as the run.
The wall-clock figures are recorded beside them.

    python benchmarks/calibration.py [--rounds 2] [--steps 20] [--no-dp]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

TARGET = 0.10
"""The issue's bound on |predicted / measured - 1|."""
RUN = [
    "--train.tensorboard=false",
    "--train.progress=false",
    "--train.sample_tokens=0",
    "--train.eval_every=100000",
    "--checkpoint.every=0",
]
LAYOUTS: dict[str, dict[str, Any]] = {
    "A (calibrated): 1 process, micro-batch 16, seq 128": {"train": [], "plan": ["--dp", "1"]},
    "B: seq 64, global batch 32": {
        "train": ["--batch.seq_len=64", "--batch.global_batch=32"],
        "plan": ["--dp", "1", "--seq-len", "64", "--global-batch", "32"],
    },
    "C: micro-batch 8 x 2 accumulation": {
        "train": ["--batch.micro_batch=8"],
        "plan": ["--dp", "1", "--micro-batch", "8"],
    },
    "D: 2 processes (DDP), micro-batch 8": {
        "train": ["--batch.micro_batch=8"],
        "nproc": 2,
        "plan": ["--gpus", "2", "--dp", "2", "--micro-batch", "8"],
    },
    "E: 2 processes, seq 64, global batch 32": {
        "train": ["--batch.seq_len=64", "--batch.global_batch=32", "--batch.micro_batch=8"],
        "nproc": 2,
        "plan": [
            *("--gpus", "2", "--dp", "2", "--seq-len", "64", "--global-batch", "32"),
            *("--micro-batch", "8"),
        ],
    },
}
JUDGED_BY = {1: "profile", 2: "profile_2rank"}
"""The calibration that judges a layout, by its ranks per host."""


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def scaletrain(*args: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "scaletrain", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scaletrain {' '.join(args)}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def measured(run_dir: Path) -> dict[str, float]:
    """Tokens/s of a run on the CPU clock and on the wall clock (rank 0's metrics.jsonl)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    tokens = sum(r["tokens_per_s"] * r["step_s"] for r in rows)
    return {
        "cpu_tokens_per_s": tokens / sum(r["step_cpu_s"] for r in rows),
        "wall_tokens_per_s": tokens / sum(r["step_s"] for r in rows),
        "steps": len(rows),
    }


def predicted(plan: list[str], calibration: Path | None, cwd: Path) -> float:
    extra = ["--calibration", str(calibration)] if calibration is not None else []
    out = json.loads(scaletrain("plan", *plan, *extra, "--json", cwd=cwd))
    return float((out[0] if isinstance(out, list) else out)["tokens_per_s"])


def error(pred: float, meas: float) -> float:
    """Relative error of a prediction: predicted / measured - 1."""
    return pred / meas - 1.0


def _nproc(spec: dict[str, Any]) -> list[str]:
    return ["--nproc", str(spec["nproc"])] if spec.get("nproc") else []


def _calibrate(run_dir: Path, args: list[str], out: Path, work: Path, nproc: list[str]) -> None:
    """`scaletrain profile` of a trained run's job into RUN/profile, then `verify --calibrate`."""
    scaletrain("profile", *args, f"--train.run_dir={run_dir}", "--steps", "3", *nproc, cwd=work)
    scaletrain("verify", str(run_dir), "--calibrate", str(out), cwd=work)


def one_round(k: int, steps: int, work: Path, layouts: dict[str, dict[str, Any]]) -> list[dict]:
    base = work / f"r{k}"
    train_args = [f"--train.steps={steps}", *RUN]
    dirs = {name: base / name[0] for name in layouts}
    for name, spec in layouts.items():
        scaletrain(
            "train",
            *train_args,
            *spec["train"],
            f"--train.run_dir={dirs[name]}",
            *_nproc(spec),
            cwd=work,
        )
    a_name = next(iter(layouts))
    cals = {"step": base / "cal_step.toml", "profile": base / "cal_profile.toml"}
    scaletrain("verify", str(dirs[a_name]), "--calibrate", str(cals["step"]), cwd=work)
    _calibrate(dirs[a_name], train_args, cals["profile"], work, [])
    two = next((n for n, s in layouts.items() if s.get("nproc") == 2), None)
    if two is not None:  # the first two-rank layout (D) calibrates the two-rank predictions
        cals["profile_2rank"] = base / "cal_profile_2rank.toml"
        spec = layouts[two]
        _calibrate(
            dirs[two], [*train_args, *spec["train"]], cals["profile_2rank"], work, ["--nproc", "2"]
        )
    rows = []
    for name, spec in layouts.items():
        pred = {c: predicted(spec["plan"], p, work) for c, p in cals.items()}
        pred["default"] = predicted(spec["plan"], None, work)
        m = measured(dirs[name])
        rows.append(
            {
                "round": k,
                "layout": name,
                "ranks": spec.get("nproc", 1),
                "loadavg": [round(x, 2) for x in os.getloadavg()],
                **m,
                "predicted": pred,
                "error_cpu": {c: error(v, m["cpu_tokens_per_s"]) for c, v in pred.items()},
                "error_wall": {c: error(v, m["wall_tokens_per_s"]) for c, v in pred.items()},
            }
        )
        print(
            f"round {k} {name}: measured {m['cpu_tokens_per_s']:,.0f} tokens/s (CPU clock), "
            + ", ".join(f"{c} {rows[-1]['error_cpu'][c]:+.1%}" for c in pred),
            flush=True,
        )
    return rows


def summary(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per target layout and calibration: the median relative error over the rounds (CPU
    clock) and whether its magnitude is within TARGET."""
    out: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(r["layout"] for r in rows):
        mine = [r for r in rows if r["layout"] == name]
        out[name] = {
            c: statistics.median(r["error_cpu"][c] for r in mine) for c in mine[0]["error_cpu"]
        }
    return out


def _verdict(name: str, ranks: int, e: dict[str, float]) -> str:
    judge = JUDGED_BY.get(ranks)
    if judge is None or judge not in e:
        return "not judged"
    if name.startswith("A") or (judge == "profile_2rank" and name.startswith("D")):
        return "calibrated on it"
    return "yes" if abs(e[judge]) <= TARGET else "**no**"


def markdown(rows: list[dict], summ: dict[str, dict[str, float]], meta: dict[str, Any]) -> str:
    ranks = {r["layout"]: r.get("ranks", 1) for r in rows}
    two = any(v == 2 for v in ranks.values())

    def cell(e: dict[str, float], key: str) -> str:
        return f"{e[key]:+.1%}" if key in e else "-"

    lines = [
        "# Calibration from one run: predict another layout's tokens/s on this CPU",
        "",
        f"The default job ({meta['model']}, fp32) trained {meta['steps']} steps per layout, "
        f"{meta['rounds']} rounds; each round calibrates on layout A (`scaletrain verify A "
        "--calibrate`, with and without `scaletrain profile`'s split)"
        + (" and on layout D (2 processes, profiled)" if two else "")
        + " and predicts the others with `scaletrain plan --calibration`. Measured tokens/s "
        "on the step's CPU clock (rank 0; a one-thread rank's CPU seconds are its device "
        "time), wall clock beside: the host's 2 cores were shared with other jobs (load "
        "average per row). Error = predicted / measured - 1; target |error| <= "
        f"{TARGET:.0%} for the calibrated predictions: a one-rank layout by A's profile "
        "calibration, a two-rank layout by D's.",
        "",
        "| layout | ranks per host | median error: A's profile calibration | A's one rate | "
        "D's profile calibration (2 ranks) | default planner | within 10% |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, e in summ.items():
        lines.append(
            f"| {name} | {ranks[name]} | {cell(e, 'profile')} | {cell(e, 'step')} | "
            f"{cell(e, 'profile_2rank')} | {cell(e, 'default')} | "
            f"{_verdict(name, ranks[name], e)} |"
        )
    lines += [
        "",
        "| round | layout | load avg | measured tokens/s (CPU clock) | wall clock | "
        "predicted: A profile / A one rate / D profile / default |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["predicted"]
        d = f"{p['profile_2rank']:,.0f}" if "profile_2rank" in p else "-"
        lines.append(
            f"| {r['round']} | {r['layout']} | {r['loadavg'][0]} | "
            f"{r['cpu_tokens_per_s']:,.0f} | {r['wall_tokens_per_s']:,.0f} | "
            f"{p['profile']:,.0f} / {p['step']:,.0f} / {d} / {p['default']:,.0f} |"
        )
    lines += ["", *meta["notes"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-dp", action="store_true", help="skip layout D (2 processes)")
    ap.add_argument("--no-write", action="store_true", help="print only (smoke tests)")
    args = ap.parse_args(argv)
    layouts = {k: v for k, v in LAYOUTS.items() if not (args.no_dp and v.get("nproc"))}
    work = Path(tempfile.mkdtemp(prefix="calibration-"))
    try:
        rows = [r for k in range(args.rounds) for r in one_round(k, args.steps, work, layouts)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summ = summary(rows)
    notes = [dp_note(rows)] if any(r["layout"][0] == "D" for r in rows) else []
    meta = {"model": "gpt-mini", "steps": args.steps, "rounds": args.rounds, "notes": notes}
    for name, e in summ.items():
        print(
            f"{name}: median error profile {e['profile']:+.1%}, one rate {e['step']:+.1%}, "
            f"default {e['default']:+.1%}"
        )
    if not args.no_write:
        write_results(
            "calibration",
            {"rows": rows, "summary": summ, "meta": meta, "target": TARGET},
            markdown(rows, summ, meta),
        )
    return 0


def dp_note(rows: list[dict]) -> str:
    """What the two-rank layouts show, with this run's medians (CPU clock)."""

    def med(prefix: str) -> float:
        return statistics.median(r["cpu_tokens_per_s"] for r in rows if r["layout"][0] == prefix)

    def err(prefix: str, cal: str) -> float:
        return statistics.median(r["error_cpu"][cal] for r in rows if r["layout"][0] == prefix)

    loads = [r["loadavg"][0] for r in rows]
    text = (
        f"**Ranks sharing the host** (load average {min(loads):.1f}-{max(loads):.1f} in this "
        f"run). 2 ranks x 1 thread delivered {med('D') / med('A'):.2f}x the tokens/s of 1 "
        f"rank x 1 thread on the CPU clock ({med('D'):,.0f} vs {med('A'):,.0f}). A's "
        "calibration, measured by one rank alone, predicts D at "
        f"{err('D', 'profile'):+.1%}; `plan` names a calibration of another count of ranks "
        "per host (the file records it). An earlier run of this benchmark at load 8-15 "
        "measured D at about A's tokens/s (each rank's CPU seconds per token doubled): the "
        "sharing depends on what else runs on the host, which is why a calibration keeps "
        "its count."
    )
    if any(r["layout"][0] == "E" for r in rows) and "profile_2rank" in rows[0]["error_cpu"]:
        text += (
            f" E is predicted at {err('E', 'profile_2rank'):+.1%} from D's calibration and "
            f"{err('E', 'profile'):+.1%} from A's: its GEMMs have 512 rows (8 x 64 tokens) "
            "against the calibrated runs' 1,024, and on a CPU a GEMM's rate falls with its "
            "rows above the roofline's ridge (per-call dispatch and cache effects), which the "
            "roofline transfer ignores (time/calibration.py's 'Ignores')."
        )
    return text


if __name__ == "__main__":
    raise SystemExit(main())
