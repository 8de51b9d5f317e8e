"""Run `python -m scaletrain ...` as a user would: a subprocess with this worktree's code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def tiny_job(tmp_path: Path, run: str = "run", *extra: str) -> list[str]:
    """Overrides of a 2-step tiny-llama job writing to tmp_path/run (a second or so)."""
    return [
        "--model.name=tiny-llama",
        "--batch.seq_len=16",
        "--batch.global_batch=2",
        "--batch.micro_batch=2",
        "--train.steps=2",
        "--train.eval_every=1000",
        "--train.eval_batches=1",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--data.num_tokens=20000",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / run}",
        "--optim.warmup_steps=0",
        "--guard.enabled=false",
        *extra,
    ]


def env() -> dict[str, str]:
    e = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    e["PYTHONPATH"] = SRC + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def scaletrain(
    *args: str,
    timeout: float = 240,
    extra_env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scaletrain", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env(), **(extra_env or {})},
        cwd=cwd,
    )


def no_traceback(p: subprocess.CompletedProcess[str]) -> bool:
    return "Traceback" not in p.stderr and "Traceback" not in p.stdout


def digests(root: Path) -> dict[str, str]:
    """Every regular file under `root`: path relative to it -> sha256 of its bytes."""
    import hashlib

    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def lost(before: dict[str, str], root: Path) -> list[str]:
    """The files of `before` (a `digests`) that are gone from `root` or hold other bytes now:
    what a fault must never do to what a run already wrote."""
    now = digests(root)
    return [name for name, digest in before.items() if now.get(name) != digest]


def one_line(p: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The single stderr line of a refused command, holding every needle."""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and no_traceback(p), p.stderr[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]
