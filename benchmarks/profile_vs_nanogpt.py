"""One steady training step of nanoGPT's CPU recipe, nanoGPT against scaletrain, op by op.

Both sides run in this process on one host, so their per-step CPU times compare side by side:

- nanoGPT: its own `model.py` (imported from ../shared/peers/nanoGPT, never copied), its
  `configure_optimizers` (foreach AdamW on CPU), and the body of its `train.py` loop as that file
  runs it with the recipe's flags (see `vs_nanogpt.nanogpt_args`): forward with targets, fetch
  the next batch (a fresh `np.memmap` of train.bin, 12 random windows), backward, clip to 1.0
  with `torch.nn.utils.clip_grad_norm_`, `optimizer.step()`, `zero_grad(set_to_none=True)`,
  `loss.item()` (log_interval=1). Its GradScaler is disabled on CPU (fp32): pass-through.
- scaletrain: the run `python -m scaletrain train` builds from `nanogpt_shakespeare.recipe_args`
  (`build_run`), stepped as the loop steps it: `set_lr`, `train_step`, `apply_update`.

Timing: blocks of `--block` steps, alternating A B A B (`--rounds` times), each step timed by
`time.process_time` (CPU seconds of the whole process: every thread, the prefetch thread
included); the figure is the median per-step time of each side and their ratio to nanoGPT's.
One torch thread by default: on a shared 2-core host two OpenMP threads spin while the other
waits for a core and the per-step times scatter by 5x; one thread measures the work. Neither
side evaluates here. `--variant` adds scaletrain sides with other overrides (A/B of an option);
`--before` takes the json of a run with another source tree (PYTHONPATH) for before/after.

Profile: 5 steady steps of each side under `torch.profiler` (CPU), cut into batch, forward
(with the loss), backward, clip and optimizer (+ zero_grad) by `record_function` ranges; per
range the aten ops per step and their self-CPU time, and the ops one side runs that the other
does not. Written to results/vs_nanogpt_ops.md/json.

    python benchmarks/profile_vs_nanogpt.py [--rounds 40] [--block 5] [--threads 1]
    PYTHONPATH=../main/src python benchmarks/profile_vs_nanogpt.py --out /tmp/before
    python benchmarks/profile_vs_nanogpt.py --before /tmp/before/vs_nanogpt_ops.json \\
        --variant three-linears=--model.fused_qkv=false
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from nanogpt_shakespeare import DATA, recipe_args  # noqa: E402
from scaletrain.config import load_config  # noqa: E402
from scaletrain.config.model import MODEL_FIELDS  # noqa: E402
from scaletrain.trainer.build import build_run  # noqa: E402
from scaletrain.trainer.optim import lr_at, set_lr  # noqa: E402
from scaletrain.trainer.step import StepHooks, apply_update, train_step  # noqa: E402
from vs_nanogpt import PEER  # noqa: E402

RANGES = ("batch", "forward", "backward", "clip", "optimizer")
Step = Callable[[], None]


class _Ranges:
    """Enter/leave `record_function` ranges by name (one open at a time); a no-op unless
    `active` (the timed steps carry no range bookkeeping)."""

    def __init__(self) -> None:
        self.open: Any = None
        self.active = False

    def enter(self, name: str) -> None:
        self.leave()
        if self.active:
            self.open = record_function(f"step::{name}")
            self.open.__enter__()

    def leave(self) -> None:
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None


# --------------------------------------------------------------------------- nanoGPT side


def _nanogpt_model_module() -> Any:
    spec = importlib.util.spec_from_file_location("nanogpt_model", PEER / "model.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def nanogpt_step(scratch: Path, ranges: _Ranges) -> Step:
    """nanoGPT's loop body (train.py) with the recipe's flags, on its own prepared data."""
    data_dir = scratch / "data" / "shakespeare_char"
    data_dir.mkdir(parents=True)
    (data_dir / "input.txt").symlink_to(DATA.resolve())
    (data_dir / "prepare.py").symlink_to(PEER / "data" / "shakespeare_char" / "prepare.py")
    subprocess.run([sys.executable, "prepare.py"], cwd=data_dir, check=True, capture_output=True)
    m = _nanogpt_model_module()
    torch.manual_seed(1337)
    cfg = m.GPTConfig(
        block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False
    )
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        model = m.GPT(cfg)
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    train_bin = str(data_dir / "train.bin")

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        data = np.memmap(train_bin, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - 64, (12,))
        x = torch.stack([torch.from_numpy(data[i : i + 64].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1 : i + 65].astype(np.int64)) for i in ix])
        return x.to("cpu"), y.to("cpu")

    state = {"xy": get_batch()}

    def step() -> None:
        x, y = state["xy"]
        ranges.enter("forward")
        _, loss = model(x, y)
        ranges.enter("batch")
        state["xy"] = get_batch()
        ranges.enter("backward")
        loss.backward()
        ranges.enter("clip")
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        ranges.enter("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        ranges.leave()
        loss.item()

    return step


# ------------------------------------------------------------------------- scaletrain side


class _Hooks(StepHooks):
    def __init__(self, ranges: _Ranges) -> None:
        self.ranges = ranges

    def microbatch(self, k: int) -> contextlib.AbstractContextManager:
        self.ranges.enter("forward")
        return contextlib.nullcontext()

    def event(self, name: str) -> None:
        if name.startswith("loss:"):
            self.ranges.enter("backward")
        elif name == "forward_backward_done":
            self.ranges.enter("clip")


class _Batches(Iterator[Any]):
    def __init__(self, inner: Iterator[Any], ranges: _Ranges) -> None:
        self.inner, self.ranges = inner, ranges

    def __next__(self) -> Any:
        self.ranges.enter("batch")
        return next(self.inner)


def scaletrain_step(scratch: Path, ranges: _Ranges, extra: list[str]) -> Step:
    """The recipe's run, stepped as the training loop steps it."""
    args = recipe_args(str(DATA), 2000, str(scratch / "run"))
    # a source tree from before a model option (`--before` runs) steps without it
    args = [a for a in args if not a.startswith("--model.") or a[8:].split("=")[0] in MODEL_FIELDS]
    job = load_config(None, [*args, f"--data.cache_dir={scratch / 'cache'}", *extra])
    run = build_run(job)
    assert run.data is not None
    batches = _Batches(run.data.train_batches(), ranges)
    hooks = _Hooks(ranges)
    state = {"step": 0}

    def step() -> None:
        set_lr(
            run.optimizer, lr_at(state["step"], optim=job.optim, batch=job.batch, total_steps=2000)
        )
        out = train_step(run, batches, hooks)
        ranges.enter("optimizer")
        apply_update(run, out, hooks)
        ranges.leave()
        state["step"] += 1

    return step


# ------------------------------------------------------------------------------ measuring


def timed_block(step: Step, n: int) -> tuple[list[float], list[float]]:
    cpu, wall = [], []
    for _ in range(n):
        c0, w0 = time.process_time(), time.perf_counter()
        step()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return cpu, wall


def op_table(step: Step, ranges: _Ranges, steps: int) -> dict[str, dict[str, list[float]]]:
    """{range: {aten op: [calls per step, self CPU us per step]}} over `steps` profiled steps
    (every aten op counted, nested ones too: aten::linear and the aten::mm under it)."""
    ranges.active = True
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    ranges.active = False
    table: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for ev in prof.events():
        if not ev.name.startswith("aten::"):
            continue
        parent, where = ev.cpu_parent, "other"
        while parent is not None:
            if parent.name.startswith("step::"):
                where = parent.name[6:]
                break
            parent = parent.cpu_parent
        row = table[where][ev.name]
        row[0] += 1 / steps
        row[1] += ev.self_cpu_time_total / steps
    return {k: dict(v) for k, v in table.items()}


def alternate(sides: dict[str, Step], rounds: int, block: int) -> dict[str, list[float]]:
    """CPU seconds of every timed step of each side, in blocks of `block` steps, A B A B."""
    cpu: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds):
        for name, step in sides.items():
            cpu[name] += timed_block(step, block)[0]
        if (r + 1) % 10 == 0:
            print({k: f"{statistics.median(v) * 1e3:.2f} ms" for k, v in cpu.items()}, flush=True)
    return cpu


def compile_cost(ranges: _Ranges, scratch: Path, rounds: int) -> dict[str, float]:
    """`train.compile=true` (per-block torch.compile) against the recipe as it is: the first 3
    steps' wall and CPU seconds (compile workers included: RUSAGE_CHILDREN), then the steady
    per-step CPU medians, alternating."""

    def cpu_all() -> float:
        a, b = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime

    # a cold compile, as a fresh run's: not inductor's cache from an earlier process
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / "inductor-cache")
    plain = scaletrain_step(scratch / "plain", ranges, [])
    compiled = scaletrain_step(scratch / "compiled", ranges, ["--train.compile=true"])
    timed_block(plain, 3)
    w0, c0 = time.perf_counter(), cpu_all()
    timed_block(compiled, 3)
    first = {"first3_wall_s": time.perf_counter() - w0, "first3_cpu_s": cpu_all() - c0}
    timed_block(compiled, 5)
    cpu = alternate({"plain": plain, "compiled": compiled}, rounds, 5)
    return {**first, **{f"{k}_step_cpu_s": statistics.median(v) for k, v in cpu.items()}}


def _compile_line(c: dict[str, float] | None, steps: int = 2000) -> str:
    if c is None:
        return ""
    gain = c["plain_step_cpu_s"] - c["compiled_step_cpu_s"]
    return (
        f"\n`train.compile=true` (per-block torch.compile): the first 3 steps take "
        f"{c['first3_wall_s']:.1f} s wall, {c['first3_cpu_s']:.1f} s CPU (compile workers "
        f"included); then {c['compiled_step_cpu_s'] * 1e3:.2f} ms CPU per step against "
        f"{c['plain_step_cpu_s'] * 1e3:.2f} ms: {gain * steps:.1f} s over {steps} steps "
        f"for {c['first3_cpu_s']:.1f} s of compilation (an evaluation under no_grad would "
        "compile again): the recipe leaves it off.\n"
    )


def _op_rows(tables: dict[str, dict], a: str, b: str) -> str:
    """Per range: aten ops per step and profiled self CPU of sides a and b."""
    rows = []
    for where in (*RANGES, "other"):
        ta, tb = tables[a].get(where, {}), tables[b].get(where, {})
        na, nb = (sum(c for c, _ in t.values()) for t in (ta, tb))
        ua, ub = (sum(u for _, u in t.values()) / 1e3 for t in (ta, tb))
        rows.append(f"| {where} | {na:.0f} | {nb:.0f} | {ua:.2f} | {ub:.2f} |")
    return "\n".join(rows)


def _only(tables: dict[str, dict], a: str, b: str) -> str:
    """Lines of the ops side `b` runs per range that side `a` does not (or runs fewer of)."""
    out = []
    for where in (*RANGES, "other"):
        ta, tb = tables[a].get(where, {}), tables[b].get(where, {})
        extra = {
            op: cb - ta.get(op, [0, 0])[0]
            for op, (cb, _) in tb.items()
            if cb - ta.get(op, [0, 0])[0] >= 0.5
        }
        if extra:
            ops = ", ".join(f"{op[6:]} +{n:.0f}" for op, n in sorted(extra.items()))
            out.append(f"- {where}: {ops}")
    return "\n".join(out) or "- none"


def _projection(before: dict[str, Any] | None, ratio_after: float) -> str:
    if before is None:
        return ""
    vs = json.loads((Path(__file__).parent / "results" / "vs_nanogpt.json").read_text())
    share = vs["scaletrain_phases_s_median"]["steps"] / sum(
        vs["scaletrain_phases_s_median"].values()
    )
    change = ratio_after / before["step_ratio"]
    projected = vs["median_wall_ratio"] * (1 - share * (1 - change))
    return (
        f"\nBefore (`{before['src']}`): step CPU ratio {before['step_ratio']:.3f}; now "
        f"{ratio_after:.3f}: the step costs {change:.3f}x what it did against the same nanoGPT "
        f"step. Projected on vs_nanogpt.md's median wall ratio "
        f"{vs['median_wall_ratio']:.3f}x, whose steps are {share:.1%} of the run: "
        f"**{projected:.3f}x** (steps only; one thread here, the benchmark inherits two).\n"
    )


def report(
    args: argparse.Namespace,
    tables: dict,
    cpu: dict[str, list[float]],
    compiled: dict[str, float] | None,
) -> None:
    med = {k: statistics.median(v) for k, v in cpu.items()}
    ratio = {k: v / med["nanogpt"] for k, v in med.items()}
    before = json.loads(Path(args.before).read_text()) if args.before else None
    timing = "\n".join(
        f"| {k} | {med[k] * 1e3:.2f} ms | {ratio[k]:.3f}x | {len(cpu[k])} |" for k in med
    )
    md = (
        "One steady step of nanoGPT's CPU recipe (4 layers, 4 heads, 128 wide, context 64, "
        f"batch 12), both in one process, torch threads {torch.get_num_threads()}; see the "
        "module docstring of benchmarks/profile_vs_nanogpt.py for what each side runs.\n\n"
        "CPU time per step (process_time; median over alternating blocks of "
        f"{args.block} steps, {args.rounds} rounds):\n\n"
        "| side | CPU per step | / nanoGPT | steps |\n|---|---|---|---|\n"
        + timing
        + "\n"
        + _projection(before, ratio["scaletrain"])
        + _compile_line(compiled)
        + "\nProfiled (torch.profiler, 5 steps, per step; self CPU inflated by the profiler):"
        "\n\n| range | nanoGPT aten ops | scaletrain aten ops | nanoGPT self CPU ms | "
        "scaletrain self CPU ms |\n|---|---|---|---|---|\n"
        + _op_rows(tables, "nanogpt", "scaletrain")
        + "\n\naten ops scaletrain runs per step beyond nanoGPT's:\n\n"
        + _only(tables, "nanogpt", "scaletrain")
        + "\n\naten ops nanoGPT runs per step beyond scaletrain's:\n\n"
        + _only(tables, "scaletrain", "nanogpt")
        + "\n"
    )
    data = {
        "threads": torch.get_num_threads(),
        "src": str(Path(sys.modules["scaletrain"].__file__ or "").parent),
        "cpu_s_median": med,
        "step_ratio": ratio["scaletrain"],
        "ratios": ratio,
        "ops": tables,
        "variants": args.variant,
        "compile": compiled,
    }
    if args.out:
        _common.RESULTS = Path(args.out)
    _common.write_results("vs_nanogpt_ops", data, md)
    print(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=OVERRIDE[,OVERRIDE]",
        help="another scaletrain side with these overrides (e.g. "
        "three-linears=--model.fused_qkv=false)",
    )
    ap.add_argument("--compile", action="store_true", help="also measure train.compile=true")
    ap.add_argument("--before", default=None, help="vs_nanogpt_ops.json of a run before a change")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ranges = _Ranges()
    with tempfile.TemporaryDirectory(prefix="profile_vs_nanogpt-") as tmp:
        sides = {
            "nanogpt": nanogpt_step(Path(tmp) / "nanogpt", ranges),
            "scaletrain": scaletrain_step(Path(tmp) / "scaletrain", ranges, []),
        }
        for i, v in enumerate(args.variant):
            name, _, overrides = v.partition("=")
            sides[name] = scaletrain_step(Path(tmp) / f"v{i}", ranges, overrides.split(","))
        for step in sides.values():
            timed_block(step, args.warmup)
        tables = {name: op_table(step, ranges, 5) for name, step in sides.items()}
        cpu = alternate(sides, args.rounds, args.block)
        compiled = compile_cost(ranges, Path(tmp), args.rounds // 2) if args.compile else None
    report(args, tables, cpu, compiled)


if __name__ == "__main__":
    main()
