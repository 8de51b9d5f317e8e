"""One measured tokens/s for verify and report (measure/throughput.py)."""

from __future__ import annotations

import json

import pytest

from scaletrain.measure.throughput import step_throughput
from scaletrain.measure.verify import metrics_throughput
from scaletrain.report.data import RunData, _measured_throughput

ROWS = [
    {"step": 1, "tokens_per_s": 10.0, "step_s": 50.0, "mfu": 0.001},
    {"step": 2, "tokens_per_s": 1000.0, "step_s": 0.5, "mfu": 0.1},
    {"step": 3, "tokens_per_s": 50.0, "step_s": 10.0, "mfu": 0.005},
    {"step": 4, "tokens_per_s": 1000.0, "step_s": 0.5, "mfu": 0.1},
]


def test_ratio_of_sums_without_the_first_step() -> None:
    t = step_throughput(ROWS)
    assert t is not None and t.steps == 3
    assert t.tokens_per_s == pytest.approx((500 + 500 + 500) / 11.0)
    assert t.mfu == pytest.approx(t.tokens_per_s * 1e-4)
    assert step_throughput(ROWS[:1]) is None


def test_verify_and_report_show_the_same_figure(tmp_path) -> None:
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS))
    verify = metrics_throughput(tmp_path / "metrics.jsonl")["measured_tokens_per_s"]
    # run_info holds a different figure: the report must still agree with verify
    run = RunData(run_dir=tmp_path, config={}, job=None, info={"tokens_per_s": 1.0}, metrics=ROWS)
    report, _, step_s = _measured_throughput(run)
    assert report == pytest.approx(verify)
    assert step_s == pytest.approx(11.0 / 3)
