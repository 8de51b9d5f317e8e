"""The README's "Fine-tune a Hugging Face model" path: scripts/make_tiny_hf.py, then the two
example configs, trained briefly from the directory the README runs them in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scaletrain.config import load_config
from scaletrain.trainer import train

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts/make_tiny_hf.py"), "runs/tiny-hf"],
        check=True,
        capture_output=True,
        cwd=d,
    )
    return d


@pytest.mark.parametrize("config", ["continue-pretraining", "sft"])
def test_example_configs_train_from_the_tiny_hf_model(config, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    tmp_path = workdir
    job = load_config(
        ROOT / "configs" / f"{config}.toml",
        [
            "--train.steps=2",
            "--train.progress=false",
            "--train.sample_tokens=0",
            "--train.tensorboard=false",
        ],
    )
    assert job.model.vocab_size == 512 and job.checkpoint.init_from == "runs/tiny-hf/model"
    r = train(job)
    assert all(torch.isfinite(torch.tensor(r.losses)))
    if config == "continue-pretraining":  # its held-out set, scored at the last step
        # the same grammar as the corpus (another seed): it scores like the validation split
        assert set(r.eval_losses) == {"heldout"}
        assert r.eval_losses["heldout"] == pytest.approx(r.val_loss, abs=0.1)
    assert (tmp_path / job.train.run_dir / "hf" / "model.safetensors").is_file()
