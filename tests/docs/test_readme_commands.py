"""Every command README.md, benchmarks/README.md and the configs' headers show runs as written.

The commands are discovered (tests/docs/_commands.py), so an example added or edited anywhere in
those files is tested without touching this file; how each runs (short training, torchrun through
`plan`, benchmarks into a scratch directory) is described there. They run in document order in
one scratch directory that holds `configs/` (so `scaletrain verify runs/default` finds the run
`scaletrain train` made).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs._commands import ROOT, doc_commands, is_slow, runnable

SCRATCH = Path("/nonexistent-scratch")  # argv at collection time only names it


def _params() -> list:
    out = []
    for cmd in doc_commands():
        run = runnable(cmd, SCRATCH)
        marks = [pytest.mark.slow] if run is not None and is_slow(run) else []
        out.append(pytest.param(cmd, id=cmd.id[:120], marks=marks))
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("docs")
    (d / "configs").symlink_to(ROOT / "configs")
    return d


@pytest.fixture(scope="module")
def finished() -> dict[tuple[str | None, ...], subprocess.CompletedProcess[str]]:
    """What this module has run, by the script and argv that ran: doc commands that map to the
    same run (`python benchmarks/NAME.py` and `scaletrain bench NAME` both run
    `scaletrain bench planner_search --out DIR`, its full best-of-3) share one process."""
    return {}


def _scaletrain(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "scaletrain", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_docs_show_commands() -> None:
    cmds = doc_commands()
    sources = {c.source for c in cmds}
    assert {"README.md", "benchmarks/README.md"} <= sources
    assert any(s.startswith("configs/") for s in sources)
    assert any(c.text.startswith("torchrun") for c in cmds)


@pytest.mark.parametrize("cmd", _params())
def test_command_runs_as_written(cmd, workdir: Path, finished: dict) -> None:
    run = runnable(cmd, workdir)
    if run is None:
        pytest.skip(f"not run by design: {cmd.text}")
    key = (run.script, *run.argv)
    if run.script is not None:
        proc = finished.get(key) or subprocess.run(
            [sys.executable, str(ROOT / run.script), *run.argv],
            cwd=workdir,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            capture_output=True,
            text=True,
            timeout=600,
        )
        finished[key] = proc
        assert proc.returncode == 0, f"{cmd.id}\n{proc.stdout[-1500:]}\n{proc.stderr[-2500:]}"
        return
    for arg in run.argv:  # a run directory the docs refer to, made as the README makes it
        if arg.startswith("runs/") and not (workdir / arg).exists():
            assert _scaletrain(["train", "--train.steps=2"], workdir).returncode == 0
    proc = finished.get(key) or _scaletrain(run.argv, workdir)
    finished[key] = proc
    assert proc.returncode == 0, (
        f"{cmd.id}\n-> scaletrain {' '.join(run.argv)}\n"
        f"{proc.stdout[-1500:]}\n{proc.stderr[-2500:]}"
    )
    if run.must_fit:
        plan = json.loads(proc.stdout)
        best = plan[0] if isinstance(plan, list) else plan
        assert best["memory"]["fits"], f"{cmd.id}: the planned layout does not fit"


@pytest.mark.parametrize("config", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_fits_its_hardware(config: Path, workdir: Path) -> None:
    if "runs/tiny-hf" in config.read_text() and not (workdir / "runs/tiny-hf").exists():
        # the fine-tuning configs read a local Hugging Face directory the README makes first
        subprocess.run(
            [sys.executable, str(ROOT / "scripts/make_tiny_hf.py"), "runs/tiny-hf"],
            cwd=workdir,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            check=True,
            capture_output=True,
            timeout=600,
        )
    proc = _scaletrain(["plan", "--config", str(config), "--json"], workdir)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    best = plan[0] if isinstance(plan, list) else plan
    mem = best["memory"]
    assert mem["fits"] and mem["reserved"] <= mem["capacity"], (config.name, mem)
