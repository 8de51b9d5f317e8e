"""`scaletrain bench NAME`: runs from any directory, writes to --out, not the committed results."""

from __future__ import annotations

import json
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
    """From a directory outside the checkout, with a bare environment: the script's results go
    to --out (never over the committed ones) and the arguments after NAME reach the script
    (`--repeats 1`: what is checked here is where the files go, not the best-of-3 figures; the
    docs test runs the benchmark as documented)."""
    committed = benchmark_dir() / "results" / "planner_search.json"
    before = committed.read_bytes() if committed.exists() else None
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "scaletrain", "bench", "planner_search", "--out", str(out)]
        + ["--repeats", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "planner_search.json").is_file() and (out / "planner_search.md").is_file()
    assert json.loads((out / "planner_search.json").read_text())["repeats"] == 1
    assert (committed.read_bytes() if committed.exists() else None) == before


def _attention():
    """benchmarks/attention.py as a module (its `_common` import needs benchmarks/ on the path)."""
    import importlib.util

    bench = str(benchmark_dir())
    if bench not in sys.path:
        sys.path.insert(0, bench)
    spec = importlib.util.spec_from_file_location(
        "bench_attention", benchmark_dir() / "attention.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_attention_plans_its_memory_before_running(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #41 item 6: `bench attention` used 9.7 GB with no warning. Its points are planned
    first (the planner's naive-attention terms) and held against the memory `train` checks;
    what does not fit is dropped in one line, naive first (quadratic)."""
    att = _attention()
    p512, p1024 = (att.planned_bytes("naive", s, elem_bytes=4) for s in (512, 1024))
    assert p1024 > 3 * p512  # the S x S terms dominate: ~4x per doubling
    avail = (p512 + p1024) / 2  # naive 512 fits, naive 1024 does not, SDPA does
    rc = att.main(
        ["--max-seq", "1024", "--repeats", "1", "--no-write"],
        available=(avail, "host memory (test)"),
    )
    assert rc == 0
    out = capsys.readouterr().out
    check = [line for line in out.splitlines() if line.startswith("memory check:")]
    assert len(check) == 1 and "dropped naive above seq 512" in check[0], out
    assert "host memory (test)" in check[0] and "--force" in check[0]
    ran = {tuple(line.split()[1:3]) for line in out.splitlines() if line.startswith("seq ")}
    assert ran == {("512", "naive"), ("512", "sdpa"), ("1024", "sdpa")}, out
    # the slopes are a table, not a Python dict
    assert "{" not in out and "log-log slope" in out


def test_bench_attention_refuses_when_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    att = _attention()
    with pytest.raises(SystemExit) as e:
        att.main(["--max-seq", "1024", "--no-write"], available=(1000.0, "host memory (test)"))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sdpa at seq 512" in err[0] and "--force" in err[0], err
