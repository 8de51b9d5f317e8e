"""A rank killed mid-run under `torchrun --max-restarts` resumes from the last good checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.parallel.launch import free_port

pytestmark = [
    pytest.mark.slow, pytest.mark.distributed,
    # Opt-in: on the 2-core CI host the restarted gloo group hung in 1 of 4 runs (workers idle in
    # re-rendezvous until the timeout), which would make CI flaky. Run with
    # SCALETRAIN_FAULT_TESTS=1 (it passed in the other 3 runs, including under heavy load).
    pytest.mark.skipif(os.environ.get("SCALETRAIN_FAULT_TESTS") != "1",
                       reason="opt-in fault-injection test: set SCALETRAIN_FAULT_TESTS=1"),
]


def _args(tmp_path, name):
    return ["--model.name=tiny", "--batch.seq_len=32", "--batch.global_batch=4",
            "--batch.micro_batch=2", "--train.steps=8", "--train.eval_every=1000",
            "--train.sample_tokens=0", "--train.progress=false", "--train.tensorboard=false",
            "--data.num_tokens=60000", f"--data.cache_dir={tmp_path / 'cache'}",
            f"--train.run_dir={tmp_path / name}", "--checkpoint.every=2", "--parallel.dp=2"]


def test_killed_rank_restarts_from_checkpoint_with_identical_losses(tmp_path):
    worker = Path(__file__).with_name("_fault_worker.py")
    marker = tmp_path / "crashed"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           # one restart is needed; a spare absorbs a transient gloo connect failure of the
           # restarted group on a loaded 2-core host (seen once: connection refused)
           "--max-restarts", "2", "--rdzv-backend", "c10d",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(worker), str(marker)]
    _run([*cmd, *_args(tmp_path, "faulty")])
    assert marker.exists()  # the first attempt really died
    # the reference: the same job uninterrupted (the marker exists now, so nobody dies)
    _run([*cmd, *_args(tmp_path, "clean")])
    faulty = (tmp_path / "faulty" / "losses.txt").read_text().split()
    clean = (tmp_path / "clean" / "losses.txt").read_text().split()
    # the restarted attempt trained steps 5..8; they equal the uninterrupted run's exactly
    assert faulty == clean[4:]
    rows = [json.loads(line) for line in (tmp_path / "faulty" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8]


def _run(cmd):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run(cmd, timeout=600, capture_output=True, text=True,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
