"""`scaletrain profile` end to end: the three bottleneck classes of the acceptance criteria on
tiny runs (2 profiled steps each), the breakdown adding up to the step, and the outputs."""

from __future__ import annotations

import json

import pytest

from scaletrain.cli import main
from scaletrain.config import load_config
from scaletrain.profile import classify, profile_job, render

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _args(tmp_path, cache, *extra: str) -> list[str]:
    return [
        "--data.num_tokens=60000",
        f"--data.cache_dir={cache}",
        f"--train.run_dir={tmp_path / 'run'}",
        "--train.progress=false",
        *extra,
    ]


_SLICE_S = 5e-3
"""One scheduler slice (4 ms at HZ=250) and a little: what a thread preempted on a loaded
2-core host loses between two clock reads, whatever the step's length."""


def _tiling_slack(step_s: float) -> float:
    """How far the phases' wall time may miss the step timed around them: a fifth of it, and
    never less than a scheduler slice (`_SLICE_S`). Only the Python between two phase ranges
    is in neither, and a thread descheduled there on a loaded 2-core host stretches it (3.9 ms
    of a 48 ms step seen in CI).
    What the bound guards is a lost phase that runs no op (a wait, a sleep); lost ops and double
    counting are checked in the trace's own clock by `_assert_tiles`, where load cannot move
    them."""
    return max(0.2 * step_s, _SLICE_S)


def _assert_tiles(phase_ops_s: dict[str, float], overlap_s: float) -> None:
    # one clock, the trace's: no op of the step started outside every phase range (nothing
    # lost) and no second counted by two ranges (nothing counted twice; sums of microsecond
    # ranges, so the float error is far below a nanosecond)
    assert "outside" not in phase_ops_s, phase_ops_s
    assert abs(overlap_s) <= 1e-9, overlap_s


def _assert_parts_add_up(r) -> None:
    assert r.step_s > 0
    _assert_tiles(r.analysis.phase_op_s, r.analysis.phase_overlap_s)
    # the phase ranges (the trace's clock) against the step timed by perf_counter around it
    assert abs(r.parts_s - r.step_s) <= _tiling_slack(r.step_s), (r.parts_s, r.step_s, r.phase_s)
    for phase, secs in r.phase_s.items():  # the hooks' own clock agrees with the trace
        # (to 3% of the step and never less than a scheduler slice: a thread preempted between
        # a timestamp and a range edge on a busy CI box moves that much from one phase to the
        # next)
        assert secs == pytest.approx(r.clock_s[phase], abs=max(0.03 * r.step_s, _SLICE_S)), phase


def test_data_starved_run_is_data_bound(tmp_path, cache):
    job = load_config(
        None,
        _args(
            tmp_path,
            cache,
            "--model.name=tiny",
            "--data.delay_s=0.2",
            "--data.prefetch=0",
            "--batch.micro_batch=2",
            "--batch.global_batch=2",
            "--batch.seq_len=64",
        ),
    )
    r = profile_job(job, steps=2, warmup=1)
    v = classify(r)
    assert v.kind == "data-bound", render(r, v)
    assert r.phase_s["data"] >= 0.2 * 0.9  # the configured delay is inside the data phase
    assert "prefetch" in v.recommendations[0].technique
    _assert_parts_add_up(r)
    assert r.trace_path is not None and r.trace_path.exists()
    trace = json.loads(r.trace_path.read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {
        "scaletrain::data",
        "scaletrain::forward",
        "scaletrain::backward",
        "scaletrain::optimizer",
    } <= names


def test_naive_long_sequence_is_attention_bound(tmp_path, cache):
    job = load_config(
        None,
        _args(
            tmp_path,
            cache,
            "--model.name=tiny",
            "--model.attention=naive",
            "--batch.seq_len=512",
            "--model.max_seq_len=512",
            "--batch.micro_batch=2",
            "--batch.global_batch=2",
        ),
    )
    r = profile_job(job, steps=2, warmup=1)
    v = classify(r)
    assert v.kind == "attention-bound", render(r, v)
    assert "memory-bound" in v.detail  # (T, T) scores: under the ridge point
    share = r.analysis.compute_class_s
    assert share["attention"] > share.get("matmul", 0) + share.get("elementwise/norm", 0)
    rec = v.recommendations[0]
    assert "sdpa" in rec.technique
    # the planner check: fused attention keeps no (T, T) tensors -> fewer activation bytes
    assert rec.planner is not None and "activations -" in rec.planner
    _assert_parts_add_up(r)


def test_default_small_run_is_compute_bound_via_cli(tmp_path, cache, capsys):
    out = tmp_path / "out"
    rc = main(
        [
            "profile",
            "--steps",
            "2",
            "--warmup",
            "2",
            "--out",
            str(out),
            *_args(tmp_path, cache, "--batch.micro_batch=8", "--batch.global_batch=8"),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "verdict: COMPUTE-BOUND" in text, text
    data = json.loads((out / "profile.json").read_text())
    assert data["model"] == "gpt-mini" and data["verdict"]["kind"] == "compute-bound"
    parts = sum(data["phases_s"].values())
    assert abs(parts - data["step_s"]) <= _tiling_slack(data["step_s"])
    _assert_tiles(data["phase_ops_s"], data["phase_overlap_s"])
    # measured and predicted MFU side by side, same (model-FLOPs) convention
    assert 0 < data["mfu"] < 1 and 0 < data["predicted"]["mfu"] < 1
    assert data["unprofiled_step_s"] > 0
    ops = data["ops"]
    assert any(o["class"] == "matmul" and o["flops"] > 0 and o["intensity"] > 0 for o in ops)
    assert (out / "rank0.pt.trace.json").stat().st_size > 0
    png = (out / "roofline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def _rank_profile(args: list[str]) -> dict:
    r = profile_job(load_config(None, args), steps=2, warmup=1)
    return {
        "comm_total": r.analysis.comm_total_s,
        "comm_exposed": r.analysis.comm_exposed_s,
        "comm_class": r.analysis.class_s.get("communication", 0.0),
        "parts": r.parts_s,
        "phase_ops": r.analysis.phase_op_s,
        "overlap": r.analysis.phase_overlap_s,
        "step": r.step_s,
        "kind": classify(r).kind,
        "world": r.world_size,
        "trace": str(r.trace_path),
    }


@pytest.mark.distributed
def test_gloo_run_reports_collective_time(tmp_path, cache):
    from scaletrain.parallel.launch import spawn

    args = _args(
        tmp_path,
        cache,
        "--model.name=tiny",
        "--parallel.dp=2",
        "--parallel.zero=0",
        "--batch.micro_batch=2",
        "--batch.global_batch=4",
        "--batch.seq_len=64",
    )
    per_rank = spawn(_rank_profile, 2, args)
    for rank, res in enumerate(per_rank):
        assert res["world"] == 2
        # DDP's gradient all-reduce: seen as communication ops, part of it on the training
        # thread (exposed), never more than all of it
        assert res["comm_class"] > 0 and res["comm_total"] > 0
        assert 0 < res["comm_exposed"] <= res["comm_total"] + 1e-9
        assert abs(res["parts"] - res["step"]) <= _tiling_slack(res["step"])
        _assert_tiles(res["phase_ops"], res["overlap"])
        assert res["trace"].endswith(f"rank{rank}.pt.trace.json")
