"""Issue 32's fp8 check: `scaletrain train --train.steps=30 --precision.dtype=fp8` against the
same job in bf16, wall time, on this CPU.

Each side is the embedded default job (`_common.default_job_args`: no evaluation, sample or
resume) run as its own `python -m scaletrain train` process from this tree, threads inherited
(as a user runs it): bf16; fp8 with `precision.fp8_matmul=auto` (what a user gets: the
once-per-process probe picks `_scaled_mm` or the emulation, and the run prints which); fp8 with
each kernel forced. Rounds run every side once, in an order rotated per round, so drift in host
load hits all sides. Per run: the process's wall time (interpreter start to exit, what the user
waits for) and the training loop's (the sum of the logged `step_s`). The figure per fp8 side is
the median over rounds of its wall time / the same round's bf16 wall time; acceptance: fp8 (auto)
within 2x. The probe's timings are read from each auto run's `fp8 matmul:` line and re-measured
here in-process (`precision.fp8_matmul.probe_cpu_fp8_matmul`).

    python benchmarks/fp8_cpu.py [--rounds 2] [--steps 30]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_flags, machine, run_default_job, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIDES = {
    "bf16": ["--precision.dtype=bf16"],
    "fp8 auto": ["--precision.dtype=fp8"],
    "fp8 scaled_mm": ["--precision.dtype=fp8", "--precision.fp8_matmul=scaled_mm"],
    "fp8 emulated": ["--precision.dtype=fp8", "--precision.fp8_matmul=emulated"],
}
ACCEPT = 2.0  # fp8 wall time within 2x bf16's (issue 32)
_PROBE = re.compile(r"torch\._scaled_mm (\d+) us vs emulation (\d+) us")


def round_order(i: int) -> list[str]:
    """Round i's side order: the list rotated by i (each side leads once every len rounds)."""
    names = list(SIDES)
    k = i % len(names)
    return names[k:] + names[:k]


def fp8_line(stdout: str) -> str:
    """The run's `fp8 matmul: ...` start line ('' for a bf16 run)."""
    return next((x for x in stdout.splitlines() if x.startswith("fp8 matmul: ")), "")


def summary(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per fp8 side: the median over rounds of its wall (and loop) time over the same round's
    bf16 time, and the median wall seconds of every side."""
    out: dict[str, dict[str, float]] = {}
    for side in SIDES:
        walls = [r[side]["wall_s"] for r in rounds]
        row = {"median_wall_s": statistics.median(walls)}
        if side != "bf16":
            row["wall_ratio"] = statistics.median(
                r[side]["wall_s"] / r["bf16"]["wall_s"] for r in rounds
            )
            row["loop_ratio"] = statistics.median(
                r[side]["loop_s"] / r["bf16"]["loop_s"] for r in rounds
            )
        out[side] = row
    return out


def _run(side: str, steps: int, run_dir: Path) -> dict[str, Any]:
    job = run_default_job(ROOT, steps, run_dir, extra=SIDES[side])
    loop = sum(float(r["step_s"]) for r in job.records if "step_s" in r)
    return {"wall_s": job.wall_s, "loop_s": loop, "fp8_line": fp8_line(job.stdout)}


def markdown(
    args: argparse.Namespace,
    rounds: list[dict[str, dict[str, Any]]],
    s: dict[str, dict[str, float]],
    probe: dict[str, Any],
) -> str:
    m = machine()
    flags = ", ".join(m["cpu_flags"]) or "none"
    amx = any(f.startswith("amx") for f in m["cpu_flags"])
    lines = [
        "# fp8 vs bf16 training on this CPU (issue 32)",
        "",
        f"`scaletrain train --train.steps={args.steps}` (the default job) with "
        "`--precision.dtype=fp8` and with `bf16`, each its own process, "
        f"{len(rounds)} rounds of every side in rotated order, threads inherited "
        f"({m.get('torch_threads')}).",
        "",
        f"CPU: **{m['processor'] or 'unknown'}**, {m['cpus']} CPUs; flags: {flags} "
        f"({'AMX' if amx else 'no AMX'}).",
        "",
        f"In-process probe (`probe_cpu_fp8_matmul`, {probe['shape']}, {probe['threads']} "
        f"threads): `torch._scaled_mm` {probe['scaled_mm_us']:.0f} us, emulation "
        f"{probe['emulated_us']:.0f} us, ratio {probe['ratio']:.2f} -> "
        f"**{probe['kernel']}** (emulate above {probe['slower_by']:g}x).",
        "",
        "| side | median wall s | wall / bf16 | loop / bf16 | within 2x |",
        "|---|---|---|---|---|",
    ]
    for side, row in s.items():
        ratio = row.get("wall_ratio")
        lines.append(
            f"| {side} | {row['median_wall_s']:.1f} | "
            + (
                f"{ratio:.2f}x | {row['loop_ratio']:.2f}x | {'yes' if ratio <= ACCEPT else 'NO'} |"
                if ratio is not None
                else "1 | 1 | - |"
            )
        )
    lines += ["", "Per round (wall s; loop s = sum of logged step_s):", ""]
    lines += ["| round | order | " + " | ".join(SIDES) + " |", "|---" * (len(SIDES) + 2) + "|"]
    for i, r in enumerate(rounds):
        cells = " | ".join(f"{r[k]['wall_s']:.1f} ({r[k]['loop_s']:.1f})" for k in SIDES)
        lines.append(f"| {i + 1} | {', '.join(round_order(i))} | {cells} |")
    lines += ["", "The fp8 auto runs' start lines:", ""]
    lines += [f"- `{r['fp8 auto']['fp8_line']}`" for r in rounds]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    from scaletrain.precision.fp8_matmul import SLOWER_BY, kernel_for, probe_cpu_fp8_matmul

    p = probe_cpu_fp8_matmul()
    probe = {
        "shape": "x".join(map(str, p.shape)),
        "threads": p.threads,
        "scaled_mm_us": p.scaled_mm_s * 1e6,
        "emulated_us": p.emulated_s * 1e6,
        "ratio": p.ratio,
        "kernel": kernel_for(p),
        "slower_by": SLOWER_BY,
    }
    print(f"probe: {probe}", flush=True)
    rounds: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="fp8_cpu-") as tmp_s:
        tmp = Path(tmp_s)
        for i in range(args.rounds):
            r = {}
            for side in round_order(i):
                r[side] = _run(side, args.steps, tmp / f"{side.replace(' ', '-')}-{i}")
                print(f"round {i + 1} {side}: {r[side]}", flush=True)
            rounds.append(r)
    s = summary(rounds)
    print(s)
    write_results(
        "fp8_cpu",
        {
            "steps": args.steps,
            "cpu_flags": cpu_flags(),
            "probe": probe,
            "rounds": rounds,
            "summary": s,
            "accept_wall_ratio": ACCEPT,
        },
        markdown(args, rounds, s, probe),
    )


if __name__ == "__main__":
    main()
