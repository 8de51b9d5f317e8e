"""The report's "Stragglers and hangs" section from metrics.jsonl records and the watchdog's
report, as the loop and the watchdog write them."""

from __future__ import annotations

import json

from scaletrain.report.data import RunData
from scaletrain.report.health import health_section


def _run(tmp_path, metrics):
    return RunData(run_dir=tmp_path, config={}, job=None, metrics=metrics)


def test_no_reports_no_stragglers_and_a_straggler(tmp_path):
    assert "No straggler report" in health_section(_run(tmp_path, [{"step": 1}]))
    ok = {"step": 2, "stragglers": [], "rank_step_s": [1.0, 1.0], "rank_data_wait_s": [0, 0]}
    assert "No straggler in 1 report(s)" in health_section(_run(tmp_path, [ok]))
    slow = {
        "step": 4,
        "stragglers": [1],
        "rank_step_s": [1.0, 1.25],
        "rank_data_wait_s": [0.001, 0.5],
    }
    text = health_section(_run(tmp_path, [ok, slow]))
    assert "Stragglers in 1 of 2 report(s)" in text
    assert "<td>4</td><td>1</td><td>1.000 / 1.250</td><td>0.001 / 0.500</td>" in text
    assert "No hang" in text


def test_watchdog_report_is_shown(tmp_path):
    (tmp_path / "watchdog").mkdir()
    line = "scaletrain watchdog: step 9 hung for 950 s (limit 900 s): stuck rank(s) 3 (<data>)"
    (tmp_path / "watchdog" / "report.json").write_text(json.dumps({"line": line}))
    text = health_section(_run(tmp_path, []))
    assert '<p class="alert">' in text and "stuck rank(s) 3 (&lt;data&gt;)" in text
