"""Smoke tests of the benchmark scripts: each imports, its smallest configuration runs, its
analysis is right on inputs with a known answer, and committed result files keep their schema.

No timing is asserted (speed lives in benchmarks/results/); the whole file runs in seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = (
    "attention",
    "pipeline",
    "scaling",
    "strategies",
    "gpu",
    "comm_volume",
    "precision",
    "ingest",
    "activation_ledger",
    "fp8_cpu",
    "moe_experts",
    "cache_key",
    "data_check",
    "calibration",
    "finetune_memory",
)


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_imports_and_has_main(name):
    assert callable(_load(name).main)


def test_attention_smallest_config_memory_ordering():
    att = _load("attention")
    import torch

    rows = [
        att.measure(b, s, repeats=1, device=torch.device("cpu"), dtype=torch.float32)
        for b in ("naive", "sdpa")
        for s in (128, 256)
    ]
    by = {(r["backend"], r["seq"]): r for r in rows}
    # naive saves the (T, T) probabilities: 4x when T doubles; SDPA saves O(T): 2x
    assert by[("naive", 256)]["saved_bytes"] > 3.5 * by[("naive", 128)]["saved_bytes"]
    assert by[("sdpa", 256)]["saved_bytes"] == pytest.approx(
        2 * by[("sdpa", 128)]["saved_bytes"], rel=0.05
    )
    assert by[("naive", 256)]["peak_bytes"] > by[("sdpa", 256)]["peak_bytes"]
    summ = att.summarize(rows)
    assert summ["slopes"]["naive"]["saved_bytes"] > 1.8
    assert summ["slopes"]["sdpa"]["saved_bytes"] < 1.2


def test_loglog_slope_exact():
    att = _load("attention")
    xs = [512, 1024, 2048]
    assert att.loglog_slope(xs, [3 * x * x for x in xs]) == pytest.approx(2.0)
    assert att.loglog_slope(xs, [5 * x for x in xs]) == pytest.approx(1.0)


@pytest.mark.parametrize("schedule,m,p", [("gpipe", 4, 4), ("1f1b", 8, 4), ("1f1b", 4, 2)])
def test_pipeline_analysis_recovers_the_formula_on_a_simulated_run(schedule, m, p):
    """Feed `analyse` an ideal timeline (the planner's simulation, t_B = 2 t_F): the measured
    bubble must be the closed form (p-1)/m."""
    pipe = _load("pipeline")
    from scaletrain.planner.time.pipeline import simulate

    sim = simulate(schedule, p, m, 1, 0.01, 0.02)
    rank_results = [
        {
            "schedule": schedule,
            "m": m,
            "v": 1,
            "rank": r,
            "device": "emulated",
            "steps": [
                [
                    (100 + e.start, 100 + e.end, e.kind, e.microbatch, 0, e.end - e.start)
                    for e in evs
                ]
            ],
        }
        for r, evs in enumerate(sim.ranks)
    ]
    res = pipe.analyse(rank_results)
    assert res["p"] == p and res["device"] == "emulated"
    assert res["bubble_measured"] == pytest.approx((p - 1) / m, rel=1e-6)
    assert res["bubble_simulated"] == pytest.approx(res["bubble_measured"], rel=1e-6)
    assert res["relative_error_vs_formula"] == pytest.approx(0.0, abs=1e-6)


def test_strategies_planner_only(capsys):
    strat = _load("strategies")
    assert (
        strat.main(["--no-dryrun", "--no-write", "--gpus", "8", "--strategies", "DDP,ZeRO-3"]) == 0
    )
    out = capsys.readouterr().out
    assert "ZeRO-3" in out and "DDP" in out


def test_scaling_host_share_halves_the_prediction():
    sc = _load("scaling")
    over = sc.job_overrides({"dp": 1}, steps=2, run_dir="unused", extra={})
    whole, half = sc.planner(over, 1, 1), sc.planner(over, 1, 2)
    assert half["tokens_per_s"] < whole["tokens_per_s"]
    assert whole["tokens_per_s"] > 0


def test_gpu_without_cuda_says_not_measured(capsys):
    gpu = _load("gpu")
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the guarded path is not taken")
    assert gpu.main(["--no-write"]) == 0
    assert gpu.NOT_MEASURED in capsys.readouterr().out


def test_comm_volume_planner_side_and_classification(tmp_path):
    """DDP's predicted volume is one ring all-reduce of the fp32 gradients (n = 2: 1x the
    bytes); calls land in the planner family of their phase, mesh axis and op."""
    cv = _load("comm_volume")
    from scaletrain.config import MODEL_PRESETS

    world, model, extra = cv.STRATEGIES["ddp"]
    pred = cv.predicted(cv.job_args(str(tmp_path), model, extra), world)
    assert pred == {"dp_allreduce": 4 * MODEL_PRESETS[model]().num_params()}

    def ev(kind, phase="forward_backward", payload=4096):
        return {"kind": kind, "phase": phase, "payload": payload}

    assert cv.family(ev("all_reduce"), ["dp", "dp_cp"], 0) == "dp_allreduce"
    assert cv.family(ev("broadcast", "optimizer"), ["dp_shard_cp"], 1) == "zero_all_gather"
    assert cv.family(ev("all_gather"), ["dp_shard_cp"], 3) == "fsdp_all_gather"
    assert cv.family(ev("reduce_scatter"), ["dp_shard_cp"], 2) == "zero_reduce_scatter"
    assert cv.family(ev("all_reduce"), ["dp_replicate"], 3) == "hsdp_allreduce"
    assert cv.family(ev("all_gather"), ["tp"], 2) == "tp"
    assert cv.family(ev("send"), ["pp"], 0) == "pp_p2p"
    assert cv.family(ev("send"), ["cp"], 0) == "cp_ring"
    assert cv.family(ev("all_to_all"), ["ep", "dp"], 0) == "ep_all_to_all"
    assert cv.family(ev("all_reduce", "scalars"), ["dp"], 0).startswith(cv.NOT_MODELLED)
    assert cv.family(ev("all_to_all", payload=32), ["ep"], 0).startswith(cv.NOT_MODELLED)


REQUIRED = {
    "attention": ("rows", "slopes"),
    "pipeline": ("results", "meta"),
    "scaling": ("rows", "meta"),
    "strategies": ("rows", "meta"),
    "gpu": ("status",),
    "comm_volume": ("results", "notes"),
    "precision": ("meta", "summary", "step0_grad_error", "memory", "runs"),
    "ingest": ("rows", "meta", "rss_growth_mib"),
    "activation_ledger": ("results", "batch", "seq", "dim"),
    "fp8_cpu": ("probe", "rounds", "summary", "cpu_flags"),
    "moe_experts": ("rows", "reps", "threads", "tokens"),
    "cache_key": ("rows", "meta"),
    "data_check": ("rows", "meta"),
    "calibration": ("rows", "summary", "meta", "target"),
    "finetune_memory": ("rows", "seq_len", "batch"),
}


def test_calibration_errors_and_summary():
    """The calibration benchmark's analysis on rows with a known answer: error = predicted /
    measured - 1, the median over rounds per layout and calibration."""
    cal = _load("calibration")
    assert cal.error(110.0, 100.0) == pytest.approx(0.10)
    rows = [
        {"layout": "B", "error_cpu": {"profile": e, "step": 2 * e, "default": -0.2}}
        for e in (0.01, -0.03, 0.05)
    ]
    assert cal.summary(rows) == {"B": {"profile": 0.01, "step": 0.02, "default": -0.2}}
    # a one-rank layout is judged by A's profile calibration, a two-rank one by D's
    e = {"profile": 0.5, "profile_2rank": 0.05}
    assert cal._verdict("E: two", 2, e) == "yes" and cal._verdict("B: one", 1, e) == "**no**"
    assert cal._verdict("D: two", 2, e) == "calibrated on it"
    assert cal._verdict("E: two", 2, {"profile": 0.0}) == "not judged"


@pytest.mark.parametrize("name", SCRIPTS)
def test_committed_results_schema(name):
    jpath, mpath = BENCH / "results" / f"{name}.json", BENCH / "results" / f"{name}.md"
    if not jpath.exists():
        pytest.skip(f"{jpath.name} not generated yet")
    data = json.loads(jpath.read_text())
    for key in ("git_revision", "machine", "date", *REQUIRED[name]):
        assert key in data, f"{jpath.name} lacks {key!r}"
    assert mpath.exists() and mpath.read_text().startswith("# ")
    if name == "gpu" and data["status"] != "measured":
        assert "not measured" in data["status"]


def test_precision_memory_planned_matches_measured():
    """The precision study's memory table: for every precision with a planner recipe, the
    planned training state equals the measured one exactly and the planned saved bytes are
    within 5% of what autograd saves (micro-batch 2 x 64 tokens, seconds)."""
    import torch

    prec = _load("precision")
    x = torch.randint(0, 256, (2, 64))
    rows = prec.memory_rows((x, torch.roll(x, -1, 1)), seq_len=64)
    assert set(rows) == set(prec.RUNS)
    for name in prec.PLANNED:
        r = rows[name]
        assert r["planned_state"] == r["measured_state"], name
        assert abs(r["planned_saved"] / r["measured_saved"] - 1) < 0.05, (name, r)
    # the memory ordering the recipes promise: fp32 > bf16 > fp8 saved bytes
    saved = {n: rows[n]["measured_saved"] for n in ("fp32", "bf16", "fp8 tensorwise")}
    assert saved["fp32"] > saved["bf16"] > saved["fp8 tensorwise"]


def test_ingest_smallest_corpora(tmp_path):
    """The whole benchmark on 0.1 and 0.3 MB corpora (its own process, results in tmp_path):
    every document becomes tokens (BPE: fewer tokens than bytes) and peak memory is reported."""
    env = {**os.environ, "SCALETRAIN_BENCH_OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, str(BENCH / "ingest.py"), "--mb", "0.3", "--small-mb", "0.1"],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    data = json.loads((tmp_path / "ingest.json").read_text())
    # one row per corpus size and worker count (1 and 2), the shards compared between them
    assert sorted((r["mb"], r["workers"]) for r in data["rows"]) == [
        (0.1, 1),
        (0.1, 2),
        (0.3, 1),
        (0.3, 2),
    ]
    for r in data["rows"]:
        assert 0 < r["docs"] < r["tokens"] < r["mb"] * 2**20
        assert r["peak_rss_mib"] > 50 and r["tokens_per_s"] > 0 and r["identical_shards"]
    assert (tmp_path / "ingest.md").read_text().startswith("# Ingestion")


def test_activation_ledger_smallest_blocks():
    led = _load("activation_ledger")
    results = led.run(dim=64, heads=4, batch=1, seq=32)
    by = {(r["block"], r["params"], r["ac"]): r for r in results}
    assert len(by) == 2 * len(led.PARAMS) * len(led.AC_MODES)
    for (block, params, _ac), r in by.items():
        assert r["total"] == sum(row["bytes"] for row in r["rows"])
        # the planner's per-block formula counts the same tensors (CPU's bf16 LayerNorm
        # statistics aside: finding F4, 4 B per token and norm)
        slack = 2 * 32 * 4 if (block, params) == ("gpt2-block", "bf16") else 0
        assert r["analytic"] - slack <= r["total"] <= r["analytic"]
    for block in ("llama-block", "gpt2-block"):
        for params in led.PARAMS:
            none, sel, full = (by[(block, params, ac)]["total"] for ac in led.AC_MODES)
            assert full < sel < none
            # full keeps only the block input, in the residual stream's dtype
            assert full == (4 if params == "fp32" else 2) * 32 * 64
    md = led.markdown(results, 1, 32)
    assert "not explained" not in md and "**F2**" in md


def _has_before_commit() -> bool:
    """Whether this clone holds the commit before the memory recipe (not a shallow one)."""
    p = subprocess.run(
        ["git", "cat-file", "-e", "56e20cf^1^{commit}"],
        cwd=BENCH.parent,
        capture_output=True,
        check=False,
    )
    return p.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _has_before_commit(), reason="a shallow clone: no 56e20cf^1 to archive")
def test_memory_recipe_quick(tmp_path):
    """memory_recipe --quick (one tiny-llama row, its own processes, results in tmp_path; the
    tree before the recipe from `git archive 56e20cf^1`): each before/after cell is a positive
    peak or n/a with the CLI's reason, the plan is beside it, the row says when it ran, and the
    loss-temporaries check reads a figure from each tree's explain."""
    env = {**os.environ, "SCALETRAIN_BENCH_OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, str(BENCH / "memory_recipe.py"), "--quick", "--no-train"],
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    data = json.loads((tmp_path / "memory_recipe.json").read_text())
    assert not data["partial"] and len(data["rows"]) == 1
    (r,) = data["rows"]
    for side in ("before", "after"):
        cell = r[side]
        assert (cell["peak_gb"] is None and cell["reason"]) or cell["peak_gb"] > 0, r
    assert r["planned"]["reserved_gb"] >= r["planned"]["allocated_gb"] > 0
    assert r["measured"]["git"] and r["measured"]["date"]
    lt = data["checks"]["loss_temp"]
    assert isinstance(lt["before_gb"], float) and isinstance(lt["after_gb"], float)
    assert (tmp_path / "memory_recipe.md").read_text().startswith("# Memory recipe")


def test_memory_recipe_error_line_skips_torch_logs():
    """The reason of a failed run is the CLI's error line, not a torch warning printed after
    it (the llama3-70b tp8 row once read DTensor's redistribute warning)."""
    mr = _load("memory_recipe")
    warn = (
        "[rank0]:W1125 15:49:54.643000 19991 site-packages/torch/distributed/tensor/"
        "_redistribute.py:390] While redistributing from (_NormPartial(2.0), ...) to ..."
    )
    err = "scaletrain dryrun: error: parallel.tp = 2 is invalid: use parallel.ep"
    assert mr.error_line(f"{err}\n{warn}\n", 2) == err
    assert mr.error_line(f"{warn}\n  warnings.warn(\n", 1) == "exit 1"
    assert mr.error_line("x.py:3: UserWarning: deprecated\nboom\n", 1) == "boom"


def _vs_round(nano: float, walls: dict[str, float]) -> dict:
    phases = {name: 1.0 for name, _ in _load("vs_nanogpt").PHASE_ROWS}
    r = {"nanogpt": {"wall_s": nano, "cpu_s": 2 * nano, "val_loss": 1.9}}
    for p, w in walls.items():
        r[f"scaletrain-{p}"] = {"wall_s": w, "cpu_s": 2 * w, "val_loss": 1.8, "phases_s": phases}
    r["ratio"] = {p: {"wall": w / nano, "cpu": w / nano} for p, w in walls.items()}
    return r


def test_vs_nanogpt_summary_takes_the_median_of_round_ratios():
    """Three rounds with known walls: the median of the per-round ratios per precision (not
    the ratio of medians), every phase row in the table, each side's column."""
    vs = _load("vs_nanogpt")
    rounds = [
        _vs_round(100.0, {"fp32": 90.0, "bf16": 60.0}),
        _vs_round(80.0, {"fp32": 96.0, "bf16": 40.0}),
        _vs_round(120.0, {"fp32": 96.0, "bf16": 96.0}),
    ]
    s = vs.summary(rounds, ["fp32", "bf16"])
    assert s["fp32"]["median_wall_ratio"] == pytest.approx(0.9)  # 0.9, 1.2, 0.8
    assert s["bf16"]["median_wall_ratio"] == pytest.approx(0.6)  # 0.6, 0.5, 0.8
    assert s["nanogpt_wall_s_median"] == 100.0
    args = type("A", (), {"steps": 2000, "threads": None})()
    md = vs.markdown(args, rounds, s, speedup=4.0)
    assert "scaletrain fp32: median wall-time ratio 0.900x" in md
    assert "scaletrain bf16: median wall-time ratio 0.600x" in md
    assert all(f"| {name} |" in md for name, _ in vs.PHASE_ROWS)


def test_vs_nanogpt_precisions_auto_follows_the_measured_bf16_speedup(monkeypatch):
    vs = _load("vs_nanogpt")
    monkeypatch.setattr(vs._common, "bf16_matmul_speedup", lambda: 4.0)
    assert vs.scaletrain_precisions("auto", None) == (["fp32", "bf16"], 4.0)
    monkeypatch.setattr(vs._common, "bf16_matmul_speedup", lambda: 0.7)
    assert vs.scaletrain_precisions("auto", None) == (["fp32"], 0.7)
    assert vs.scaletrain_precisions("bf16", None)[0] == ["bf16"]


def test_nanogpt_recipe_bf16_takes_the_naive_attention_core():
    ns = _load("nanogpt_shakespeare")
    fp32, bf16 = (ns.recipe_args("x.txt", 10, "run", p) for p in ("fp32", "bf16"))
    assert "--precision.dtype=fp32" in fp32 and not any("attention" in a for a in fp32)
    assert "--precision.dtype=bf16" in bf16 and "--model.attention=naive" in bf16


def test_fp8_cpu_summary_takes_the_median_of_round_ratios():
    """fp8_cpu: each fp8 side's ratio is the median over rounds of wall / the round's bf16
    wall (known answers), and the round order rotates every side to the front."""
    fc = _load("fp8_cpu")

    def side(wall: float, loop: float) -> dict:
        return {"wall_s": wall, "loop_s": loop, "fp8_line": ""}

    rounds = [
        {k: side(w, w / 2) for k, w in zip(fc.SIDES, (10.0, 12.0, 30.0, 11.0))},
        {k: side(w, w / 2) for k, w in zip(fc.SIDES, (20.0, 20.0, 50.0, 24.0))},
        {k: side(w, w / 2) for k, w in zip(fc.SIDES, (10.0, 15.0, 40.0, 10.0))},
    ]
    s = fc.summary(rounds)
    assert s["fp8 auto"]["wall_ratio"] == pytest.approx(1.2)  # median of 1.2, 1.0, 1.5
    assert s["fp8 scaled_mm"]["wall_ratio"] == pytest.approx(3.0)  # of 3.0, 2.5, 4.0
    assert s["fp8 emulated"]["loop_ratio"] == pytest.approx(1.1)  # of 1.1, 1.2, 1.0
    assert s["bf16"]["median_wall_s"] == 10.0 and "wall_ratio" not in s["bf16"]
    assert {fc.round_order(i)[0] for i in range(len(fc.SIDES))} == set(fc.SIDES)
    assert fc.fp8_line("x\nfp8 matmul: emulated (set)\ny") == "fp8 matmul: emulated (set)"
