"""scripts/slurm/train.sbatch run by bash in a fake 2-node x 8-GPU allocation: `scontrol` and
`srun` are stubs on PATH that record their arguments, so the exact launch line is checked, and
the time-limit signal (USR1) is checked to requeue the job and stop the step."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from scaletrain.cli import train as cli_train
from scaletrain.config import parse_overrides
from scaletrain.parallel.launch import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm" / "train.sbatch"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

SCONTROL = """#!/bin/bash
echo "$*" >> "$STUB_LOG/scontrol.log"
if [[ "$1 $2" == "show hostnames" ]]; then printf 'gpu-a17\\ngpu-a18\\n'; fi
"""
SRUN = """#!/bin/bash
printf '%s\\n' "$@" > "$STUB_LOG/srun.args"
trap 'echo terminated > "$STUB_LOG/srun.term"; exit 143' TERM
if [[ -n "${STUB_SRUN_SLEEP:-}" ]]; then
    touch "$STUB_LOG/srun.started"
    for _ in $(seq 100); do sleep 0.1; done
fi
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name, body in (("scontrol", SCONTROL), ("srun", SRUN)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        PATH=f"{stubs}:{env['PATH']}",
        STUB_LOG=str(tmp_path),
        SLURM_JOB_NODELIST="gpu-a[17-18]",
        SLURM_JOB_NUM_NODES="2",
        SLURM_JOB_ID="4242",
        SLURM_GPUS_ON_NODE="8",
        RUN_DIR=str(tmp_path / "run"),
    )
    env.update(extra)
    return env


def test_two_nodes_eight_gpus_launch_line(tmp_path):
    args = ["configs/plan.toml", "--train.steps=20000"]
    done = subprocess.run(
        ["bash", str(SCRIPT), *args], env=_env(tmp_path), timeout=60, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "srun.args").read_text().splitlines()
    assert argv == [
        "--nodes=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "torchrun",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=gpu-a17:29500",
        "--rdzv-id=4242",
        "--max-restarts=0",
        "-m",
        "scaletrain",
        "train",
        "configs/plan.toml",
        "--train.steps=20000",
        f"--train.run_dir={tmp_path / 'run'}",
        "--checkpoint.resume=auto",
        "--train.progress=false",
    ]
    assert "show hostnames gpu-a[17-18]" in (tmp_path / "scontrol.log").read_text()
    assert (tmp_path / "run").is_dir()
    # what torchrun hands to `scaletrain train` is a valid command line for it
    parser = argparse.ArgumentParser()
    cli_train.add_arguments(parser, "train")
    ns, extra = parser.parse_known_args(argv[argv.index("train") + 1 :])
    assert ns.config == "configs/plan.toml"
    assert extra == argv[argv.index("train") + 2 :]
    assert parse_overrides(extra) == {
        "train": {"steps": "20000", "run_dir": str(tmp_path / "run"), "progress": "false"},
        "checkpoint": {"resume": "auto"},
    }


def test_container_image_goes_through_pyxis(tmp_path):
    env = _env(tmp_path, CONTAINER_IMAGE="registry/scaletrain:cu", GPUS_PER_NODE="4")
    subprocess.run(["bash", str(SCRIPT)], env=env, timeout=60, check=True, capture_output=True)
    argv = (tmp_path / "srun.args").read_text().splitlines()
    assert argv[:2] == [
        "--container-image=registry/scaletrain:cu",
        f"--container-mounts={tmp_path / 'run'}:{tmp_path / 'run'}",
    ]
    assert "--nproc-per-node=4" in argv


def test_missing_run_dir_is_one_clear_line(tmp_path):
    env = _env(tmp_path)
    del env["RUN_DIR"]
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, timeout=60, capture_output=True, text=True
    )
    assert done.returncode != 0 and "set RUN_DIR" in done.stderr
    assert not (tmp_path / "srun.args").exists()


def test_time_limit_signal_requeues_and_stops_the_step(tmp_path):
    proc = subprocess.Popen(
        ["bash", str(SCRIPT)],
        env=_env(tmp_path, STUB_SRUN_SLEEP="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "srun.started").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 delivers
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "requeue 4242" in (tmp_path / "scontrol.log").read_text()
    assert (tmp_path / "srun.term").read_text().strip() == "terminated"
    assert proc.returncode == 143 and "requeueing job 4242" in out


EXEC_SRUN = """#!/bin/bash
# a one-node srun: drop srun's own options, run the task here
while [[ "$1" == --* ]]; do shift; done
exec "$@"
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_the_launch_line_trains_on_one_fake_node(tmp_path):
    """The script's real torchrun line, run on this host as a 1-node allocation with 2 CPU
    workers (gloo, dp 2): the job trains and `scaletrain status` reads it as finished."""
    import json
    import sys

    env = _env(
        tmp_path,
        SLURM_JOB_NUM_NODES="1",
        SLURM_JOB_NODELIST="localhost",
        GPUS_PER_NODE="2",
        RDZV_PORT=str(free_port()),
    )
    (tmp_path / "bin" / "srun").write_text(EXEC_SRUN)
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\n")
    if shutil.which("torchrun") is None:  # the module form, where only python is on PATH
        (tmp_path / "bin" / "torchrun").write_text(
            f'#!/bin/bash\nexec {sys.executable} -m torch.distributed.run "$@"\n'
        )
        (tmp_path / "bin" / "torchrun").chmod(0o755)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    args = [
        "--model.name=tiny",
        "--batch.seq_len=32",
        "--batch.global_batch=4",
        "--batch.micro_batch=2",
        "--train.steps=2",
        "--train.sample_tokens=0",
        "--train.tensorboard=false",
        "--data.num_tokens=20000",
        f"--data.cache_dir={tmp_path / 'cache'}",
        "--parallel.dp=2",
        "--train.device=cpu",
    ]
    done = subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, timeout=300, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert (info["steps"], info["world_size"]) == (2, 2)
    assert sorted(p.name for p in (tmp_path / "run" / "heartbeat").iterdir()) == [
        "rank0.json",
        "rank1.json",
    ]
    from scaletrain.report.status import run_status

    assert run_status(tmp_path / "run").state == "finished"
