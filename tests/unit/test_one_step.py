"""One trainer step: the dry-run drives the trainer's own build and step, no copy of it.

- the events a real run's `train_step` + `apply_update` emit are the events the dry-run's
  timeline records for the same job (a hook the trainer runs and the dry-run does not, or the
  other way round, fails here);
- nothing under `scaletrain.dryrun` runs a forward, a loss, a backward or an optimizer step of
  its own (AST check), and `src/` patches none of its own functions;
- packages import each other one way only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scaletrain.config import load_config
from scaletrain.dryrun import dryrun
from scaletrain.trainer.build import build_run
from scaletrain.trainer.step import StepHooks, apply_update, train_step

SRC = Path(__file__).resolve().parents[2] / "src" / "scaletrain"
STEP_EVENTS = ("loss:", "backward_done:", "optimizer_step", "zero_grad")


class _Recorder(StepHooks):
    def __init__(self) -> None:
        self.events: list[str] = []

    def event(self, name: str) -> None:
        self.events.append(name)


def _job(tmp_path, **parallel):
    return load_config(
        None,
        {
            "model": {"name": "tiny"},
            "parallel": parallel,
            "batch": {"seq_len": 32, "micro_batch": 2, "global_batch": 4},
            "data": {"num_tokens": 20000, "cache_dir": str(tmp_path / "cache")},
            "train": {"run_dir": str(tmp_path / "run"), "device": "cpu"},
            "hardware": {"gpu": "cpu"},
        },
    )


def test_dry_run_step_emits_the_trainer_step_events(tmp_path):
    job = _job(tmp_path)
    run = build_run(job)
    rec = _Recorder()
    out = train_step(run, run.data.train_batches(), rec)
    apply_update(run, out, rec)
    run.data.close()
    real = [e for e in rec.events if e.startswith(STEP_EVENTS)]
    m = dryrun(job, world_size=1, count_flops=False)
    fake = [name for name, _ in m.timeline if name.startswith(STEP_EVENTS)]
    assert real == [
        "loss:0",
        "backward_done:0",
        "loss:1",
        "backward_done:1",
        "optimizer_step",
        "zero_grad",
    ]
    assert fake == real


def _calls(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            out.add(node.func.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            out.add(node.func.id)
    return out


def test_dry_run_has_no_step_of_its_own():
    called = set()
    for f in (SRC / "dryrun").glob("*.py"):
        called |= _calls(ast.parse(f.read_text()))
    assert {"train_step", "apply_update", "build_run"} <= called
    # the stage calls in torch_compat.ActionSchedule are torch's PipelineStage methods
    assert not called & {
        "backward",
        "causal_lm_loss",
        "moe_aux_loss",
        "clip_grad_norm_",
        "parallelize",
        "materialize",
        "build_optimizer",
        "build_model",
    }


def test_profiler_has_no_step_of_its_own():
    """The profiler used to copy `apply_update`'s body (issue 34): it calls the step's two
    functions, and neither the optimizer, the loss scaler nor zero_grad directly."""
    called = set()
    for f in (SRC / "profile").glob("*.py"):
        called |= _calls(ast.parse(f.read_text()))
    assert {"train_step", "apply_update", "build_run"} <= called
    assert not called & {"zero_grad", "clip_grad_norm_", "backward"}
    text = (SRC / "profile" / "driver.py").read_text()
    assert "optimizer.step(" not in text and "scaler.update(" not in text


def test_src_patches_none_of_its_own_functions():
    """The one patch left in src/ is torch's own ModTracker hook (dryrun/torch_compat.py,
    pinned to the torch version there); none of scaletrain's functions is replaced."""
    for f in SRC.rglob("*.py"):
        text = f.read_text()
        if "mock.patch" in text or "unittest import mock" in text:
            assert f.name == "torch_compat.py", f
            assert "patch.object(mod_tracker," in text
            assert text.count("patch.object(") == 1, f


def _package_imports() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for f in SRC.rglob("*.py"):
        rel = f.relative_to(SRC)
        pkg = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for node in ast.walk(ast.parse(f.read_text())):
            mods = []
            if isinstance(node, ast.ImportFrom) and node.level:
                base = list(rel.parts[:-1])[: len(rel.parts) - node.level]
                mods.append(".".join(base + ([node.module] if node.module else [])))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scaletrain."):
                mods.append(node.module[len("scaletrain.") :])
            elif isinstance(node, ast.Import):
                mods += [
                    a.name[len("scaletrain.") :]
                    for a in node.names
                    if a.name.startswith("scaletrain.")
                ]
            for m in mods:
                target = m.split(".")[0] if m else pkg
                if target and target != pkg:
                    edges.setdefault(pkg, set()).add(target)
    return edges


def test_packages_import_each_other_one_way():
    edges = _package_imports()
    assert "trainer" in edges.get("dryrun", set())  # the dry-run drives the trainer
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path, node, nxt]))
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for pkg in sorted(edges):
        if pkg not in state:
            visit(pkg, [])


def test_the_planner_packages_import_no_module_cycle():
    """`planner.search` and `planner.report` (now `planner.output.report`) used to import each
    other."""
    text = (SRC / "planner" / "search" / "layouts.py").read_text()
    assert "..output" not in text and "planner.output" not in text
