"""Calibrate the planner on one layout of the default job, predict other layouts' tokens/s.

Each round, on this CPU, with the commands a user types (`python -m scaletrain ...`):
1. `scaletrain train` of the embedded default job (gpt-mini, global batch 16 x 128 tokens, fp32),
   1 process x 1 thread: layout A;
2. `scaletrain verify A --calibrate` before any profile: the one-rate calibration ('step');
3. `scaletrain profile` of the same job (into A/profile), then `verify --calibrate` again: the
   split calibration ('profile': GEMM rate per shape class, attention, non-GEMM, optimizer);
4. for each target layout, `scaletrain plan ... --calibration` with each calibration (and the
   default planner), then `scaletrain train` of it, measured.
Targets: B = sequences of 64 tokens, global batch 32 (the same tokens per step, half the
attention per token); C = micro-batch 8 x 2 accumulation steps; D = 2 gloo processes x 1
thread (`--nproc 2`, data parallel, micro-batch 8 each).

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
}


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


def one_round(k: int, steps: int, work: Path, layouts: dict[str, dict[str, Any]]) -> list[dict]:
    rows = []
    base = work / f"r{k}"
    a_dir = base / "A"
    train_args = [f"--train.steps={steps}", *RUN]
    scaletrain("train", *train_args, f"--train.run_dir={a_dir}", cwd=work)
    cals = {"step": base / "cal_step.toml", "profile": base / "cal_profile.toml"}
    scaletrain("verify", str(a_dir), "--calibrate", str(cals["step"]), cwd=work)
    scaletrain("profile", *train_args, f"--train.run_dir={a_dir}", "--steps", "3", cwd=work)
    scaletrain("verify", str(a_dir), "--calibrate", str(cals["profile"]), cwd=work)
    for name, spec in layouts.items():
        pred = {c: predicted(spec["plan"], p, work) for c, p in cals.items()}
        pred["default"] = predicted(spec["plan"], None, work)
        if name.startswith("A"):
            run_dir = a_dir
        else:
            run_dir = base / name[0]
            nproc = ["--nproc", str(spec["nproc"])] if spec.get("nproc") else []
            scaletrain(
                "train", *train_args, *spec["train"], f"--train.run_dir={run_dir}", *nproc, cwd=work
            )
        m = measured(run_dir)
        rows.append(
            {
                "round": k,
                "layout": name,
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


def markdown(rows: list[dict], summ: dict[str, dict[str, float]], meta: dict[str, Any]) -> str:
    lines = [
        "# Calibration from one run: predict another layout's tokens/s on this CPU",
        "",
        f"The default job ({meta['model']}, fp32) trained {meta['steps']} steps per layout, "
        f"{meta['rounds']} rounds; each round calibrates on layout A (`scaletrain verify A "
        "--calibrate`, with and without `scaletrain profile`'s split) and predicts the others "
        "with `scaletrain plan --calibration`. Measured tokens/s on the step's CPU clock "
        "(rank 0; a one-thread rank's CPU seconds are its device time), wall clock beside: "
        "the host's 2 cores were shared with other jobs (load average per row). Error = "
        f"predicted / measured - 1; target |error| <= {TARGET:.0%} for the calibrated "
        "predictions.",
        "",
        "| layout | median error, profile calibration | one-rate calibration | default "
        "planner | within 10% (profile) |",
        "|---|---|---|---|---|",
    ]
    for name, e in summ.items():
        ok = (
            "calibrated on it"
            if name.startswith("A")
            else ("yes" if abs(e["profile"]) <= TARGET else "**no**")
        )
        lines.append(
            f"| {name} | {e['profile']:+.1%} | {e['step']:+.1%} | {e['default']:+.1%} | {ok} |"
        )
    lines += [
        "",
        "| round | layout | load avg | measured tokens/s (CPU clock) | wall clock | "
        "predicted: profile / one rate / default |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["predicted"]
        lines.append(
            f"| {r['round']} | {r['layout']} | {r['loadavg'][0]} | "
            f"{r['cpu_tokens_per_s']:,.0f} | {r['wall_tokens_per_s']:,.0f} | "
            f"{p['profile']:,.0f} / {p['step']:,.0f} / {p['default']:,.0f} |"
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
    """Why layout D is not predicted, with this run's medians (CPU clock) of A and D."""

    def med(prefix: str) -> float:
        return statistics.median(r["cpu_tokens_per_s"] for r in rows if r["layout"][0] == prefix)

    loads = [r["loadavg"][0] for r in rows]
    return (
        "**D (2 processes) is not predicted**: on the CPU clock 2 ranks x 1 thread deliver "
        f"about the tokens/s of 1 rank x 1 thread ({med('D'):,.0f} vs {med('A'):,.0f} here; "
        "benchmarks/results/scaling.md found the same on the wall clock of a quieter host: "
        "7.1k vs 6.9k). Each rank's CPU seconds per token double when both run, which is what "
        "two vCPUs sharing one physical core's vector units (SMT siblings on the KVM host; "
        "`lscpu` inside the VM cannot tell) would do; the wall-clock column measures the "
        f"queue of a host at load {min(loads):.0f}-{max(loads):.0f} more than the run. The "
        "planner, calibrated on one rank alone, gives each rank the whole device and predicts "
        "about 2x. Not tried: calibrating from a profiled 2-process run, whose rates would "
        "include the sharing."
    )


if __name__ == "__main__":
    raise SystemExit(main())
