"""scaletrain against nanoGPT on nanoGPT's own CPU recipe, side by side on one host.

nanoGPT's `train.py` runs from ../shared/peers/nanoGPT/ (never copied into the project) in a
scratch directory that holds its data: `data/shakespeare_char/prepare.py` (linked there, so it
writes beside the link) turns ../shared/data/tinyshakespeare.txt into train.bin/val.bin/meta.pkl.
scaletrain runs `python -m scaletrain train` with `nanogpt_shakespeare.recipe_args`. All are
whole processes (start-up, data preparation, evaluation and checkpoints included), run in
rounds whose order rotates, so that load on the host hits every side alike; the wall-time
ratio is taken per round and the median reported, beside each process's CPU seconds (user +
system: less disturbed than wall time by other load on a shared host).

Precision: nanoGPT's train.py runs fp32 on a CPU whatever its --dtype says (its autocast
context is CUDA-only; `--dtype=float32` here keeps its GradScaler off). scaletrain runs the
recipe in fp32 (the same arithmetic) and, where the CPU multiplies bf16 at least 1.5x faster
than fp32 (`_common.bf16_matmul_speedup`: AVX512-BF16 or AMX hosts), also in bf16 autocast
with fp32 master weights and fp32 AdamW (`precision.dtype=bf16`, with the S x S attention
core whose softmax runs in fp32: `recipe_args` says why) — what a training system does on
hardware with bf16 units; the val loss column says whether it costs accuracy.

Where scaletrain's time goes comes from the run itself: the trainer writes its phase clock
(`scaletrain.clock`: plan, data, setup, steps, eval, checkpoint, finish) into run_info.json with
the time it wrote it; the rest before is start-up (interpreter and imports), the rest after is
exit. "steps" is split into the step itself (the `step_s` the trainer logs per step: batch,
forward, backward, clip, optimizer) and the loop's per-step logging and metrics.

The recipe (nanoGPT README, "I only have a macbook"): 4 layers, 4 heads, 128 wide, context 64,
batch 12, 2000 iterations, lr 1e-3 cosine to 1e-4, 100 warm-up, beta2 0.99, no dropout,
characters. nanoGPT evaluates 20 batches of each split every 250 iterations; scaletrain
evaluates 40 validation batches (the same forward work).

    python benchmarks/vs_nanogpt.py [--pairs 3] [--steps 2000] [--threads N] [--precisions P]
    python benchmarks/vs_nanogpt.py --pairs 3 --steps 300 --threads 1 --out /tmp/x  # quick A/B
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from nanogpt_shakespeare import DATA, recipe_args  # noqa: E402

PEER = Path(__file__).resolve().parents[2] / "shared" / "peers" / "nanoGPT"
VAL_LINE = re.compile(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)")


def nanogpt_args(steps: int) -> list[str]:
    return [
        str(PEER / "config" / "train_shakespeare_char.py"),
        "--device=cpu",
        "--compile=False",
        "--eval_iters=20",
        "--log_interval=1",
        "--block_size=64",
        "--batch_size=12",
        "--n_layer=4",
        "--n_head=4",
        "--n_embd=128",
        f"--max_iters={steps}",
        f"--lr_decay_iters={steps}",
        "--dropout=0.0",
        "--dtype=float32",
    ]


def prepare_nanogpt(scratch: Path, text: Path) -> None:
    """nanoGPT reads data/shakespeare_char/ and exec()s configurator.py from its working
    directory: link both into `scratch` and run its own prepare.py there."""
    data = scratch / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    (data / "input.txt").symlink_to(text)
    (data / "prepare.py").symlink_to(PEER / "data" / "shakespeare_char" / "prepare.py")
    (scratch / "configurator.py").symlink_to(PEER / "configurator.py")
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)


def _env(threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(
    cmd: list[str], cwd: Path, threads: int | None, who: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, float]]:
    """Run `cmd`; its output and {wall_s, cpu_s, start_unix, end_unix}."""
    cpu0, start, t0 = _children_cpu_s(), time.time(), time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=_env(threads), capture_output=True, text=True)
    wall, end = time.perf_counter() - t0, time.time()
    if out.returncode:
        raise RuntimeError(f"{who} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out, {
        "wall_s": wall,
        "cpu_s": _children_cpu_s() - cpu0,
        "start_unix": start,
        "end_unix": end,
    }


def run_nanogpt(scratch: Path, steps: int, threads: int | None) -> dict[str, float]:
    out, t = _timed(
        [sys.executable, str(PEER / "train.py"), *nanogpt_args(steps)], scratch, threads, "nanoGPT"
    )
    last = VAL_LINE.findall(out.stdout)[-1]
    return {
        "wall_s": t["wall_s"],
        "cpu_s": t["cpu_s"],
        "val_loss": float(last[2]),
        "train_loss": float(last[1]),
    }


def run_scaletrain(
    scratch: Path, text: Path, steps: int, threads: int | None, tag: str, precision: str
) -> dict[str, Any]:
    run_dir = scratch / f"scaletrain-run-{tag}"  # a fresh one: metrics.jsonl is appended to
    args = recipe_args(str(text), steps, str(run_dir), precision)
    args = [a for a in args if not a.startswith(("--train.sample_tokens", "--train.eval_batches"))]
    args += [
        "--train.sample_tokens=0",
        "--train.eval_batches=40",
        f"--data.cache_dir={scratch / 'cache'}",
    ]
    _, t = _timed(
        [sys.executable, "-m", "scaletrain", "train", *args], scratch, threads, "scaletrain"
    )
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if "val_loss" in r][-1]
    info = json.loads((run_dir / "run_info.json").read_text())
    return {
        "wall_s": t["wall_s"],
        "cpu_s": t["cpu_s"],
        "val_loss": float(val["val_loss"]),
        "train_loss": float(records[-1]["loss"]),
        "phases_s": phases(info, records, t["start_unix"], t["end_unix"]),
    }


PHASE_ROWS = (
    ("start-up", "interpreter start, imports, CLI (what no phase covers before the run)"),
    ("plan", "config resolution, layout, fit check"),
    ("data", "corpus preparation (cached shards after the first run)"),
    ("setup", "process group, model, optimizer, loggers, tokenizer and config files"),
    ("steps", "training steps (`step_s`: batch, forward, backward, clip, optimizer)"),
    ("step logging", "per-step metrics, logging, heartbeat (the loop around the steps)"),
    ("eval", "validation batches"),
    ("checkpoint", "checkpoint saves"),
    ("finish", "sample, export, ledger, run files"),
    ("exit", "after run_info.json: summary, logger close, interpreter teardown"),
)


def phases(
    info: dict[str, Any], records: list[dict[str, Any]], start_unix: float, end_unix: float
) -> dict[str, float]:
    """Wall seconds of the scaletrain process by phase (`PHASE_ROWS`), summing to its wall."""
    clock = dict(info["phases_s"])
    step_s = sum(float(r["step_s"]) for r in records)
    loop = clock.pop("steps", 0.0)
    out = {
        "plan": clock.pop("plan", 0.0),
        "data": clock.pop("data", 0.0),
        "setup": clock.pop("setup", 0.0),
        "steps": step_s,
        "step logging": loop - step_s,
        "eval": clock.pop("eval", 0.0),
        "checkpoint": clock.pop("checkpoint", 0.0),
        "finish": clock.pop("finish", 0.0),
        **clock,
    }
    written = float(info["phases_written_unix"])
    out["start-up"] = written - start_unix - sum(out.values())
    out["exit"] = end_unix - written
    return {name: out.get(name, 0.0) for name, _ in PHASE_ROWS}


def scaletrain_precisions(spec: str, threads: int | None) -> tuple[list[str], float]:
    """The scaletrain sides to run ('fp32,bf16', or 'auto': fp32, plus bf16 where this CPU
    multiplies bf16 at least 1.5x faster than fp32) and the measured bf16 matmul speedup."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    speedup = _common.bf16_matmul_speedup()
    if spec != "auto":
        return [p.strip() for p in spec.split(",") if p.strip()], speedup
    return (["fp32", "bf16"] if speedup >= 1.5 else ["fp32"]), speedup


def run_rounds(
    args: argparse.Namespace, text: Path, precisions: list[str]
) -> list[dict[str, dict[str, Any]]]:
    """`args.pairs` rounds of nanoGPT and each scaletrain side, the order rotated every round
    so that a drift in host load does not favour one side; per round the wall and CPU ratio
    of each scaletrain side to that round's nanoGPT."""
    rounds = []
    sides = ["nanogpt", *(f"scaletrain-{p}" for p in precisions)]
    with tempfile.TemporaryDirectory(prefix="vs_nanogpt-") as tmp:
        scratch = Path(tmp)
        prepare_nanogpt(scratch, text)
        for i in range(args.pairs):
            r = i % len(sides)
            rnd: dict[str, dict[str, Any]] = {}
            for who in sides[r:] + sides[:r]:
                rnd[who] = (
                    run_nanogpt(scratch, args.steps, args.threads)
                    if who == "nanogpt"
                    else run_scaletrain(
                        scratch, text, args.steps, args.threads, f"{i}-{who}", who.split("-")[1]
                    )
                )
                print(f"round {i + 1} {who}: {rnd[who]}", flush=True)
            rnd["ratio"] = {
                p: {
                    key: rnd[f"scaletrain-{p}"][f"{key}_s"] / rnd["nanogpt"][f"{key}_s"]
                    for key in ("wall", "cpu")
                }
                for p in precisions
            }
            rounds.append(rnd)
    return rounds


def summary(rounds: list[dict[str, dict[str, Any]]], precisions: list[str]) -> dict[str, Any]:
    med = statistics.median
    out: dict[str, Any] = {
        "nanogpt_val_loss_median": med(r["nanogpt"]["val_loss"] for r in rounds),
        "nanogpt_wall_s_median": med(r["nanogpt"]["wall_s"] for r in rounds),
    }
    for p in precisions:
        side = f"scaletrain-{p}"
        out[p] = {
            "median_wall_ratio": med(r["ratio"][p]["wall"] for r in rounds),
            "median_cpu_ratio": med(r["ratio"][p]["cpu"] for r in rounds),
            "val_loss_median": med(r[side]["val_loss"] for r in rounds),
            "wall_s_median": med(r[side]["wall_s"] for r in rounds),
            "phases_s_median": {
                name: med(r[side]["phases_s"][name] for r in rounds) for name, _ in PHASE_ROWS
            },
        }
    return out


def markdown(
    args: argparse.Namespace, rounds: list[dict[str, Any]], s: dict[str, Any], speedup: float
) -> str:
    precisions = [p for p in ("fp32", "bf16") if p in s]
    head = "| round | nanoGPT wall | " + " | ".join(
        f"scaletrain {p} wall | ratio | CPU-time ratio" for p in precisions
    )
    rows = "\n".join(
        f"| {i + 1} | {r['nanogpt']['wall_s']:.1f} s | "
        + " | ".join(
            f"{r[f'scaletrain-{p}']['wall_s']:.1f} s | {r['ratio'][p]['wall']:.3f}x | "
            f"{r['ratio'][p]['cpu']:.3f}x"
            for p in precisions
        )
        + " |"
        for i, r in enumerate(rounds)
    )
    lines = "\n".join(
        f"- **scaletrain {p}: median wall-time ratio {s[p]['median_wall_ratio']:.3f}x** "
        f"nanoGPT's (CPU time {s[p]['median_cpu_ratio']:.3f}x), val loss "
        f"{s[p]['val_loss_median']:.4f} vs nanoGPT's {s['nanogpt_val_loss_median']:.4f}"
        for p in precisions
    )
    phase_rows = "\n".join(
        f"| {name} | "
        + " | ".join(
            f"{s[p]['phases_s_median'][name]:.2f} s "
            f"({s[p]['phases_s_median'][name] / sum(s[p]['phases_s_median'].values()):.1%})"
            for p in precisions
        )
        + f" | {what} |"
        for name, what in PHASE_ROWS
    )
    return (
        f"nanoGPT's CPU recipe, {args.steps} iterations, run in rotating order on one host "
        f"(OMP_NUM_THREADS={args.threads or 'inherited'}). nanoGPT's train.py runs fp32 on a "
        "CPU (its autocast context is CUDA-only); scaletrain runs the recipe in fp32 (the same "
        "arithmetic) and, where this CPU multiplies bf16 faster, in bf16 autocast with fp32 "
        f"master weights (`precision.dtype=bf16`). bf16 matmul speedup on this CPU at the "
        f"recipe's MLP shape: {speedup:.2f}x.\n\n"
        + head
        + " |\n|---|---|"
        + "---|---|---|" * len(precisions)
        + "\n"
        + rows
        + "\n\n"
        + lines
        + "\n\nWhere scaletrain's wall time goes (median over the rounds, from the run's own "
        "phase clock in run_info.json; see the module docstring):\n\n| phase | "
        + " | ".join(precisions)
        + " | what |\n|---|"
        + "---|" * len(precisions)
        + "---|\n"
        + phase_rows
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3, help="rounds (each runs every side once)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument(
        "--threads", type=int, default=None, help="OMP_NUM_THREADS for both (default: inherit)"
    )
    ap.add_argument(
        "--precisions",
        default="fp32,bf16",
        help="scaletrain sides (default fp32,bf16: both, so that every host's result file "
        "reports both precisions; 'auto': fp32, plus bf16 where this CPU's bf16 matmul is "
        ">= 1.5x faster)",
    )
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument(
        "--out",
        default=None,
        help="write the results files here instead of benchmarks/results/ "
        "(quick comparisons must not overwrite the committed results)",
    )
    args = ap.parse_args()
    if args.out:
        _common.RESULTS = Path(args.out)
    text = Path(args.data).resolve()
    if not text.is_file():
        sys.exit(f"tinyshakespeare not found at {text}: pass --data PATH")
    if not (PEER / "train.py").is_file():
        sys.exit(f"nanoGPT not found at {PEER}: the peers live in ../shared/peers/")
    precisions, speedup = scaletrain_precisions(args.precisions, args.threads)
    if not precisions or any(p not in ("fp32", "bf16") for p in precisions):
        sys.exit(f"--precisions {args.precisions!r}: use 'auto' or a list of fp32, bf16")
    rounds = run_rounds(args, text, precisions)
    s = summary(rounds, precisions)
    data = {
        "steps": args.steps,
        "threads": args.threads,
        "bf16_matmul_speedup": speedup,
        "rounds": rounds,
        **s,
    }
    md = markdown(args, rounds, s, speedup)
    _common.write_results("vs_nanogpt", data, md)
    print(md)


if __name__ == "__main__":
    main()
