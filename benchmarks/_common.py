"""Shared helpers for benchmark scripts: results files stamped with revision and machine."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT_ENV = "SCALETRAIN_BENCH_OUT"
"""Set by `scaletrain bench --out DIR` (a separate process): write there, not into the committed
results/. `python benchmarks/NAME.py` refreshes the committed files on purpose."""
RESULTS = Path(os.environ.get(OUT_ENV) or Path(__file__).resolve().parent / "results")


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() is empty on Linux):
    timings from two sessions are only comparable on the same CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> list[str]:
    """The CPU's matrix and vector flags that decide CPU speed ratios (avx2, avx512*, amx*),
    sorted: oneDNN picks AMX or AVX512-BF16 for bf16 matmuls, AVX-512 or AVX2 for fp32, and
    bf16 and fp8 matmul speeds differ by orders of magnitude between hosts with and without
    them (issue 32), so a ratio names them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return sorted(f for f in flags if f == "avx2" or f.startswith(("avx512", "amx")))
    except OSError:
        pass
    return []


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or _cpu_model(),
        "cpu_flags": cpu_flags(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def stamp() -> dict[str, Any]:
    return {
        "git_revision": git_revision(),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def write_results(
    name: str, data: dict[str, Any], markdown: str, *, missing: str = ""
) -> tuple[Path, Path]:
    """Write results/NAME.json (data + stamp) and results/NAME.md (table + stamp line).

    missing: what this run lacked that the committed results hold (a peer not installed, no
    GPU). Such a run never overwrites committed results with less: it writes NAME.partial.*
    beside them and says so (with --out / SCALETRAIN_BENCH_OUT it writes there as usual)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    s = stamp()
    stem = name
    if missing and not os.environ.get(OUT_ENV) and (RESULTS / f"{name}.json").exists():
        stem = f"{name}.partial"
        print(
            f"note: {missing}: the committed results/{name}.* are kept; this run's are in "
            f"results/{stem}.*"
        )
    jpath, mpath = RESULTS / f"{stem}.json", RESULTS / f"{stem}.md"
    jpath.write_text(json.dumps({**data, **s}, indent=1, default=str) + "\n")
    m = s["machine"]
    where = m.get("gpu") or m["processor"] or "cpu"
    if not m.get("gpu"):  # CPU ratios depend on the ISA the kernels ran on
        flags = " ".join(m.get("cpu_flags") or ["no AVX-512/AMX flags"])
        where += f" ({flags}; torch kernels {m.get('torch_cpu_capability', '?')})"
    foot = (
        f"\n\n_git {s['git_revision']} · {s['date']} · {where}"
        f" · {m['cpus']} CPUs · torch {m.get('torch', '?')}_\n"
    )
    mpath.write_text(markdown.rstrip() + foot)
    return jpath, mpath


def default_job_args(steps: int, run_dir: Path) -> list[str]:
    """`scaletrain train` on the embedded default job for `steps` steps into `run_dir`, with
    nothing but the steps timed: no progress bar, sample, resume or evaluation."""
    return [
        "train",
        f"--train.steps={steps}",
        f"--train.run_dir={run_dir}",
        "--train.progress=false",
        "--train.sample_tokens=0",
        "--checkpoint.resume=never",
        "--train.eval_every=100000",
    ]


@dataclass(frozen=True)
class JobRun:
    """One `scaletrain train` process: its metrics.jsonl records, stdout and wall seconds
    (interpreter start to exit, as a user waits for it)."""

    records: list[dict[str, Any]]
    stdout: str
    wall_s: float


def run_default_job(
    tree: Path,
    steps: int,
    run_dir: Path,
    env: dict[str, str] | None = None,
    extra: Sequence[str] = (),
) -> JobRun:
    """Run the default job (`default_job_args`, then the `extra` overrides) from the source
    tree `tree` (its src/ on PYTHONPATH) as its own process, with `env` added."""
    full_env = {**os.environ, "PYTHONPATH": str(tree / "src"), **(env or {})}
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "scaletrain", *default_job_args(steps, run_dir), *extra],
        env=full_env,
        capture_output=True,
        text=True,
        cwd=run_dir.parent,
        check=False,
    )
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"train from {tree} failed: {p.stderr.strip().splitlines()[-1:]}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return JobRun([json.loads(x) for x in lines], p.stdout, wall)


def default_job_records(
    tree: Path, steps: int, run_dir: Path, env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The records of the default job's metrics.jsonl (`run_default_job`)."""
    return run_default_job(tree, steps, run_dir, env).records


def bf16_matmul_speedup(m: int = 768, k: int = 128, n: int = 512, seconds: float = 0.3) -> float:
    """fp32 time over bf16 time of one (m, k) @ (k, n) CPU matmul at torch's current threads
    (medians of repeats over about `seconds` each). About 3.5 on a CPU with AVX512-BF16 dot
    products (measured 2026-11-28, AMD EPYC: 472 vs 119 us at 768x128x512, two threads);
    below 1 where bf16 is emulated through fp32 conversions. The default shape is the
    nanoGPT recipe's MLP matmul (batch 12 x 64 tokens, 128 wide)."""
    import statistics
    import time

    import torch

    def per_call(a: torch.Tensor, b: torch.Tensor) -> float:
        for _ in range(5):
            a @ b
        times, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end or len(times) < 5:
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    a, b = torch.randn(m, k), torch.randn(k, n)
    return per_call(a, b) / per_call(a.bfloat16(), b.bfloat16())
