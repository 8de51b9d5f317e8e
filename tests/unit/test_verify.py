"""`scaletrain verify`: predicted vs measured on a synthetic run directory."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from scaletrain.config import ConfigError, JobConfig, load_config
from scaletrain.measure.schema import Measurement
from scaletrain.measure.verify import compare, job_from_dict, metrics_throughput, verify_run
from scaletrain.planner.types import MemoryBreakdown


def _measurement(**kw) -> Measurement:
    mem = MemoryBreakdown(
        params=100.0,
        grads=100.0,
        optimizer=200.0,
        activations=50.0,
        buffers=50.0,
        total=500.0,
        rank=0,
        buffer_terms={"temp": 50.0},
    )
    return Measurement(
        source="cpu", rank=0, world_size=1, memory=mem, flops=1e9, plan={"model": "gpt-mini"}, **kw
    )


def test_measurement_json_round_trip(tmp_path):
    m = _measurement(timeline=[("fw_pre:model", 10)], tokens_per_s=12.5)
    path = m.write(tmp_path)
    assert path.name == "measurement.json"
    back = Measurement.read(tmp_path)
    assert back.to_json() == m.to_json()
    assert back.memory.buffer_terms == {"temp": 50.0}
    with pytest.raises(ValueError, match="source"):
        Measurement(source="tpu", rank=0, world_size=1, memory=MemoryBreakdown())


def test_compare_relative_errors():
    predicted = MemoryBreakdown(
        params=110.0, grads=90.0, optimizer=200.0, activations=100.0, buffers=60.0, total=560.0
    )
    estimate = SimpleNamespace(
        memory=predicted, tokens_per_s=1000.0, time=SimpleNamespace(step_s=2.0)
    )
    c = compare(_measurement(), estimate)
    assert c.rel_error["params"] == pytest.approx(0.1)
    assert c.rel_error["grads"] == pytest.approx(-0.1)
    assert c.rel_error["activations"] == pytest.approx(1.0)
    assert c.rel_error["reserved"] is None  # measured 0: no relative error
    assert c.time["predicted_tokens_per_s"] == 1000.0
    assert compare(_measurement(), None).predicted is None


def test_metrics_throughput_skips_the_first_step(tmp_path):
    rows = [
        {"step": 1, "tokens_per_s": 1.0, "step_s": 9.0},
        {"step": 2, "tokens_per_s": 100.0, "step_s": 1.0},
        {"event": "eval"},
        {"step": 3, "tokens_per_s": 300.0, "step_s": 3.0},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    # tokens / seconds of the timed steps (100*1 + 300*3) / 4, not the mean of the rates (200)
    assert metrics_throughput(path) == {"measured_tokens_per_s": 250.0, "measured_step_s": 2.0}
    assert metrics_throughput(tmp_path / "missing.jsonl") == {}


def test_job_from_dict_round_trips_a_trainer_config():
    job = load_config(None, {"model": {"name": "gpt-mini"}, "batch": {"seq_len": 64}})
    back = job_from_dict(json.loads(json.dumps(job.to_dict())))
    assert back.to_dict() == job.to_dict()


def _run_dir(tmp_path):
    job = JobConfig()
    (tmp_path / "config.json").write_text(json.dumps(job.to_dict()))
    _measurement().write(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps({"step": s, "tokens_per_s": t, "step_s": 1.0})
            for s, t in ((1, 5.0), (2, 40.0))
        )
    )
    return tmp_path


def test_verify_run_dir(tmp_path):
    measurement, comparison, job = verify_run(_run_dir(tmp_path))
    assert job.model.name == "gpt-mini"
    assert comparison.measured["total"] == 500.0
    assert comparison.time["measured_tokens_per_s"] == 40.0
    if comparison.predicted is not None:  # the planner's estimate, when it exists
        assert set(comparison.rel_error) == set(comparison.measured)


def test_verify_cli(tmp_path, capsys):
    from scaletrain.cli import main

    run = _run_dir(tmp_path)
    assert main(["verify", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"plan", "measured", "predicted", "rel_error", "time"} <= set(out)
    assert main(["verify", str(run)]) == 0
    assert "activations" in capsys.readouterr().out
    (run / "measurement.json").unlink()
    with pytest.raises(ConfigError, match="measurement.json"):
        verify_run(run)


def test_from_live_cuda_and_cpu():
    live = {
        "params": 10,
        "grads": 10,
        "optimizer": 20,
        "activations": 5,
        "peak_allocated": 60,
        "peak_reserved": 80,
    }
    m = Measurement.from_live(live, device_type="cuda", rank=1, world_size=2, plan={})
    assert (m.source, m.memory.total, m.memory.buffers, m.memory.reserved) == ("cuda", 60, 15, 80)
    cpu = Measurement.from_live(
        {"params": 10, "peak_rss": 999},
        device_type="cpu",
        rank=0,
        world_size=1,
        plan={},
        tokens_per_s=3.0,
    )
    assert (cpu.source, cpu.memory.total, cpu.memory.detail["rss"]) == ("cpu", 10, 999)


def test_live_runs_compare_resident_state_and_one_micro_batch():
    """A live run measures resident state and one micro-batch's saved bytes; the planner's
    peak-moment categories carry in-flight copies and (pipelining) several micro-batches: the
    comparison takes those out for live runs, and leaves a dry-run's peak comparison alone."""
    predicted = MemoryBreakdown(
        params=130.0,
        grads=110.0,
        optimizer=200.0,
        activations=100.0,
        buffers=60.0,
        total=600.0,
        detail={"params.in_flight": 30.0, "grads.in_flight": 10.0, "activations.in_flight": 2.0},
    )
    estimate = SimpleNamespace(memory=predicted, tokens_per_s=1.0, time=SimpleNamespace(step_s=1.0))
    live = compare(_measurement(), estimate)
    assert live.predicted["params"] == 100.0 and live.rel_error["params"] == 0.0
    assert live.predicted["grads"] == 100.0 and live.predicted["activations"] == 50.0
    assert live.predicted["total"] == 450.0  # CPU: the sum of the four, as measured
    assert any("live run" in n for n in live.notes)
    dry = _measurement()
    dry.source = "dryrun"
    peak = compare(dry, estimate)
    assert peak.predicted["params"] == 130.0 and peak.predicted["total"] == 600.0


def test_input_line_holds_the_loader_wait_against_the_plan(tmp_path):
    from scaletrain.measure.input_check import SLOW_SHARE, input_check
    from scaletrain.planner import estimate
    from scaletrain.planner.types import plan_input_from_job

    job = load_config(
        None,
        ["--data.prefetch=0", "--batch.global_batch=8", "--batch.micro_batch=4"]
        + ["--batch.seq_len=64"],
    )
    est = estimate(plan_input_from_job(job, job.layout(2)))

    def rows(wait):  # the first step (which starts the loader) is not timed
        return [{"step": 1, "tokens_per_s": 1.0, "step_s": 9.0, "data_wait_s": 9.0}] + [
            {"step": s, "tokens_per_s": 256.0, "step_s": 1.0, "data_wait_s": wait} for s in (2, 3)
        ]

    fig, notes = input_check(job, est, rows(0.02), dp=2)
    assert fig["measured_data_wait_s"] == pytest.approx(0.02) and notes == []
    assert fig["measured_rank_tokens_per_s"] == 4 * 64  # 4 sequences of 64 per rank per step
    assert fig["required_rank_tokens_per_s"] == pytest.approx(est.tokens_per_s / 2)
    fig, notes = input_check(job, est, rows(SLOW_SHARE), dp=2)
    assert len(notes) == 1 and repr(job.data.source) in notes[0] and "data.prefetch = 0" in notes[0]
    assert input_check(job, est, [{"step": 1, "tokens_per_s": 1.0, "step_s": 1.0}], dp=2) == (
        {},
        [],
    )
