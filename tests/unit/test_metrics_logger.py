"""`trainer.metrics.MetricsLogger`: metrics.jsonl and TensorBoard carry every number of a step."""

from __future__ import annotations

import json

import pytest

from scaletrain.trainer.metrics import MetricsLogger

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_tensorboard_reads_every_scalar_of_every_step(tmp_path):
    """One event per step (all scalars in one Summary): TensorBoard sees the same tags, steps
    and values as one `add_scalar` per number would give; strings stay out."""
    log = MetricsLogger(tmp_path, total_steps=3, enabled=True, tensorboard=True, progress=False)
    records = [
        {
            "step": s,
            "loss": 3.0 - s / 4,
            "lr": 1e-3 * s,
            "skipped": s == 2,
            "tokens_per_s": 1000 * s,
            "note": "not a number",
        }
        for s in (1, 2, 3)
    ]
    for r in records:
        log.log(r)
    log.close()
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["loss", "lr", "skipped", "tokens_per_s"]
    for tag in ("loss", "lr", "skipped", "tokens_per_s"):
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        want = [(r["step"], pytest.approx(float(r[tag]), rel=1e-7)) for r in records]
        assert got == want, tag
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert rows == records
