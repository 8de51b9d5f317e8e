"""A two-node launch on loopback: two `torchrun` agents meet through a c10d rendezvous on
127.0.0.1, each starts one worker running `python -m scaletrain train` with dp 2, and the job
trains. This is the documented multi-node command (README, "Multi-node") with both "nodes" on
this machine: the agents find each other only through the rendezvous endpoint, exactly as two
hosts would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.parallel.launch import free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

STEPS = 2


def _torchrun() -> list[str]:
    exe = shutil.which("torchrun")
    # the module form works in any environment where torch is importable
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def test_two_torchrun_agents_on_loopback_train_dp2(tmp_path):
    port = free_port()
    run_dir = tmp_path / "run"
    train_args = [
        "--model.name=tiny",
        "--batch.seq_len=32",
        "--batch.global_batch=4",
        "--batch.micro_batch=2",
        f"--train.steps={STEPS}",
        "--train.eval_every=1000",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--data.num_tokens=20000",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={run_dir}",
        "--parallel.dp=2",
        "--checkpoint.resume=never",
        "--train.device=cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)  # the agents, not the environment, define the job
    agents = []
    for node in range(2):
        cmd = [
            *_torchrun(),
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "scaletrain-loopback",
            "--max-restarts",
            "0",
            "-m",
            "scaletrain",
            "train",
            *train_args,
        ]
        log = open(tmp_path / f"node{node}.log", "w")  # noqa: SIM115 (closed below)
        agents.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    try:
        rcs = [p.wait(timeout=240) for p, _ in agents]
    finally:
        for p, log in agents:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    logs = "\n".join(
        f"--- node {i}\n{(tmp_path / f'node{i}.log').read_text()[-3000:]}" for i in range(2)
    )
    assert rcs == [0, 0], logs
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["world_size"] == 2 and info["steps"] == STEPS
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(r["loss"] > 0 for r in records)
    assert Path(run_dir / "measurement.json").is_file()
