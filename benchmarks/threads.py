"""Thread hygiene: the default job's tokens/s alone and beside a second training, with idle
OpenMP threads spinning (libgomp's default) or sleeping (OMP_WAIT_POLICY=PASSIVE, what the
`scaletrain` command sets unless you set it).

libgomp reads OMP_WAIT_POLICY once, when torch loads it. Every run imports torch before the
CLI, so the policy is the benchmark's (POLICIES): 'spin' is libgomp's default wait (spin ~300k
iterations, then sleep), 'passive' sleeps at once, 'spin20k' spins 20k iterations first.
'shared' runs two identical trainings at once on the same cores (the situation of a user
whose laptop runs another job), 'alone' one.
Modes alternate so that drift in the host's load hits each alike; the host's 1-minute load
average before each run is recorded (this host may be shared with other work).

    python benchmarks/threads.py [--steps 40] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

_SPIN = "import torch, sys; from scaletrain.cli import main; sys.exit(main(sys.argv[1:]))"


POLICIES = {
    "spin": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin20k": {"GOMP_SPINCOUNT": "20000"},
}
"""libgomp's default (spin 300k iterations, then sleep); sleep at once; spin 20k, then sleep."""


def _cmd(policy: str, run_dir: Path, cache: Path, steps: int) -> tuple[list[str], dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(POLICIES[policy])
    args = [
        "train",
        f"--train.steps={steps}",
        f"--train.run_dir={run_dir}",
        f"--data.cache_dir={cache}",
        "--train.progress=false",
        "--train.sample_tokens=0",
        "--checkpoint.resume=never",
        "--train.eval_every=100000",
    ]
    return [sys.executable, "-c", _SPIN, *args], env


def _tokens_per_s(run_dir: Path) -> float:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = recs[1:]  # the first step pays one-time costs
    return (
        len(steady)
        * (recs[0]["tokens_per_s"] * recs[0]["step_s"])
        / sum(r["step_s"] for r in steady)
    )


def run(policy: str, copies: int, tmp: Path, steps: int, tag: str) -> list[float]:
    procs, dirs = [], []
    for i in range(copies):
        d = tmp / f"{tag}-{i}"
        cmd, env = _cmd(policy, d, tmp / "cache", steps)
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
        )
        dirs.append(d)
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise RuntimeError(err[-2000:])
    return [_tokens_per_s(d) for d in dirs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--policies", default="spin,passive,spin20k")
    args = ap.parse_args()
    results: dict[str, list[float]] = {}
    loads: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="threads-") as t:
        tmp = Path(t)
        run("passive", 1, tmp, 2, "warm")  # builds the corpus cache once
        for rep in range(args.reps):
            pols = args.policies.split(",")
            modes = [(p, 1) for p in pols] + [(p, 2) for p in pols]
            for policy, copies in modes if rep % 2 == 0 else modes[::-1]:
                key = f"{policy} {'alone' if copies == 1 else 'shared'}"
                loads.setdefault(key, []).append(os.getloadavg()[0])
                got = run(policy, copies, tmp, args.steps, f"{key}-{rep}".replace(" ", "-"))
                results.setdefault(key, []).extend(got)
                print(
                    f"rep {rep + 1} {key}: {', '.join(f'{x:,.0f}' for x in got)} tokens/s",
                    flush=True,
                )
    med = {k: statistics.median(v) for k, v in results.items()}
    rows = "\n".join(
        f"| {k} | {med[k]:,.0f} | {', '.join(f'{x:,.0f}' for x in v)} | "
        f"{statistics.mean(loads[k]):.1f} |"
        for k, v in results.items()
    )
    md = (
        "Default job (gpt-mini, grammar corpus), steady-state tokens/s per training process; "
        "'shared' = two trainings at once on the same cores.\n\n"
        "| mode | median tokens/s | runs | host load before (1-min avg) |\n|---|---|---|---|\n"
        + rows
        + "\n\n"
        + "\n".join(
            f"{p} / spin: alone {med[p + ' alone'] / med['spin alone']:.2f}x, "
            f"shared {med[p + ' shared'] / med['spin shared']:.2f}x."
            for p in args.policies.split(",")
            if p != "spin"
        )
    )
    write_results(
        "threads",
        {
            "steps": args.steps,
            "tokens_per_s": results,
            "median": med,
            "load_before": loads,
            "cpus": os.cpu_count(),
        },
        md,
    )
    print(md)


if __name__ == "__main__":
    main()
