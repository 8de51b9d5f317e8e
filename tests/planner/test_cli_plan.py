"""`scaletrain plan` / `explain`: JSON schema, error path, flag snapshot, torch-free import."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from scaletrain.cli import main
from scaletrain.cli import plan as plan_cli

FLAGS = [
    "--ac",
    "--calibration",
    "--ckpt-every",
    "--comm-overlap",
    "--compile",
    "--config",
    "--convention",
    "--cp",
    "--dp",
    "--efficiency",
    "--ep",
    "--global-batch",
    "--gpu",
    "--gpus",
    "--gpus-per-node",
    "--grid-co2",
    "--hardware",
    "--host-memory-gib",
    "--host-watts",
    "--json",
    "--lora-base-dtype",
    "--lora-rank",
    "--lora-targets",
    "--micro-batch",
    "--model",
    "--offload",
    "--params",
    "--plot",
    "--pp",
    "--pp-schedule",
    "--pp-virtual",
    "--precision",
    "--preflight",
    "--pue",
    "--recipe",
    "--seq-len",
    "--sp",
    "--storage-gb-per-s",
    "--sweep",
    "--tokens",
    "--top",
    "--tp",
    "--usd-per-gpu-hour",
    "--verify",
    "--zero",
]

SCHEMA = {
    "plan": {
        "model",
        "params",
        "gpus",
        "dp",
        "zero",
        "tp",
        "sp",
        "pp",
        "pp_schedule",
        "pp_virtual",
        "cp",
        "ep",
        "micro_batch",
        "grad_accum",
        "seq_len",
        "precision",
        "ac",
        "offload",
    },
    "memory": {
        "params",
        "grads",
        "optimizer",
        "activations",
        "buffers",
        "total",
        "reserved",
        "capacity",
        "fits",
        "rank",
        "host",
        "host_capacity",
    },
    "time": {"step_s", "compute_s", "comm_exposed_s", "bubble_s"},
}
TOP = {"plan", "memory", "time", "flops_per_token", "tokens_per_s", "mfu"}


@pytest.mark.parametrize("name", ["plan", "explain"])
def test_flag_set_snapshot(name: str) -> None:
    parser = argparse.ArgumentParser()
    plan_cli.add_arguments(parser, name)
    flags = sorted(
        o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")
    )
    assert flags == FLAGS  # grow this list only on purpose (STYLE.md #10)


def _check_schema(obj: dict) -> None:
    assert set(obj) == TOP
    for section, keys in SCHEMA.items():
        assert set(obj[section]) == keys


def test_search_json_is_a_list_best_first(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "plan",
            "--model",
            "gpt-mini",
            "--gpus",
            "4",
            "--gpu",
            "cpu",
            "--seq-len",
            "128",
            "--global-batch",
            "16",
            "--json",
            "--top",
            "3",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert isinstance(out, list) and 1 <= len(out) <= 3
    for obj in out:
        _check_schema(obj)
        assert obj["memory"]["fits"] is True and obj["plan"]["gpus"] == 4
    steps = [o["time"]["step_s"] for o in out]
    assert steps == sorted(steps)


def test_exact_layout_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "plan",
            "--model",
            "llama3-8b",
            "--gpus",
            "16",
            "--tp",
            "2",
            "--pp",
            "2",
            "--pp-schedule",
            "interleaved",
            "--zero",
            "3",
            "--sp",
            "--seq-len",
            "4096",
            "--global-batch",
            "64",
            "--micro-batch",
            "1",
            "--json",
        ]
    )
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    _check_schema(obj)
    p = obj["plan"]
    assert (p["dp"], p["tp"], p["pp"], p["zero"], p["sp"], p["pp_schedule"], p["pp_virtual"]) == (
        4,
        2,
        2,
        3,
        True,
        "interleaved",
        2,
    )
    assert p["grad_accum"] == 16


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--tp", "3"], "--tp"),
        (["--gpus", "0"], "--gpus"),
        (["--gpu", "tpu-v9"], "--gpu"),
        (["--pp", "2", "--global-batch", "2", "--micro-batch", "2"], "--global-batch"),
        (["--cp", "3"], "--cp"),
    ],
)
def test_errors_name_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["plan", "--model", "llama3-8b", "--gpus", "8", *argv])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err


def test_acceptance_search_prints_best_and_losers(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "plan",
            "--model",
            "llama3-70b",
            "--gpus",
            "64",
            "--gpu",
            "h100-sxm",
            "--seq-len",
            "8192",
            "--global-batch",
            "512",
            "--tokens",
            "1e12",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "best:" in out and "why the other strategy families lost" in out
    assert "pure DP" in out and "never fits" in out
    for col in ("params", "grads", "optim", "acts", "buffers", "reserved", "MFU"):
        assert col in out
    assert "GPU-hours" in out


def test_explain_and_plot(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "mem.png"
    rc = main(
        [
            "explain",
            "--model",
            "llama3-8b",
            "--gpus",
            "8",
            "--tp",
            "2",
            "--zero",
            "3",
            "--seq-len",
            "4096",
            "--global-batch",
            "64",
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "8,030,261,248" in out  # exact parameter count
    assert "world size = dp*tp*pp*cp = 4*2*1*1 = 8" in out
    assert "step =" in out and "MFU" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_planner_and_cli_do_not_import_torch() -> None:
    code = (
        "import sys, scaletrain.cli.plan, scaletrain.planner.search.layouts, "
        "scaletrain.planner.output.report, scaletrain.planner.output.explain, "
        "scaletrain.planner.output.plot, scaletrain.planner.time.pipeline; "
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules, 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plot_draws_the_pipeline_when_the_best_layout_pipelines(tmp_path) -> None:
    png = tmp_path / "plan.png"
    rc = main(
        [
            "plan",
            "--model",
            "llama3-8b",
            "--gpus",
            "8",
            "--tp",
            "2",
            "--pp",
            "4",
            "--pp-schedule",
            "zero-bubble",
            "--seq-len",
            "4096",
            "--global-batch",
            "16",
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    gantt = tmp_path / "plan_pipeline.png"
    assert png.read_bytes()[:8] == gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    flat = tmp_path / "flat.png"
    assert (
        main(
            [
                "plan",
                "--model",
                "llama3-8b",
                "--gpus",
                "8",
                "--tp",
                "8",
                "--seq-len",
                "4096",
                "--global-batch",
                "16",
                "--plot",
                str(flat),
            ]
        )
        == 0
    )
    assert flat.exists() and not (tmp_path / "flat_pipeline.png").exists()


def test_preflight_dry_runs_the_best_layout(capsys) -> None:
    """--preflight runs the real step under fake tensors for the chosen layout and compares."""
    from scaletrain.cli import main

    rc = main(
        [
            "plan",
            "--model",
            "tiny-llama",
            "--gpus",
            "4",
            "--gpu",
            "h100-sxm",
            "--seq-len",
            "64",
            "--global-batch",
            "8",
            "--dp",
            "4",
            "--zero",
            "3",
            "--preflight",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "preflight dry-run of the best layout" in out
    for category in ("params", "optimizer", "activations", "total"):
        assert category in out.split("preflight")[1]


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--model", "mixtral-8x7b", "--gpus", "64", "--gpu", "h100-sxm"],
        ["plan", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--dp", "8"],
        ["explain", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm"],
    ],
)
@pytest.mark.parametrize("columns", [80, 100])
def test_output_fits_the_terminal_width(argv, columns, capsys, monkeypatch) -> None:
    """An 80-column terminal gets no wrapped line: the table drops the per-category columns
    (explain has them) and long lines wrap with an indent; nothing is cut (every layout of the
    table and the verdict are still there)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= columns
    assert "fits" in out or "FIT" in out
    if argv[0] == "plan" and "--dp" not in argv:
        assert "best:" in out and "why the other strategy families lost" in out


_FP8_8B = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "8192"]
_FP8_8B += ["--dp", "8", "--zero", "3"]


def test_fp8_without_compile_names_its_eager_casts(capsys: pytest.CaptureFixture[str]) -> None:
    """fp8 whose casts run as eager kernels gets one line with the three throughputs, each the
    planner's own for the same layout (bf16, fp8 eager, fp8 compiled); in this Llama 3 8B
    layout the eager casts make fp8 slower than bf16, compiled it is faster."""
    from dataclasses import replace

    from scaletrain.planner.output.report import fp8_eager_note

    assert main(["plan", *_FP8_8B, "--precision", "fp8"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "fp8 without compile" in ln]
    assert len(lines) == 1 and "slower than bf16's" in lines[0]
    from scaletrain.config import Layout, hardware_preset, resolve_model
    from scaletrain.planner import PlanInput, estimate

    plan = PlanInput(
        model=resolve_model("llama3-8b"),
        hardware=hardware_preset("h100-sxm"),
        num_gpus=8,
        layout=Layout(dp=8, zero=3),
        seq_len=8192,
        global_batch=8,
        micro_batch=1,
        precision="fp8",
    )
    est = estimate(plan)
    bf16 = estimate(replace(plan, precision="bf16")).tokens_per_s
    fused = estimate(replace(plan, compile=True)).tokens_per_s
    assert est.tokens_per_s < bf16 < fused
    note = fp8_eager_note(est)
    assert note is not None and f"{fused:,.0f} tokens/s" in note and f"{bf16:,.0f}" in note


@pytest.mark.parametrize("extra", [["--precision", "fp8", "--compile"], ["--precision", "bf16"]])
def test_no_fp8_note_when_compiled_or_not_fp8(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *_FP8_8B, *extra]) == 0
    assert "fp8 without compile" not in capsys.readouterr().out
