"""Hang watchdog and straggler report on real 2-rank gloo runs: one rank is made slow through
its data source (`--data.delay_s` on that rank only), the other ranks are not."""

from __future__ import annotations

import json
import os

import pytest

from scaletrain.parallel.launch import spawn
from scaletrain.trainer.watchdog import EXIT_CODE

from ._ops_fns import train_with_rank_overrides
from ._trainer_fns import small_job

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TIMEOUT_S = 4.0


@pytest.mark.parametrize("flight_recorder", [True, False], ids=["fr", "stacks"])
def test_watchdog_names_the_rank_stuck_in_a_step(tmp_path, monkeypatch, flight_recorder):
    # with the recorder, rank 1 is found behind its peer's collectives; without it, by where
    # its main thread waits (for data). Either way only rank 1 is named.
    if flight_recorder:
        monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "200")  # read when the group is created
    else:
        monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")  # recorder off (on by default)
    job = small_job(
        tmp_path,
        "run",
        "--parallel.dp=2",
        "--checkpoint.resume=never",
        f"--monitor.watchdog_timeout_s={TIMEOUT_S}",
        "--data.prefetch=0",
    )
    # rank 1's first batch takes 10 minutes: it sleeps inside step 1, rank 0 waits on it
    with pytest.raises(RuntimeError, match=f"exit code {EXIT_CODE}"):
        spawn(train_with_rank_overrides, 2, job, {1: ["--data.delay_s=600"]})
    report = json.loads((tmp_path / "run" / "watchdog" / "report.json").read_text())
    assert report["stuck_ranks"] == [1], report
    assert report["step"] == 1
    # found once the step passed the timeout, within one poll and the evidence grace period
    assert TIMEOUT_S <= report["detected_after_s"] <= TIMEOUT_S + 1.0, report
    assert ("flight recorder" in report["reason"]) == flight_recorder, report
    for r in (0, 1):
        stacks = (tmp_path / "run" / "watchdog" / f"rank{r}_stacks.txt").read_text()
        assert "scaletrain" in stacks and "Thread" in stacks
    assert (
        os.path.exists(tmp_path / "run" / "watchdog" / "rank0_collectives.json") == flight_recorder
    )


def test_straggler_report_names_the_slow_rank(tmp_path):
    job = small_job(
        tmp_path,
        "run",
        "--parallel.dp=2",
        "--checkpoint.resume=never",
        "--monitor.straggler_every=2",
        "--data.prefetch=0",
    )
    # 2 micro-batches per step per rank (global 8 / dp 2 / micro 2): rank 1 waits >= 0.1 s/step
    steps = spawn(train_with_rank_overrides, 2, job, {1: ["--data.delay_s=0.05"]})
    assert steps == [4, 4]
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    gathered = [r for r in records if "stragglers" in r]
    assert [r["step"] for r in gathered] == [2, 4]
    for r in gathered:
        assert r["stragglers"] == [1], r
        assert r["rank_data_wait_s"][1] >= 2 * 0.05 > 10 * r["rank_data_wait_s"][0]
    lines = (tmp_path / "run" / "stragglers.jsonl").read_text().splitlines()
    assert [json.loads(x)["stragglers"] for x in lines] == [[1], [1]]
