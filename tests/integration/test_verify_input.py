"""`scaletrain verify` names a data source too slow for the steps: a run whose loader sleeps
`data.delay_s` per batch with nothing prefetched (each step waits at least that long, a lower
bound the sleep guarantees, against a tiny model's milliseconds of compute)."""

from __future__ import annotations

import json

import pytest

from scaletrain.cli import main
from tests.faults._cli import tiny_job

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def test_verify_names_a_slow_source(tmp_path, capsys):
    source = tmp_path / "slow.txt"
    source.write_text("a slow corpus on a slow disk. " * 2000)
    args = tiny_job(tmp_path, "run", f"--data.source={source}", "--train.steps=3")
    assert main(["train", *args, "--data.delay_s=1.0", "--data.prefetch=0"]) in (0, None)
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    (i,) = [k for k, x in enumerate(lines) if x.startswith("input")]
    assert "loader wait" in lines[i] and "tokens/s per rank" in lines[i]
    assert "the plan needs" in lines[i + 1] and "MB/s per node from storage" in lines[i + 1]
    (note,) = [x for x in out.splitlines() if "the input held the steps" in x]
    assert str(source) in note and "data.delay_s = 1.0" in note
    assert main(["verify", str(tmp_path / "run"), "--json"]) == 0
    time = json.loads(capsys.readouterr().out)["time"]
    assert time["measured_data_wait_s"] >= 1.0 and time["measured_data_wait_share"] > 0.1
