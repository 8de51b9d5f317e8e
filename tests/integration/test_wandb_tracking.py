"""W&B logging through a stand-in `wandb` module (the real one is an optional extra and needs
an account or offline mode): what a training run sends it, and when."""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types

import pytest

from scaletrain.config import ConfigError, load_config
from scaletrain.trainer import train

from ..distributed._trainer_fns import small_job


class _FakeRun:
    def __init__(self, **kwargs):
        self.init = kwargs
        self.logged: list[tuple[dict, int]] = []
        self.saved: dict[str, str] = {}
        self.summary: dict = {}
        self.finished = False

    def log(self, data, step):
        self.logged.append((data, step))

    def save(self, path, base_path, policy):
        assert policy == "now" and path.startswith(base_path)
        with open(path) as f:
            self.saved[path[len(base_path) + 1 :]] = f.read()

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    runs: list[_FakeRun] = []
    mod = types.ModuleType("wandb")
    mod.__spec__ = importlib.machinery.ModuleSpec("wandb", None)

    def init(**kwargs):
        runs.append(_FakeRun(**kwargs))
        return runs[-1]

    mod.init = init
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return runs


def test_run_logs_steps_config_plan_and_ledger(tmp_path, fake_wandb):
    job = small_job(
        tmp_path,
        "run",
        "--checkpoint.resume=never",
        "--monitor.wandb=true",
        "--monitor.wandb_project=ops-test",
    )
    result = train(load_config(None, job))
    (run,) = fake_wandb
    run_dir = tmp_path / "run"
    assert run.init["project"] == "ops-test" and run.init["dir"] == str(run_dir)
    assert run.init["id"] == (run_dir / "wandb_id.txt").read_text()  # a requeue resumes it
    assert run.init["resume"] == "allow"
    assert run.init["config"] == json.loads((run_dir / "config.json").read_text())
    assert [s for _, s in run.logged] == [1, 2, 3, 4]
    assert [d["loss"] for d, _ in run.logged] == result.losses
    assert all(isinstance(v, int | float) for d, _ in run.logged for v in d.values())
    plan = json.loads(run.saved["plan.json"])
    assert plan == run.summary["plan"]
    assert (plan["model"], plan["dp"], plan["grad_accum"]) == ("tiny-llama", 1, 4)
    assert run.saved["memory_ledger.txt"] == result.ledger == run.summary["memory_ledger"]
    assert result.ledger and run.finished


def test_wandb_without_the_extra_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails: not installed
    with pytest.raises(ConfigError, match="monitor.wandb .*scaletrain\\[wandb\\]"):
        load_config(None, ["--monitor.wandb=true"])
