"""The trainer under tp 2 x dp 2 with ZeRO-1 (4 gloo ranks): the same losses as one process,
and a run stopped and resumed from its checkpoint continues as if uninterrupted (each rank's
ZeRO-1 partition holds tensor-parallel states, saved as local shards and re-wrapped)."""

from __future__ import annotations

import pytest

from scaletrain.config import load_config
from scaletrain.parallel.launch import spawn
from scaletrain.trainer import train

from ._trainer_fns import small_job, straight_and_resumed

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_tp_zero1_trains_like_one_process_and_resumes(tmp_path):
    alone = train(load_config(None, small_job(tmp_path / "one", "one"))).losses
    extra = ["--parallel.tp=2", "--parallel.dp=2", "--parallel.zero=1"]
    straight, resumed = spawn(straight_and_resumed, 4, tmp_path / "four", extra, 2)[0]
    # one process vs 4 ranks: the same arithmetic up to the sharded matmuls' rounding
    assert straight == pytest.approx(alone, rel=1e-5, abs=0)
    # stopping and resuming changes nothing: the same ranks redo the same sums
    assert resumed == pytest.approx(straight, rel=1e-6, abs=0)
