"""SIGTERM / SIGINT mid-run: the step finishes, a checkpoint is saved, one line, exit 143/130;
the same command resumes to bitwise-equal final weights."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ._cli import env, scaletrain, tiny_job

STEPS = 30


def _final(run_dir: Path, scratch: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = scratch / f"{run_dir.name}.pt"
    dcp_to_torch_save(str(run_dir / "checkpoints" / f"step_{STEPS:08d}"), str(out))
    return torch.load(out, weights_only=True)


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_exits_one_line_and_resumes_bitwise(tmp_path, sig):
    args = ["--train.steps=" + str(STEPS), "--train.log_every=1"]
    ref = scaletrain("train", *tiny_job(tmp_path, "ref", *args))
    assert ref.returncode == 0, ref.stderr
    cmd = [sys.executable, "-m", "scaletrain", "train", *tiny_job(tmp_path, "run", *args)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env())
    assert p.stdout is not None
    for line in p.stdout:  # signal once training is under way
        if line.lstrip().startswith("step") and "loss" in line:
            p.send_signal(sig)
            break
    out, err = p.communicate(timeout=240)
    assert p.returncode == 128 + sig, (p.returncode, err)
    assert "Traceback" not in out + err
    said = [ln for ln in out.splitlines() if "received" in ln]
    assert len(said) == 1 and signal.Signals(sig).name in said[0]
    saved = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    assert saved and int(saved[-1].name.split("_")[1]) < STEPS
    again = scaletrain("train", *tiny_job(tmp_path, "run", *args))
    assert again.returncode == 0, again.stderr
    a, b = dict(_flat(_final(tmp_path / "ref", tmp_path))), \
        dict(_flat(_final(tmp_path / "run", tmp_path)))
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
