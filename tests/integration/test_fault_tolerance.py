"""A rank killed mid-run under `torchrun --max-restarts=1` resumes from the last good checkpoint.

The restart used to fail (gloo "connection refused") or hang: torchrun's agent keeps one TCPStore
for every attempt, so the restarted group read the killed attempt's gloo addresses. The unit
tests below pin the fix (`attempt_store`: a fresh key namespace per attempt) on an in-process
store with threads as ranks; the end-to-end test kills a real worker (and delays the restarted
rank 1, which made the unfixed restart fail every time).
"""

import datetime
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from scaletrain.parallel.launch import attempt_store
from scaletrain.trainer import loop

_COUNTER = "scaletrain/attempt"


class _Rank(threading.Thread):
    """One rank's `attempt_store` on a thread; `.store` is its result (or `.error`)."""

    def __init__(self, store, rank, world_size, timeout_s=60.0):
        super().__init__(daemon=True)
        self.args = (store, rank, world_size, datetime.timedelta(seconds=timeout_s))
        self.store = self.error = None

    def run(self):
        try:
            self.store = attempt_store(*self.args, poll_s=0.005)
        except BaseException as e:  # surfaced by the test
            self.error = e


def _launch(store, world_size, *, first=None):
    """Every rank of one launch; `first` starts (and is seen waiting) before the others."""
    ranks = [_Rank(store, r, world_size) for r in range(world_size)]
    if first is not None:
        ranks[first].start()
        ranks[first].join(0.3)
        # it cannot finish alone: rank 0 must open the attempt and every rank must join it
        assert ranks[first].is_alive()
    for r in ranks:
        if not r.is_alive() and r.store is None:
            r.start()
    for r in ranks:
        r.join(60)
        assert r.error is None and r.store is not None
    return [r.store for r in ranks]


def _namespace(base, stores, key):
    """The attempt number every rank's store writes under (all must agree)."""
    for i, s in enumerate(stores):
        s.set(f"{key}/{i}", "x")
    n = base.add(_COUNTER, 0)
    assert all(base.check([f"{_COUNTER}/{n}/{key}/{i}"]) for i in range(len(stores)))
    return n


@pytest.mark.parametrize("world_size", [2, 3])
def test_restart_after_finished_attempt_gets_a_fresh_namespace(world_size):
    base = dist.HashStore()
    assert _namespace(base, _launch(base, world_size), "a") == 1
    # the restarted rank 1 arrives first and sees attempt 1's keys: it must not join them
    assert _namespace(base, _launch(base, world_size, first=1), "b") == 2
    assert _namespace(base, _launch(base, world_size, first=world_size - 1), "c") == 3


def test_restart_after_attempt_whose_rank_died_before_joining():
    base = dist.HashStore()
    opener = _Rank(base, 0, 2, timeout_s=0.2)  # attempt 1: rank 1 never shows up
    opener.run()
    assert isinstance(opener.error, TimeoutError)
    # the restarted rank 1 may claim the dead attempt 1, but moves on to the one rank 0 opens
    stores = _launch(base, 2, first=1)
    assert _namespace(base, stores, "k") == 2


def test_keys_of_different_attempts_do_not_collide():
    base = dist.HashStore()
    first = _launch(base, 2)
    first[1].set("gloo/addr", "dead peer")
    second = _launch(base, 2, first=0)
    assert not second[0].check(["gloo/addr"])
    assert first[0].get("gloo/addr") == b"dead peer"


# ------------------------------------------------------------------------------------------------
# end to end: torchrun, a killed worker, one restart
# ------------------------------------------------------------------------------------------------


def _args(tmp_path, name):
    return [
        "--model.name=tiny",
        "--batch.seq_len=32",
        "--batch.global_batch=4",
        "--batch.micro_batch=2",
        "--train.steps=8",
        "--train.eval_every=1000",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--data.num_tokens=60000",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / name}",
        "--checkpoint.every=2",
        "--parallel.dp=2",
    ]


@pytest.mark.slow
@pytest.mark.distributed
def test_killed_rank_restarts_from_checkpoint_with_identical_losses(tmp_path):
    worker = Path(__file__).with_name("_fault_worker.py")
    marker = tmp_path / "crashed"
    # --standalone: the rendezvous store binds port 0 itself (no free_port() race with other
    # tests); exactly one restart is allowed, so a flaky restart fails the test
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        str(worker),
        str(marker),
    ]
    _run([*cmd, *_args(tmp_path, "faulty")])
    assert marker.read_text() == "crashed once"  # the first attempt really died
    # the reference: the same job uninterrupted (the marker exists now, so nobody dies)
    _run([*cmd, *_args(tmp_path, "clean")])
    faulty = (tmp_path / "faulty" / "losses.txt").read_text().split()
    clean = (tmp_path / "clean" / "losses.txt").read_text().split()
    # the restarted attempt trained steps 5..8; they equal the uninterrupted run's exactly
    assert faulty == clean[4:]
    assert len(clean) == 8
    rows = [json.loads(line) for line in (tmp_path / "faulty" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8]
    # which attempt finished each run (written by the worker's rank 0)
    assert (tmp_path / "faulty" / "attempt.txt").read_text() == "1"
    assert (tmp_path / "clean" / "attempt.txt").read_text() == "0"


def _run(cmd):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run(
        cmd, timeout=600, capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


# ------------------------------------------------------------------------------------------------
# the CUDA memory snapshot of the measured step (loop._memory_snapshot); no GPU on CI, so the CUDA
# branch runs against stand-ins for torch's recorder to check the calls and the file it names
# ------------------------------------------------------------------------------------------------


def _fake_run(tmp_path, device):
    return SimpleNamespace(
        device=torch.device(device), run_dir=tmp_path / "run", env=SimpleNamespace(rank=1)
    )


def _recorder(monkeypatch):
    calls = []
    monkeypatch.setattr(
        torch.cuda.memory,
        "_record_memory_history",
        lambda enabled="all", **kw: calls.append(("record", enabled)),
    )
    monkeypatch.setattr(
        torch.cuda.memory,
        "_dump_snapshot",
        lambda path: (calls.append(("dump", path)), Path(path).write_text("x")),
    )
    return calls


def test_memory_snapshot_is_a_no_op_on_cpu(tmp_path, monkeypatch):
    calls = _recorder(monkeypatch)
    with loop._memory_snapshot(_fake_run(tmp_path, "cpu"), enabled=True) as path:
        pass
    assert path is None and calls == [] and not (tmp_path / "run").exists()


def test_memory_snapshot_on_cuda_records_one_step_and_dumps_per_rank(tmp_path, monkeypatch):
    calls = _recorder(monkeypatch)
    run = _fake_run(tmp_path, "cuda:0")
    with loop._memory_snapshot(run, enabled=False) as path:  # not the measured step
        assert path is None
    assert calls == []
    with pytest.raises(torch.OutOfMemoryError), loop._memory_snapshot(run, enabled=True) as path:
        assert calls == [("record", "all")]
        raise torch.OutOfMemoryError("the step ran out")  # dumped anyway: when it matters most
    expected = tmp_path / "run" / "memory_snapshot_rank1.pickle"
    assert path == expected and expected.exists()
    assert calls == [("record", "all"), ("dump", str(expected)), ("record", None)]
