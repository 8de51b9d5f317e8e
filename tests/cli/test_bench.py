"""`scaletrain bench NAME`: runs from any directory, writes to --out, not the committed results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.cli import main
from scaletrain.cli.bench import benchmark_dir, fresh_out_dir

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_fresh_out_dir_never_reuses_one(tmp_path: Path) -> None:
    first = fresh_out_dir("attention", tmp_path)
    first.mkdir(parents=True)
    assert fresh_out_dir("attention", tmp_path) == tmp_path / "runs" / "bench-attention-2"


def test_unknown_benchmark_names_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "no_such_bench"]) == 2
    err = capsys.readouterr().err
    assert "bench.name" in err and "planner_search" in err


@pytest.mark.slow
def test_bench_runs_from_another_directory_into_out(tmp_path: Path) -> None:
    committed = benchmark_dir() / "results" / "planner_search.json"
    before = committed.read_bytes() if committed.exists() else None
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "scaletrain", "bench", "planner_search", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "planner_search.json").is_file() and (out / "planner_search.md").is_file()
    assert (committed.read_bytes() if committed.exists() else None) == before
