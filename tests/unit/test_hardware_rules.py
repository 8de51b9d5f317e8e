"""Hardware rules (issue #37 items 4-5): which precisions each GPU generation runs, the train
refusal and the plan mark that apply them, and TF32 for fp32 matmuls (trainer and planner)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from scaletrain.cli import main
from scaletrain.config import (
    HARDWARE_PRESETS,
    ConfigError,
    JobConfig,
    PrecisionConfig,
    hardware_preset,
    precision_problem,
)
from scaletrain.config.hardware_rules import CPU_ARCH, amd_arch, nvidia_arch, runs_tf32
from scaletrain.config.loading import load_config
from scaletrain.trainer.precision import check_device_precision, set_tf32

# preset -> the precisions it runs under scaletrain (bf16 sm80+, fp8 sm89+, fp8 OCP only)
RUNS = {
    "v100-32gb": {"fp32", "fp16"},
    "v100-16gb": {"fp32", "fp16"},
    "a100-40gb": {"fp32", "fp16", "bf16"},
    "a100-80gb": {"fp32", "fp16", "bf16"},
    "rtx3090": {"fp32", "fp16", "bf16"},
    "rtx4090": {"fp32", "fp16", "bf16", "fp8"},
    "h100-sxm": {"fp32", "fp16", "bf16", "fp8"},
    "h100-hbm2e-500w": {"fp32", "fp16", "bf16", "fp8"},
    "h100-pcie": {"fp32", "fp16", "bf16", "fp8"},
    "h200": {"fp32", "fp16", "bf16", "fp8"},
    "h800": {"fp32", "fp16", "bf16", "fp8"},
    "b200": {"fp32", "fp16", "bf16", "fp8"},
    "mi300x": {"fp32", "fp16", "bf16"},  # float8 FNUZ only: not our OCP e4m3fn GEMMs
    "cpu": {"fp32", "fp16", "bf16", "fp8"},  # never refused on a CPU
}


def test_every_preset_states_what_it_runs() -> None:
    assert set(RUNS) == set(HARDWARE_PRESETS)
    for name in HARDWARE_PRESETS:
        spec = hardware_preset(name)
        runs = {
            d for d in ("fp32", "bf16", "fp16", "fp8") if not precision_problem(d, spec.arch, name)
        }
        assert runs == RUNS[name], name
        assert (spec.arch == CPU_ARCH) == (name == "cpu"), name
        # a datasheet rate the rules deny would be planned yet refused by train
        for dtype in ("bf16", "fp8"):
            if dtype in spec.peak_flops and dtype not in runs and spec.arch.vendor == "nvidia":
                pytest.fail(f"{name} lists a {dtype} rate but cannot run {dtype}")
        assert ("tf32" in spec.peak_flops) <= runs_tf32(spec.arch), name


def test_reasons_name_the_rule_the_gpu_and_the_fix() -> None:
    v100 = hardware_preset("v100-32gb")
    why = precision_problem("bf16", v100.arch, v100.name)
    assert why == "bf16 needs sm80+ (Ampere or newer); v100-32gb is Volta (sm70): use fp16 or fp32"
    a100 = hardware_preset("a100-80gb")
    why = precision_problem("fp8", a100.arch, a100.name)
    assert why == "fp8 needs sm89+ (Ada, Hopper or newer); a100-80gb is Ampere (sm80): use bf16"
    assert "FNUZ" in (precision_problem("fp8", amd_arch("gfx942:sramecc+:xnack-"), "MI300X") or "")


def test_generations_from_compute_capability() -> None:
    assert nvidia_arch((8, 6)).label() == "Ampere (sm86)"
    assert nvidia_arch((8, 9)).label() == "Ada (sm89)"
    assert nvidia_arch((9, 0)).label() == "Hopper (sm90)"
    assert nvidia_arch((10, 0)).label() == "Blackwell (sm100)"
    assert nvidia_arch((7, 5)).label() == "Turing (sm75)"
    assert amd_arch("gfx942:sramecc+:xnack-").label() == "CDNA3 (gfx942)"


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch's CUDA queries answering as an A100 would (the CPU build has no device)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.version, "hip", None)
    yield


@pytest.fixture
def restore_tf32() -> Iterator[None]:
    before = torch.backends.cuda.matmul.fp32_precision
    yield
    torch.backends.cuda.matmul.fp32_precision = before


def test_train_refuses_fp8_on_an_a100_in_one_line(fake_gpu: None) -> None:
    with pytest.raises(ConfigError) as e:
        check_device_precision(PrecisionConfig(dtype="fp8"), torch.device("cuda", 0))
    msg = str(e.value)
    assert e.value.field == "precision.dtype" and "\n" not in msg
    assert "A100" in msg and "sm89+" in msg
    check_device_precision(PrecisionConfig(dtype="bf16"), torch.device("cuda", 0))


def test_train_on_a_cpu_is_never_refused() -> None:
    for dtype in ("fp32", "bf16", "fp16", "fp8"):
        check_device_precision(PrecisionConfig(dtype=dtype), torch.device("cpu"))


def test_tf32_on_by_default_on_sm80_off_by_the_knob(fake_gpu: None, restore_tf32: None) -> None:
    cuda = torch.device("cuda", 0)
    assert set_tf32(PrecisionConfig(), cuda)
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert not set_tf32(PrecisionConfig(tf32=False), cuda)
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert not set_tf32(PrecisionConfig(), torch.device("cpu"))  # no tensor cores to use
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"


def test_tf32_not_on_a_volta(monkeypatch: pytest.MonkeyPatch, restore_tf32: None) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    assert not set_tf32(PrecisionConfig(), torch.device("cuda", 0))


def test_planner_times_fp32_matmuls_by_the_same_rule() -> None:
    on = load_config(None, ["--hardware.gpu=a100-80gb", "--precision.dtype=fp32"])
    off = load_config(None, ["--hardware.gpu=a100-80gb", "--precision.tf32=false"])
    assert on.hardware_spec().flops("fp32") == 156e12  # the TF32 tensor-core rate
    assert off.hardware_spec().flops("fp32") == 19.5e12  # plain fp32
    assert off.hardware_spec().flops("bf16") == 312e12  # other dtypes unchanged
    assert hardware_preset("v100-32gb").flops("fp32") == 15.7e12  # no TF32 on Volta
    assert JobConfig().hardware_spec() == hardware_preset("cpu")  # tf32 on: the preset as is


def test_mfu_of_a_detected_gpu_follows_the_knob(fake_gpu: None) -> None:
    from scaletrain.trainer.build import detect_hardware

    cuda = torch.device("cuda", 0)
    on = detect_hardware(load_config(None, []), cuda)
    off = detect_hardware(load_config(None, ["--precision.tf32=false"]), cuda)
    assert on.name == off.name == "a100-80gb"
    assert (on.flops("fp32"), off.flops("fp32")) == (156e12, 19.5e12)


def test_tf32_knob_is_a_checked_boolean() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, ["--precision.tf32=maybe"])
    assert e.value.field == "precision.tf32"


@pytest.mark.parametrize("cmd", ["plan", "explain"])
def test_plan_marks_a_precision_the_gpu_cannot_run(
    cmd: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [cmd, "--model", "gpt2-124m", "--gpus", "8", "--dp", "8", "--precision", "bf16"]
    assert main([*argv, "--gpu", "v100-32gb"]) == 0
    out = capsys.readouterr().out
    marks = [line for line in out.splitlines() if line.startswith("UNRUNNABLE")]
    assert marks == [
        "UNRUNNABLE: precision.dtype='bf16': bf16 needs sm80+ (Ampere or newer); v100-32gb is "
        "Volta (sm70): use fp16 or fp32 (train refuses it)"
    ]
    assert main([*argv, "--gpu", "a100-80gb"]) == 0
    assert "UNRUNNABLE" not in capsys.readouterr().out
