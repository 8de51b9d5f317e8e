"""SIGKILL at random moments, resume until done, compare final weights bitwise with a clean run.

Each trial trains the tiny model (fp32, CPU, one process, one thread) for `--steps` steps with a
checkpoint every `--every` steps and `checkpoint.resume=auto`. The run is killed with SIGKILL
one or more times and relaunched until it finishes; its final checkpoint (model + optimizer
state) is then compared tensor by tensor, bitwise (`torch.equal`), with the final checkpoint of
one uninterrupted reference run, and its per-step losses with the reference's.

Kill moments come from a seeded RNG, two kinds:
- `random`: a uniform time into the attempt, over the reference run's whole duration (start-up,
  steps, checkpoint writes, exit);
- `write`: biased to checkpoint writes: one of the saves the attempt has left is drawn, the
  launcher polls for the `.tmp-step_*` directory that write works in and kills a uniform
  0-`--write-jitter-ms` after it appears.
A kill "landed during a checkpoint write" when a `.tmp-step_*` directory is left behind (it exists
only between the start of a write and its atomic rename), whichever kind aimed it.

Lost steps: steps the killed attempt completed (its metrics.jsonl rows) beyond the checkpoint
the next attempt resumed from, i.e. steps computed twice. A kill can land after a step's update
but before its row is written, so the count can be one low per kill.

Relaunches carry TORCHELASTIC_RESTART_COUNT as torchrun's restarts do, so a run killed after
its final checkpoint was published resumes to "done" (a second run directory would be a failure).
Processes are forked from this launcher after it imported torch and scaletrain (the interpreter
start-up cost is paid once); each child sets one intra-op thread first, which also keeps the
arithmetic, hence the bits, identical between runs. `--async-trials N` adds trials with
`checkpoint.async_save=true`, where the write runs in a background thread while training
continues.

`--signal-trials N` adds trials that stop the run with SIGTERM or SIGINT (alternating) instead:
with `checkpoint.every = 0`, so the only checkpoint before the end is the one the signal
handler writes. The signal is sent once a drawn number of steps has been logged; the run must
exit by itself with 128 + signal and one "received" line (no traceback), its newest good
checkpoint must be the step it stopped after (no step lost), and the relaunch must resume
from there and finish bitwise equal to the reference.

`--nproc-trials N` adds trials of `scaletrain train --nproc 2` (the CLI in a subprocess, two
gloo ranks, data parallel, one thread each): SIGINT to the process group (Ctrl-C in a terminal),
SIGTERM to the group, SIGTERM to the launcher alone, in turn, once a drawn number of steps is
logged, with `checkpoint.every = 0`. The launcher forwards the signal to its ranks once
(`parallel.launch.spawn(forward_signals=True)`); a trial passes when the run exits by itself
with 128 + signal and one "received" line, no traceback, its newest good checkpoint is the step
it stopped after, and the same command resumes from there and ends bitwise equal (model +
optimizer state, every step's loss) to one uninterrupted `--nproc 2` run of the same job.

    python benchmarks/kill_resume.py [--trials 24] [--async-trials 8] [--signal-trials 4]
                                     [--nproc-trials 3] [--steps 40] [--every 4]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

MAX_ATTEMPTS = 8
"""A trial that needs more launches than this counts as failed (a resume that cannot finish)."""


def job_args(
    run_dir: Path, cache_dir: Path, *, steps: int, every: int, async_save: bool
) -> list[str]:
    return [
        "--model.name=tiny",
        "--batch.seq_len=32",
        "--batch.global_batch=8",
        "--batch.micro_batch=8",
        f"--train.steps={steps}",
        "--train.eval_every=100000",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--train.device=cpu",
        "--data.num_tokens=60000",
        f"--data.cache_dir={cache_dir}",
        f"--train.run_dir={run_dir}",
        f"--checkpoint.every={every}",
        "--checkpoint.keep_last_n=2",
        f"--checkpoint.async_save={str(async_save).lower()}",
        "--checkpoint.resume=auto",
    ]


def _child(args: list[str], log: Path, restart: int) -> None:
    """In the forked child: train, then leave without running the parent's cleanup."""
    import torch

    # what torchrun --max-restarts tells a restarted worker: resume, even a finished run
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(restart)
    torch.set_num_threads(1)  # deterministic reductions, and no OpenMP pool across the fork
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        # and Python's streams too: under pytest they are capture objects, not fds 1 and 2
        sys.stdout = sys.stderr = open(fd, "w", buffering=1)  # noqa: SIM115
        from scaletrain.config import load_config
        from scaletrain.trainer import train

        train(load_config(None, args))
        code = 0
    except SystemExit as e:  # the signal handler's exit (128 + signal), as the CLI gives it
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported through the log and the exit code
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def launch(args: list[str], log: Path, *, restart: int = 0) -> int:
    pid = os.fork()
    if pid == 0:
        _child(args, log, restart)
    return pid


def _tmp_dirs(run_dir: Path) -> dict[str, int]:
    """Temporary checkpoint directories (writes in progress or torn), name -> inode."""
    d = run_dir / "checkpoints"
    found = {}
    for p in d.glob(".tmp-*") if d.is_dir() else ():
        try:
            found[p.name] = p.stat().st_ino
        except FileNotFoundError:  # renamed into place meanwhile
            continue
    return found


def _new_tmp(now: dict[str, int], stale: dict[str, int]) -> bool:
    """Whether a write of this attempt is in progress (or was torn by the kill): a temporary
    directory that was not left over from an earlier attempt. One recreated under a stale name
    with the same inode is missed, so the count of kills during writes can only be low."""
    return any(stale.get(name) != ino for name, ino in now.items())


def _wait(pid: int) -> int:
    """Exit status of a finished child: its exit code, or -signal."""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _kill_when(pid: int, run_dir: Path, aim: dict[str, Any]) -> int | None:
    """SIGKILL `pid` at the planned moment (None), or its exit code if it exited first.

    aim: {"kind": "random", "delay_s": s} or {"kind": "write", "tmp": name, "jitter_s": s}
    (`jitter_s` after the temporary directory `name` of a write appears)."""
    t0 = time.perf_counter()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if aim["kind"] == "random" and time.perf_counter() - t0 >= aim["delay_s"]:
            break
        if aim["kind"] == "write" and aim["tmp"] in _tmp_dirs(run_dir):
            time.sleep(aim["jitter_s"])
            break
        time.sleep(0.0005)
    os.kill(pid, signal.SIGKILL)
    _wait(pid)
    return None


def _write_target(pick: float, *, start: int, steps: int, every: int, stale: dict[str, int]) -> str:
    """The temporary directory of the save to kill in, drawn (by `pick` in [0, 1)) among the
    saves this attempt will make, except steps whose torn directory is still there (present
    from the start, they would not mark a write)."""
    saves = sorted({s for s in range(every, steps + 1, every)} | {steps})
    left = [s for s in saves if s > start and f".tmp-step_{s:08d}" not in stale] or [steps]
    return f".tmp-step_{left[int(pick * len(left))]:08d}"


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl rows; a row torn by a kill (and the row appended to it) is skipped."""
    path = run_dir / "metrics.jsonl"
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _resume_step(run_dir: Path) -> int:
    from scaletrain.checkpoint import latest_good

    path = latest_good(run_dir / "checkpoints", log=lambda _: None)
    return int(path.name.split("_")[-1]) if path is not None else 0


def run_reference(root: Path, cache: Path, *, steps: int, every: int) -> dict[str, Any]:
    # one step first, so the timed reference does not include building the data cache
    warm = job_args(root / "warmup", cache, steps=1, every=0, async_save=False)
    if _wait(launch([*warm, "--checkpoint.resume=never"], root / "warmup.log")) != 0:
        raise RuntimeError("the warm-up run failed:\n" + (root / "warmup.log").read_text()[-3000:])
    run_dir = root / "reference"
    t0 = time.perf_counter()
    code = _wait(
        launch(
            job_args(run_dir, cache, steps=steps, every=every, async_save=False),
            root / "reference.log",
        )
    )
    if code != 0:
        raise RuntimeError(
            "the reference run failed:\n" + (root / "reference.log").read_text()[-3000:]
        )
    return {"run_dir": run_dir, "wall_s": time.perf_counter() - t0}


def run_trial(
    index: int,
    rng: random.Random,
    root: Path,
    cache: Path,
    *,
    steps: int,
    every: int,
    async_save: bool,
    ref_wall_s: float,
    write_jitter_s: float,
    aims: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One trial: kills planned by `rng` (or given as `aims`), relaunches until the run exits
    by itself."""
    mode = "async" if async_save else "sync"
    run_dir = root / f"trial{index:02d}-{mode}"
    log = root / f"trial{index:02d}-{mode}.log"
    args = job_args(run_dir, cache, steps=steps, every=every, async_save=async_save)
    # one or two kills per trial, two in three aimed at a checkpoint write (which one is drawn
    # when the attempt starts, among the writes it has left)
    drawn = [
        {"kind": "write", "pick": rng.random(), "jitter_s": rng.uniform(0, write_jitter_s)}
        if rng.random() < 2 / 3
        else {"kind": "random", "delay_s": rng.uniform(0, ref_wall_s)}
        for _ in range(rng.choice((1, 2)))
    ]
    plan = [dict(a) for a in aims] if aims is not None else drawn
    row: dict[str, Any] = {
        "trial": index,
        "mode": mode,
        "kills": 0,
        "kills_during_write": 0,
        "resumes": 0,
        "resumed_done": 0,
        "lost_steps": 0,
        "attempts": 0,
        "kind": [],
        "finished": False,
        "error": "",
    }
    t0 = time.perf_counter()
    while row["attempts"] < MAX_ATTEMPTS:
        start = _resume_step(run_dir)
        if row["attempts"]:
            row["resumes"] += 1
            row["resumed_done"] += start >= steps  # killed after its final checkpoint
        row["attempts"] += 1
        rows_before, stale = len(_metrics(run_dir)), _tmp_dirs(run_dir)
        pid = launch(args, log, restart=row["attempts"] - 1)
        if plan:
            aim = plan.pop(0)
            if aim["kind"] == "write":
                aim["tmp"] = _write_target(
                    aim["pick"], start=start, steps=steps, every=every, stale=stale
                )
            code = _kill_when(pid, run_dir, aim)
            if code is None:
                row["kills"] += 1
                row["kind"].append(aim["kind"])
                row["kills_during_write"] += _new_tmp(_tmp_dirs(run_dir), stale)
                done = [r["step"] for r in _metrics(run_dir)[rows_before:]]
                row["lost_steps"] += max(0, max(done, default=start) - _resume_step(run_dir))
                continue
        else:
            code = _wait(pid)
        if code != 0:
            row["error"] = (
                f"attempt {row['attempts']} exited with {code}: " + log.read_text()[-2000:]
            )
            break
        row["finished"] = True
        break
    if Path(f"{run_dir}-2").exists():  # a restart must resume its run, not start another
        row["error"] = row["error"] or "a resume trained again in a new run directory"
    row["wall_s"] = time.perf_counter() - t0
    return row


_STOPPED = re.compile(r"(SIGINT|SIGTERM) received: stopped after step (\d+)")


def run_signal_trial(
    index: int, sig: signal.Signals, rng: random.Random, root: Path, cache: Path, *, steps: int
) -> dict[str, Any]:
    """One trial: `sig` once a drawn number of steps is logged; the run must save and exit by
    itself (128 + sig, one line), and the relaunch must resume from that checkpoint."""
    mode = sig.name.lower()
    run_dir = root / f"trial{index:02d}-{mode}"
    log = root / f"trial{index:02d}-{mode}.log"
    args = job_args(run_dir, cache, steps=steps, every=0, async_save=False)
    after = rng.randint(1, steps - 2)
    row: dict[str, Any] = {
        "trial": index,
        "mode": mode,
        "kills": 0,
        "kills_during_write": 0,
        "resumes": 0,
        "resumed_done": 0,
        "lost_steps": 0,
        "attempts": 1,
        "kind": [f"{sig.name} after {after} steps"],
        "finished": False,
        "error": "",
        "stopped_at": None,
        "resumed_from": None,
    }
    t0 = time.perf_counter()
    pid = launch(args, log)
    code = None
    while code is None and len(_metrics(run_dir)) < after:
        done, status = os.waitpid(pid, os.WNOHANG)
        code = os.waitstatus_to_exitcode(status) if done else None
        time.sleep(0.002)
    if code is None:
        os.kill(pid, sig)
        code = _wait(pid)
    _judge_stop_then_resume(
        row, code, sig, log, run_dir, lambda: _wait(launch(args, log, restart=1))
    )
    row["wall_s"] = time.perf_counter() - t0
    return row


def _judge_stop_then_resume(
    row: dict[str, Any], code: int, sig: int, log: Path, run_dir: Path, resume: Callable[[], int]
) -> None:
    """Fill `row` from a stopped run: the exit code must be 128 + signal with one 'received'
    line and no traceback, and the newest good checkpoint must be the step it stopped after;
    then `resume()` runs the job again and must exit 0."""
    text = log.read_text()
    said = _STOPPED.findall(text)
    logged = max((r["step"] for r in _metrics(run_dir)), default=0)
    saved = _resume_step(run_dir)
    if code != 128 + sig or len(said) != 1 or "Traceback" in text:
        row["error"] = (
            f"exit {code} (want {128 + sig}), {len(said)} 'received' lines: " + text[-1500:]
        )
        return
    row["stopped_at"] = int(said[0][1])
    row["resumed_from"] = saved
    row["lost_steps"] = max(0, logged - saved)
    if saved != row["stopped_at"]:
        row["error"] = (
            f"stopped after step {row['stopped_at']} but the newest good checkpoint is step {saved}"
        )
        return
    row["attempts"] += 1
    row["resumes"] += 1
    code = resume()
    if code != 0:
        row["error"] = f"the resume exited with {code}: " + log.read_text()[-2000:]
    else:
        row["finished"] = True


NPROC = 2
NPROC_AIMS = (("SIGINT", "group"), ("SIGTERM", "group"), ("SIGTERM", "launcher"))
"""What the --nproc trials send, in turn: Ctrl-C to the terminal's group, a scheduler's SIGTERM
to the group, and SIGTERM to the launcher alone (`kill PID`)."""
SRC = Path(__file__).resolve().parents[1] / "src"


def nproc_command(run_dir: Path, cache_dir: Path, *, steps: int) -> list[str]:
    """`scaletrain train --nproc 2` of the job: data parallel over 2 ranks (4 rows each)."""
    args = job_args(run_dir, cache_dir, steps=steps, every=0, async_save=False)
    return [
        sys.executable,
        "-m",
        "scaletrain",
        "train",
        *args,
        "--batch.micro_batch=4",
        "--train.log_every=1",
        f"--nproc={NPROC}",
    ]


def _nproc_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def _popen(cmd: list[str], log: Path) -> subprocess.Popen:
    with log.open("a") as f:  # the child holds its own copy of the descriptor
        return subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=_nproc_env(),
            start_new_session=True,  # its own process group, as a shell job has
        )


def run_nproc_reference(root: Path, cache: Path, *, steps: int) -> dict[str, Any]:
    run_dir, log = root / "reference-nproc", root / "reference-nproc.log"
    t0 = time.perf_counter()
    code = _popen(nproc_command(run_dir, cache, steps=steps), log).wait()
    if code != 0:
        raise RuntimeError(f"the --nproc reference run failed:\n{log.read_text()[-3000:]}")
    return {"run_dir": run_dir, "wall_s": time.perf_counter() - t0}


def run_nproc_signal_trial(
    index: int, aim: tuple[str, str], rng: random.Random, root: Path, cache: Path, *, steps: int
) -> dict[str, Any]:
    """One `--nproc 2` trial: the signal `aim` (name, "group" | "launcher") once a drawn
    number of steps is logged; the run must save and exit by itself, and the same command must
    resume from the checkpoint the stop wrote."""
    sig = signal.Signals[aim[0]]
    mode = f"nproc-{sig.name.lower()}-{aim[1]}"
    run_dir, log = root / f"trial{index:02d}-{mode}", root / f"trial{index:02d}-{mode}.log"
    cmd = nproc_command(run_dir, cache, steps=steps)
    after = rng.randint(1, steps - 2)
    row: dict[str, Any] = {
        "trial": index,
        "mode": mode,
        "kills": 0,
        "kills_during_write": 0,
        "resumes": 0,
        "resumed_done": 0,
        "lost_steps": 0,
        "attempts": 1,
        "kind": [f"{sig.name} to the {aim[1]} after {after} steps"],
        "finished": False,
        "error": "",
        "stopped_at": None,
        "resumed_from": None,
    }
    t0 = time.perf_counter()
    p = _popen(cmd, log)
    while p.poll() is None and len(_metrics(run_dir)) < after:
        time.sleep(0.01)
    if p.poll() is None:
        if aim[1] == "group":
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)
    code = p.wait()
    _judge_stop_then_resume(row, code, sig, log, run_dir, lambda: _popen(cmd, log).wait())
    row["wall_s"] = time.perf_counter() - t0
    return row


def _final_state(run_dir: Path, steps: int, scratch: Path) -> dict[str, Any]:
    """The final checkpoint's model + optimizer tensors (verified first, loaded weights-only)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from scaletrain.checkpoint import verify_checkpoint

    path = run_dir / "checkpoints" / f"step_{steps:08d}"
    reason = verify_checkpoint(path)
    if reason is not None:
        raise RuntimeError(f"{path}: {reason}")
    out = scratch / f"{run_dir.name}.pt"
    dcp_to_torch_save(str(path), str(out))
    state = torch.load(out, weights_only=True)
    out.unlink()
    return state


def _flatten(x: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(x, dict):
        return {k2: v2 for k, v in x.items() for k2, v2 in _flatten(v, f"{prefix}{k}.").items()}
    return {prefix.rstrip("."): x}


def compare(ref: dict[str, Any], got: dict[str, Any]) -> str:
    """'' when every tensor and value is bitwise equal, else the first difference."""
    import torch

    a, b = _flatten(ref), _flatten(got)
    if a.keys() != b.keys():
        return f"keys differ: {sorted(a.keys() ^ b.keys())[:5]}"
    for k in a:
        x, y = a[k], b[k]
        same = torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        if not same:
            return f"{k} differs"
    return ""


def _step_losses(run_dir: Path) -> dict[int, float]:
    """The loss each step ended with (a recomputed step's last record wins)."""
    return {r["step"]: r["loss"] for r in _metrics(run_dir)}


def run_all(
    root: Path,
    *,
    trials: int,
    async_trials: int,
    steps: int,
    every: int,
    seed: int,
    write_jitter_s: float,
    signal_trials: int = 0,
    nproc_trials: int = 0,
) -> dict[str, Any]:
    cache = root / "cache"
    ref = run_reference(root, cache, steps=steps, every=every)
    nproc_ref = run_nproc_reference(root, cache, steps=steps) if nproc_trials else None
    rng = random.Random(seed)
    rows = []
    for i in range(trials + async_trials):
        row = run_trial(
            i,
            rng,
            root,
            cache,
            steps=steps,
            every=every,
            async_save=i >= trials,
            ref_wall_s=ref["wall_s"],
            write_jitter_s=write_jitter_s,
        )
        rows.append(row)
        print(
            f"trial {i:2d} {row['mode']:5s}: kills {row['kills']} "
            f"(during write {row['kills_during_write']}), resumes {row['resumes']}, "
            f"lost steps {row['lost_steps']}, {row['wall_s']:.1f} s"
            + (f"  ERROR {row['error'][:200]}" if row["error"] else ""),
            flush=True,
        )
    for j in range(signal_trials):
        sig = (signal.SIGTERM, signal.SIGINT)[j % 2]
        row = run_signal_trial(trials + async_trials + j, sig, rng, root, cache, steps=steps)
        rows.append(row)
        print(
            f"trial {row['trial']:2d} {row['mode']:7s}: {row['kind'][0]}, stopped after "
            f"step {row['stopped_at']}, resumed from {row['resumed_from']}, "
            f"{row['wall_s']:.1f} s" + (f"  ERROR {row['error'][:200]}" if row["error"] else ""),
            flush=True,
        )
    first = len(rows)
    for j in range(nproc_trials):
        aim = NPROC_AIMS[j % len(NPROC_AIMS)]
        row = run_nproc_signal_trial(first + j, aim, rng, root, cache, steps=steps)
        rows.append(row)
        print(
            f"trial {row['trial']:2d} {row['mode']}: {row['kind'][0]}, stopped after "
            f"step {row['stopped_at']}, resumed from {row['resumed_from']}, "
            f"{row['wall_s']:.1f} s" + (f"  ERROR {row['error'][:200]}" if row["error"] else ""),
            flush=True,
        )
    # all children are done: the launcher may now run torch ops itself
    refs = {False: ref["run_dir"]}
    if nproc_ref is not None:
        refs[True] = nproc_ref["run_dir"]
    ref_states = {k: _final_state(d, steps, root) for k, d in refs.items()}
    ref_losses = {k: _step_losses(d) for k, d in refs.items()}
    for row in rows:
        run_dir = root / f"trial{row['trial']:02d}-{row['mode']}"
        nproc = row["mode"].startswith("nproc")  # compared with the --nproc 2 reference
        diff = row["error"] or ("" if row["finished"] else "did not finish")
        if not diff:
            try:
                diff = compare(ref_states[nproc], _final_state(run_dir, steps, root))
            except (RuntimeError, OSError) as e:
                diff = str(e)
        row["weights_bitwise_equal"] = not diff
        row["losses_equal"] = _step_losses(run_dir) == ref_losses[nproc]
        row["failure"] = diff or ("" if row["losses_equal"] else "per-step losses differ")
        row.pop("error")
    out = {"reference_wall_s": ref["wall_s"], "rows": rows, "summary": summarize(rows)}
    if nproc_ref is not None:
        out["nproc_reference_wall_s"] = nproc_ref["wall_s"]
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "trials": len(rows),
        "failures": sum(bool(r["failure"]) for r in rows),
        "kills": sum(r["kills"] for r in rows),
        "kills_during_write": sum(r["kills_during_write"] for r in rows),
        "resumes": sum(r["resumes"] for r in rows),
        "resumed_done": sum(r["resumed_done"] for r in rows),
        "lost_steps": sum(r["lost_steps"] for r in rows),
        "async_trials": sum(r["mode"] == "async" for r in rows),
        "signal_trials": sum(r["mode"] in ("sigterm", "sigint") for r in rows),
        "nproc_trials": sum(r["mode"].startswith("nproc") for r in rows),
    }


def markdown(result: dict[str, Any], meta: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        "# kill_resume: SIGKILL at random moments, resume, compare final weights bitwise",
        "",
        f"tiny model, fp32 CPU, 1 thread, {meta['steps']} steps, checkpoint every "
        f"{meta['every']}, keep_last_n 2, seed {meta['seed']}; reference (uninterrupted) run "
        f"{result['reference_wall_s']:.1f} s; total {meta['wall_s']:.0f} s.",
        "",
        f"**{s['trials']} trials ({s['async_trials']} with async_save, "
        f"{s.get('signal_trials', 0)} stopped by SIGTERM/SIGINT, {s.get('nproc_trials', 0)} "
        f"under --nproc {NPROC} stopped by SIGINT/SIGTERM), {s['failures']} "
        f"failures**; {s['kills']} SIGKILLs, {s['kills_during_write']} of them landed during a "
        f"checkpoint write; {s['resumes']} resumes ({s['resumed_done']} of a run killed after its "
        f"final checkpoint, which resumes to done); {s['lost_steps']} steps recomputed in all.",
        "",
        "| trial | mode | kill aims | kills | during write | resumes | lost steps | "
        "weights bitwise equal | losses equal | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['trial']} | {r['mode']} | {', '.join(r['kind']) or '-'} | "
            f"{r['kills']} | {r['kills_during_write']} | {r['resumes']} | "
            f"{r['lost_steps']} | {'yes' if r['weights_bitwise_equal'] else 'NO'} | "
            f"{'yes' if r['losses_equal'] else 'NO'} | {r['wall_s']:.1f} |"
        )
    failed = [r for r in result["rows"] if r["failure"]]
    if failed:
        lines += ["", "## Failures", ""]
        lines += [f"- trial {r['trial']}: {r['failure'][:300]}" for r in failed]
    lines += [
        "",
        "Kill aims: `write` = killed 0-"
        f"{meta['write_jitter_ms']:.0f} ms after a checkpoint's temporary directory "
        "appeared; `random` = uniform time into the attempt. A kill counts as during a "
        "write when it left a `.tmp-step_*` directory behind. Lost steps = steps the "
        "killed attempt had logged beyond the checkpoint the next attempt resumed from.",
        "",
        "Signal trials (`sigterm`, `sigint`): `checkpoint.every = 0`, the signal sent "
        "once the drawn number of steps was logged; passed when the run exited by itself "
        "with 128 + signal and one 'received' line, its newest good checkpoint was the "
        "step it stopped after, and the relaunch finished bitwise equal to the reference.",
    ]
    if s.get("nproc_trials"):
        lines += [
            "",
            f"--nproc trials (`nproc-*`): `scaletrain train --nproc {NPROC}` in a subprocess "
            "(two gloo ranks, data parallel, micro-batch 4 each), `checkpoint.every = 0`, the "
            "signal sent to the process group (`group`, as Ctrl-C or a scheduler does) or to "
            "the launcher alone (`launcher`) once the drawn number of steps was logged; passed "
            "under the same conditions as the signal trials, compared bitwise with one "
            f"uninterrupted --nproc {NPROC} run of the same job "
            f"({result['nproc_reference_wall_s']:.1f} s).",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24, help="trials with synchronous saves")
    ap.add_argument(
        "--async-trials", type=int, default=8, help="further trials with checkpoint.async_save=true"
    )
    ap.add_argument(
        "--signal-trials",
        type=int,
        default=4,
        help="further trials stopped by SIGTERM / SIGINT (alternating)",
    )
    ap.add_argument(
        "--nproc-trials",
        type=int,
        default=3,
        help=f"further trials of `train --nproc {NPROC}` stopped by SIGINT/SIGTERM to the "
        "group, SIGTERM to the launcher (in turn)",
    )
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--write-jitter-ms",
        type=float,
        default=150.0,
        help="write-aimed kills land 0-this after the write starts (a tiny-model "
        "write with its checksums takes ~50-200 ms here)",
    )
    ap.add_argument("--no-write", action="store_true", help="print only (smoke tests)")
    a = ap.parse_args(argv)
    import torch  # noqa: F401 - imported once here, shared by every forked run

    import scaletrain.trainer  # noqa: F401

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kill_resume-") as tmp:
        result = run_all(
            Path(tmp),
            trials=a.trials,
            async_trials=a.async_trials,
            steps=a.steps,
            every=a.every,
            seed=a.seed,
            write_jitter_s=a.write_jitter_ms / 1000,
            signal_trials=a.signal_trials,
            nproc_trials=a.nproc_trials,
        )
    meta = {
        "steps": a.steps,
        "every": a.every,
        "seed": a.seed,
        "write_jitter_ms": a.write_jitter_ms,
        "wall_s": time.perf_counter() - t0,
        "load_average": os.getloadavg(),
    }
    md = markdown(result, meta)
    print(md)
    if not a.no_write:
        write_results("kill_resume", {"meta": meta, **result}, md)
    return 1 if result["summary"]["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
