"""Calibrated planning (issue #39 item 3, planner side): the file round-trips and refuses bad
input in one line, and a calibration's constants enter the step exactly as
planner/time/calibration.py says (checked by hand arithmetic), on the device and precision it
was measured in only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from scaletrain.cli import main
from scaletrain.config import ConfigError, Layout, hardware_preset, resolve_model
from scaletrain.planner import PlanInput, estimate
from scaletrain.planner.time.calibration import (
    Calibration,
    calibration_toml,
    class_rate,
    describe_calibration,
    gemm_classes,
    head_class,
    host_sharing_note,
    read_calibration,
)
from scaletrain.planner.time.efficiency import gemm_factor
from scaletrain.planner.time.flops import attention_core_flops_per_token

CPU = hardware_preset("cpu")
MINI = resolve_model("gpt-mini")  # h 128, 4 layers, 4 heads, ffn 512, vocab 256, gelu

CAL = Calibration(
    hardware="cpu",
    precision="fp32",
    source="runs/cal",
    clock="cpu",
    split="profile",
    measured_step_s=0.2,
    gemm_tokens=2048.0,
    matmul=0.27,
    matmul_by_shape=(("128x128", 0.29), ("128x256", 0.21), ("128x512", 0.265)),
    attention=0.08,
    non_gemm_s=5.5e-8,
    forward_share=0.36,
    optimizer_bw=35e9,
    collective=(("all_reduce", 2.0),),
    step_overhead_s=0.003,
    ranks_per_host=1,
)


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cal.toml"
    p.write_text(text)
    return p


def test_the_file_round_trips(tmp_path: Path) -> None:
    assert read_calibration(_write(tmp_path, calibration_toml(CAL))) == CAL
    one_rate = dataclasses.replace(
        CAL, split="step", matmul_by_shape=(), attention=0.0, collective=(), optimizer_bw=0.0
    )
    assert read_calibration(_write(tmp_path, calibration_toml(one_rate))) == one_rate


@pytest.mark.parametrize(
    "edit,field,words",
    [
        (("matmul = 0.27", "matmull = 0.27"), "calibration.matmull", "did you mean 'matmul'"),
        (("matmul = 0.27", "matmul = -0.27"), "calibration.matmul", ">= 0"),
        (("matmul = 0.27", "matmul = 0"), "calibration.matmul", "positive"),
        (("matmul = 0.27", ""), "calibration.matmul", "required"),
        (("all_reduce = 2.0", "allreduce = 2.0"), "calibration.collective", "all_reduce"),
        (
            ('"128x128" = 0.29', '"128x128" = "fast"'),
            "calibration.matmul_by_shape.128x128",
            "positive",
        ),
        (('clock = "cpu"', 'clock = "sun"'), "--calibration", "clock"),
        (("[calibration]", "[calibrations]"), "calibration.hardware", "required"),
        (("[calibration]", "[calibration"), "--calibration", "not a calibration TOML"),
        (("ranks_per_host = 1", "ranks_per_host = 1.5"), "calibration.ranks_per_host", "whole"),
        (("ranks_per_host = 1", "ranks_per_host = -1"), "calibration.ranks_per_host", ">= 0"),
    ],
)
def test_file_faults_are_one_line(
    tmp_path: Path, edit: tuple[str, str], field: str, words: str
) -> None:
    text = calibration_toml(CAL)
    assert edit[0] in text
    with pytest.raises(ConfigError) as e:
        read_calibration(_write(tmp_path, text.replace(edit[0], edit[1], 1)))
    assert e.value.field == field and words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="--calibrate"):
        read_calibration(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="no \\[calibration\\] table"):
        read_calibration(_write(tmp_path, "[hardware]\ngpu = 'cpu'\n"))


def test_the_calibrated_step_by_hand() -> None:
    """gpt-mini, dp1, 16 x 128 tokens: each GEMM class at its rate, the core at the attention
    rate, the non-GEMM seconds, the head, the optimizer at its bandwidth, the overhead."""
    plan = PlanInput(MINI, CPU, 1, Layout(), 128, 16, 16, "fp32", calibration=CAL)
    est = estimate(plan)
    h, s, tok, L = 128, 128, 16 * 128, 4
    peak = 333e9
    rate = dict(CAL.matmul_by_shape)
    # per token per block, forward: q, k, v, o 2h^2 each (128x128); MLP in and out 2hf (128x512)
    linear = 3 * (
        4 * 2 * h * h / (peak * rate["128x128"]) + 2 * 2 * h * 512 / (peak * rate["128x512"])
    )
    core = attention_core_flops_per_token(MINI, s) * 3 / (peak * CAL.attention)
    non_gemm = CAL.non_gemm_s * h
    head = 3 * 2 * h * 256 / (peak * rate["128x256"])
    compute = tok * (L * (linear + core + non_gemm) + head)
    optimizer = 28 * MINI.num_params() / CAL.optimizer_bw  # AdamW's bytes per parameter
    assert est.time.compute_s == pytest.approx(compute, rel=1e-12)
    assert est.time.optimizer_s == pytest.approx(optimizer, rel=1e-12)
    assert est.time.overhead_s == CAL.step_overhead_s
    assert est.time.step_s == pytest.approx(compute + optimizer + 0.003, rel=1e-12)
    assert est.tokens_per_s == pytest.approx(tok / est.time.step_s)
    # full AC: the blocks' GEMMs and core a fourth time but the MLP's down projection (torch's
    # non-reentrant checkpoint stops before it: time/ac_early_stop.py), the non-GEMM forward
    # share again
    full = estimate(dataclasses.replace(plan, ac="full"))
    lin_full = linear * 4 / 3 - 2 * h * 512 / (peak * rate["128x512"])
    core_full = core * 4 / 3
    ng_full = non_gemm * (1 + CAL.forward_share)
    assert full.time.compute_s == pytest.approx(
        tok * (L * (lin_full + core_full + ng_full) + head), rel=1e-12
    )


def test_gemm_classes_sum_to_the_block_matmuls() -> None:
    for name in ("gpt-mini", "llama3-8b", "tiny-llama", "mixtral-8x7b"):
        m = resolve_model(name)
        from scaletrain.planner.time.flops import matmul_params

        per_layer, _ = matmul_params(m)
        for tp in (1, 2, 8):
            assert sum(f for _, f in gemm_classes(m, tp)) == pytest.approx(2 * per_layer / tp)
    llama = resolve_model("llama3-8b")  # GQA: k and v are 4096 x 1024
    keys = {k for k, _ in gemm_classes(llama)}
    assert keys == {"4096x4096", "1024x4096", "4096x14336"}
    assert head_class(llama, 2) == "4096x64128"


def test_roofline_carries_a_rate_to_other_rows() -> None:
    """On an H100 a 2048-row GEMM is above the ridge and a 16-row one far below: the class's
    rate scales by the roofline's f(M) / f(M_run)."""
    h100 = hardware_preset("h100-sxm")
    cal = dataclasses.replace(CAL, hardware="h100-sxm", precision="bf16")
    ridge = h100.flops("bf16") / h100.memory_bw
    f16 = gemm_factor(16, 128, 512, 2, ridge)
    f2048 = gemm_factor(2048, 128, 512, 2, ridge)
    assert f16 < 0.1 < f2048
    assert class_rate(cal, "128x512", tokens=16, precision="bf16", hardware=h100) == pytest.approx(
        0.265 * f16 / f2048
    )
    # a shape the run did not execute takes the FLOP-weighted rate
    got = class_rate(cal, "4096x4096", tokens=2048, precision="bf16", hardware=h100)
    assert got == pytest.approx(0.27)


def test_collective_factor_scales_its_kind_only() -> None:
    layout = Layout(dp=2)
    plain = estimate(
        PlanInput(
            MINI,
            CPU,
            2,
            layout,
            128,
            16,
            8,
            "fp32",
            calibration=dataclasses.replace(CAL, collective=()),
        )
    )
    timed = estimate(PlanInput(MINI, CPU, 2, layout, 128, 16, 8, "fp32", calibration=CAL))
    assert timed.time.comm_terms["dp_allreduce"] == pytest.approx(
        2.0 * plain.time.comm_terms["dp_allreduce"]
    )
    assert timed.time.compute_s == plain.time.compute_s


def test_describe_names_calibrated_and_default() -> None:
    text = "\n".join(describe_calibration(CAL))
    assert "calibrated: matmul 0.270 of peak (by shape: 128x128 0.290" in text
    assert "all_reduce x2" in text
    assert "default: all_gather, reduce_scatter, all_to_all, send" in text
    one = dataclasses.replace(
        CAL,
        split="step",
        matmul_by_shape=(),
        attention=0.0,
        non_gemm_s=0.0,
        optimizer_bw=0.0,
        collective=(),
        step_overhead_s=0.0,
    )
    text = "\n".join(describe_calibration(one))
    assert "one rate for the whole step" in text
    assert "default: attention at the matmul rate" in text


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_plan_with_a_calibration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(_write(tmp_path, calibration_toml(CAL)))
    rc, out, _ = _cli(["plan", "--dp", "1", "--calibration", path, "--json"], capsys)
    assert rc == 0
    want = estimate(PlanInput(MINI, CPU, 1, Layout(), 128, 16, 16, "fp32", calibration=CAL))
    assert json.loads(out)["time"]["step_s"] == pytest.approx(want.time.step_s, rel=1e-12)
    rc, out, _ = _cli(["plan", "--gpus", "2", "--calibration", path, "--top", "2"], capsys)
    assert rc == 0 and "note: calibration runs/cal (cpu, fp32, cpu clock" in out
    assert "  default: all_gather, reduce_scatter, all_to_all, send" in out.splitlines()
    rc, out, _ = _cli(["explain", "--dp", "1", "--calibration", path], capsys)
    assert rc == 0 and "calibrated overhead 0.003" in out and "calibrated: matmul" in out


def test_another_count_of_ranks_per_host_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A calibration's rates are per-rank rates under its run's sharing of the host: a plan
    with another count per host keeps them and says so (`host_sharing_note`), in the plan's
    notes and in the estimate's; the same count, or a file that did not record it, says
    nothing."""
    assert host_sharing_note(CAL, 1) is None
    assert host_sharing_note(dataclasses.replace(CAL, ranks_per_host=0), 4) is None
    note = host_sharing_note(CAL, 2)
    assert note is not None and "calibrated with 1 rank(s) per host" in note
    assert "puts 2 on each" in note and "with 2 rank(s) per host" in note
    path = str(_write(tmp_path, calibration_toml(CAL)))
    rc, out, _ = _cli(["plan", "--gpus", "2", "--dp", "2", "--calibration", path], capsys)
    assert rc == 0 and " ".join(f"note: {note}".split()) in " ".join(out.split())  # (wrapped)
    rc, out, _ = _cli(["plan", "--gpus", "1", "--dp", "1", "--calibration", path], capsys)
    assert rc == 0 and "rank(s) per host, this plan" not in out
    two = PlanInput(MINI, CPU, 2, Layout(dp=2), 128, 16, 8, "fp32", calibration=CAL)
    assert note in estimate(two).notes
    assert "1 rank(s) per host" in describe_calibration(CAL)[0]


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--gpu", "h100-sxm"], "measured on 'cpu', this plan is for 'h100-sxm'"),
        (["--precision", "bf16"], "measured in fp32, this plan runs bf16"),
        (["--recipe", "megatron"], "drop --recipe"),
        (["--efficiency", "0.5"], "drop --efficiency"),
    ],
)
def test_plan_refuses_a_calibration_of_something_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    path = str(_write(tmp_path, calibration_toml(CAL)))
    rc, _, err = _cli(["plan", "--gpus", "8", "--calibration", path, *argv], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and words in err, err
