"""Any hardware (issue #39 item 4): a device described in TOML plans exactly like the preset whose
figures it copies; a preset's figures can be changed; every fault is one line; `plan --sweep`
re-plans per value of one figure."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from scaletrain.cli import main
from scaletrain.cli._sweep import parse_sweep
from scaletrain.config import (
    HARDWARE_PRESETS,
    ConfigError,
    Layout,
    hardware_preset,
    load_config,
    resolve_model,
)
from scaletrain.config.hardware_toml import describe_hardware, spec_figures, with_figure
from scaletrain.config.loading import read_hardware_file
from scaletrain.planner import PlanInput, estimate

# the h100-sxm preset's datasheet figures (config/hardware.py), written as a user would
H100_TOML = """\
[hardware]
gpu = "my-h100"
arch = "sm90"
peak_tflops = { fp32 = 67, tf32 = 494.7, bf16 = 989.4, fp16 = 989.4, fp8 = 1978.9 }
memory_gib = 79.10
memory_bw_gb_s = 3350
intra_node_bw_gb_s = 450
intra_node_bw_efficiency = 0.8222222222222222
nvls_allreduce_busbw_gb_s = 480
inter_node_bw_gb_s = 50
intra_node_latency_us = 5
inter_node_latency_us = 10
gpus_per_node = 8
host_to_device_bw_gb_s = 64
power_w = 700
usd_per_gpu_hour = 2.5
host_memory_gib = 2048
sm_count = 132
"""


def _write(tmp_path: Path, text: str, name: str = "hw.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_toml_copy_of_h100_is_the_preset_bit_for_bit(tmp_path: Path) -> None:
    job = load_config(None, {"hardware": read_hardware_file(_write(tmp_path, H100_TOML))})
    spec = job.hardware_spec()
    assert spec.name == "my-h100"
    assert dataclasses.replace(spec, name="h100-sxm") == hardware_preset("h100-sxm")


def test_the_shipped_description_is_the_preset() -> None:
    root = Path(__file__).resolve().parents[2]
    hw = read_hardware_file(root / "configs" / "h100-described.toml")
    spec = load_config(None, {"hardware": hw}).hardware_spec()
    assert dataclasses.replace(spec, name="h100-sxm") == hardware_preset("h100-sxm")


def _plan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "llama3-8b", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096"],
        ["--model", "llama3-70b", "--gpus", "64", "--global-batch", "64", "--seq-len", "4096"],
    ],
)
def test_toml_h100_plans_exactly_like_the_preset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    path = _write(tmp_path, H100_TOML)
    toml_json = _plan(["plan", *args, "--hardware", path, "--json", "--top", "5"], capsys)
    preset_json = _plan(["plan", *args, "--gpu", "h100-sxm", "--json", "--top", "5"], capsys)
    assert json.loads(toml_json) == json.loads(preset_json)
    assert len(json.loads(preset_json)) == 5

    def text(out: str) -> list[str]:  # the search's wall time is the one line that may differ
        return [ln for ln in out.splitlines() if "layouts evaluated" not in ln]

    toml_text = _plan(["plan", *args, "--hardware", path], capsys)
    preset_text = _plan(["plan", *args, "--gpu", "h100-sxm"], capsys)
    described = "note: hardware my-h100: described in TOML"
    assert described in toml_text.splitlines()
    kept = [ln for ln in text(toml_text) if ln != described]
    assert [ln.replace("my-h100", "h100-sxm") for ln in kept] == text(preset_text)
    # explain walks through the same arithmetic
    pinned = [*args, "--tp", "2", "--zero", "3"]
    toml_explain = _plan(["explain", *pinned, "--hardware", path], capsys)
    preset_explain = _plan(["explain", *pinned, "--gpu", "h100-sxm"], capsys)
    assert [
        ln.replace("my-h100", "h100-sxm") for ln in toml_explain.splitlines() if ln != described
    ] == preset_explain.splitlines()


@pytest.mark.parametrize("name", sorted(HARDWARE_PRESETS))
def test_every_preset_round_trips_through_its_figures(name: str) -> None:
    """Written back as TOML figures (spec_figures), each preset is itself up to the last bit of
    a unit conversion; a described A100 or V100 takes its generation from its arch, so it
    plans like the preset (FlashAttention's Hopper rate only on sm90)."""
    preset = hardware_preset(name)
    figs = spec_figures(preset)
    arch = figs.pop("arch")
    figs = {k: v for k, v in figs.items() if v}  # host memory: not stated
    described = describe_hardware(f"described-{name}", figs, arch)
    for f in dataclasses.fields(preset):
        if f.name in ("name", "notes"):
            continue
        if f.name == "fused_attention_bf16":
            # a preset-only measured table (the B200's cuDNN rates by sequence length), no
            # TOML figure yet: a described copy has none, its fused core at the matmul rate
            assert described.fused_attention_bf16 == ()
            continue
        got, want = getattr(described, f.name), getattr(preset, f.name)
        if isinstance(want, dict):
            assert got.keys() == want.keys() and all(
                got[k] == pytest.approx(want[k], rel=1e-12) for k in want
            )
        elif isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-12), f.name
        else:
            assert got == want, f.name
    if preset.is_cpu:
        return
    model = resolve_model("llama3-8b")
    for hw_spec in (preset, described):
        plan = PlanInput(
            model, hw_spec, 8, Layout(dp=4, tp=2), 4096, 32, 1, "fp16", recipe="torchtitan"
        )
        est = estimate(plan)
        if hw_spec is preset:
            want_step = est.time.step_s
    assert est.time.step_s == pytest.approx(want_step, rel=1e-9)


def test_a_preset_with_one_figure_changed() -> None:
    job = load_config(None, ["--hardware.gpu=h100-sxm", "--hardware.intra_node_bw_gb_s=900"])
    spec, base = job.hardware_spec(), hardware_preset("h100-sxm")
    assert spec.intra_node_bw == 900e9
    assert dataclasses.replace(spec, intra_node_bw=base.intra_node_bw) == base
    assert spec.notes == "h100-sxm with intra_node_bw_gb_s = 900"
    # peak_tflops replaces the dtypes it names, from TOML or the command line
    job = load_config(None, ["--hardware.gpu=a100-80gb", "--hardware.peak_tflops=bf16=400"])
    assert job.hardware_spec().peak_flops == {
        **hardware_preset("a100-80gb").peak_flops,
        "bf16": 400e12,
    }


def test_a_described_cpu_plans_like_the_cpu_preset() -> None:
    figs = {k: v for k, v in spec_figures(hardware_preset("cpu")).items() if v and k != "arch"}
    mine = describe_hardware("my-laptop", figs, "cpu")
    assert mine.is_cpu
    model = resolve_model("gpt-mini")
    a = estimate(PlanInput(model, hardware_preset("cpu"), 1, Layout(), 128, 16, 16, "fp32"))
    b = estimate(PlanInput(model, mine, 1, Layout(), 128, 16, 16, "fp32"))
    assert a.time.step_s == pytest.approx(b.time.step_s, rel=1e-9)
    assert a.memory.total == b.memory.total


@pytest.mark.parametrize(
    "overrides,field,words",
    [
        (
            ["--hardware.gpu=h100-sxm", "--hardware.memory_gb=80"],
            "hardware.memory_gb",
            "memory_gib",
        ),
        (
            ["--hardware.gpu=h100-sxm", "--hardware.memory_gib=-80"],
            "hardware.memory_gib",
            "positive",
        ),
        (["--hardware.gpu=h100-sxm", "--hardware.power_w=-1"], "hardware.power_w", "positive"),
        (
            ["--hardware.gpu=h100-sxm", "--hardware.peak_tflops=bf17=3"],
            "hardware.peak_tflops",
            "bf16",
        ),
        (
            ["--hardware.gpu=h100-sxm", "--hardware.peak_tflops=bf16=0"],
            "hardware.peak_tflops",
            "positive",
        ),
        (
            ["--hardware.gpu=h100-sxm", "--hardware.peak_tflops=bf16"],
            "hardware.peak_tflops",
            "dtype=",
        ),
        (["--hardware.gpu=h100-sxm", "--hardware.arch=sm9x"], "hardware.arch", "sm90"),
        (
            ["--hardware.gpu=h100-sxm", "--hardware.gpus_per_node=-8"],
            "hardware.gpus_per_node",
            ">= 0",
        ),
        (["--hardware.gpu=h100x"], "hardware.gpu", "did you mean 'h100-sxm'"),
        (
            ["--hardware.gpu=b200", "--hardware.fp8_mamf_share=1.5"],
            "hardware.fp8_mamf_share",
            "(0, 1.25]",
        ),
        (["--hardware.gpu=my-gpu", "--hardware.memory_gib=80"], "hardware.peak_tflops", "power_w"),
    ],
)
def test_each_fault_is_one_line_naming_the_field(
    overrides: list[str], field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert e.value.field == field
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_new_device_lists_what_it_lacks(tmp_path: Path) -> None:
    text = H100_TOML.replace("memory_bw_gb_s = 3350\n", "").replace('arch = "sm90"\n', "")
    with pytest.raises(ConfigError) as e:
        load_config(None, {"hardware": read_hardware_file(_write(tmp_path, text))})
    assert e.value.field == "hardware.memory_bw_gb_s"
    assert "add memory_bw_gb_s, arch to [hardware]" in e.value.fix
    zero = H100_TOML.replace("memory_gib = 79.10", "memory_gib = 0")  # 0 = not given
    with pytest.raises(ConfigError, match="add memory_gib"):
        load_config(None, {"hardware": read_hardware_file(_write(tmp_path, zero))})


@pytest.mark.parametrize(
    "text,words",
    [
        ("[hardwre]\nmemory_gib = 80\n", "[hardware] table"),
        ("memory_gib = 80\n", "[hardware] table"),
        ('[hardware]\nmemory_gib = "80"\n', "without quotes"),
        ("[hardware]\nmemory_gib = 80\n[model]\nname = 'x'\n", "'model'"),
        ("[hardware\n", "TOML syntax"),
    ],
)
def test_hardware_file_faults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, words: str
) -> None:
    rc = main(["plan", "--hardware", _write(tmp_path, text), "--gpus", "8"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and words in err, err


def test_file_errors_name_the_file_and_flags_win(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, H100_TOML.replace("power_w = 700", "power_w = -7"))
    assert main(["plan", "--hardware", path, "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "hardware.power_w" in err and path in err
    # a flag over the file's figure: --gpus-per-node 4 beats its 8
    path = _write(tmp_path, H100_TOML)
    out = _plan(
        ["plan", "--hardware", path, "--gpus", "8", "--gpus-per-node", "4", "--json"], capsys
    )
    ref = _plan(
        ["plan", "--gpu", "h100-sxm", "--gpus", "8", "--gpus-per-node", "4", "--json"], capsys
    )
    assert json.loads(out) == json.loads(ref)


# ---- plan --sweep ---------------------------------------------------------------------------

H100 = hardware_preset("h100-sxm")


def test_sweep_values_and_multiples() -> None:
    s = parse_sweep("hardware.intra_node_bw_gb_s=1x,2x, 1800", H100)
    assert s.field == "intra_node_bw_gb_s" and s.base == 450 and s.unit == "GB/s"
    assert [p.value for p in s.points] == [450, 900, 1800]
    s = parse_sweep("hardware.peak_tflops.fp8=0.5x", H100)
    assert s.points[0].value == pytest.approx(1978.9 / 2)
    assert with_figure(H100, "peak_tflops.fp8", 1000).peak_flops["fp8"] == 1000e12
    assert with_figure(H100, "intra_node_latency_us", 2).intra_node_latency_s == 2e-6
    assert with_figure(H100, "gpus_per_node", 4).gpus_per_node == 4


@pytest.mark.parametrize(
    "text,words",
    [
        ("batch.seq_len=1x,2x", "only [hardware] figures"),
        ("hardware.intra_node_bw=2x", "did you mean 'intra_node_bw_gb_s'"),
        ("hardware.peak_tflops=2x", "name one dtype"),
        ("hardware.peak_tflops.fp8=2x", "no fp8 rate"),
        ("hardware.gpus_per_node=1.3x", "whole number"),
        ("hardware.memory_gib=-1", "positive"),
        ("hardware.memory_gib=0x", "positive"),
        ("hardware.memory_gib=lots", "a number"),
        ("hardware.memory_gib", "hardware.FIELD="),
    ],
)
def test_sweep_faults(text: str, words: str) -> None:
    spec = hardware_preset("a100-80gb")  # no fp8 rate
    with pytest.raises(ConfigError) as e:
        parse_sweep(text, spec)
    assert e.value.field == "--sweep" and words in str(e.value)


LAYOUT = [
    "--model",
    "llama3-70b",
    "--gpus",
    "64",
    "--gpu",
    "h100-sxm",
    "--global-batch",
    "64",
    "--seq-len",
    "4096",
    "--tp",
    "8",
    "--sp",
    "--pp",
    "2",
    "--zero",
    "1",
    "--micro-batch",
    "1",
]


def test_sweep_of_nvlink_on_a_pinned_tp8_layout(capsys: pytest.CaptureFixture[str]) -> None:
    """2x NVLink halves the bandwidth part of the TP collectives (tp8 is inside a node, on the
    critical path) and nothing else; the 1x point is the plain plan."""
    rows = json.loads(
        _plan(["plan", *LAYOUT, "--sweep", "hardware.intra_node_bw_gb_s=1x,2x", "--json"], capsys)
    )
    plain = json.loads(_plan(["plan", *LAYOUT, "--json"], capsys))
    assert [r["value"] for r in rows] == [450, 900] and rows[0]["best"] == plain
    one, two = (r["best"] for r in rows)
    assert two["memory"] == one["memory"] and two["time"]["compute_s"] == one["time"]["compute_s"]
    # by hand (comm._tp_term): per micro-batch 4 all-reduces per block (SP's gather/scatter
    # pairs move the same bytes) x 40 blocks on a stage + the embedding's and head's 2, over 16
    # micro-batches; each all-reduce of act = 2 B x 4096 tokens x 8192 moves 2 x 7/8 x act at
    # the NVLink rate NCCL achieves (x intra_node_bw_efficiency, 370 of 450 GB/s) and pays 2 x 7
    # latencies
    model = resolve_model("llama3-70b")
    layout = Layout(dp=4, zero=1, tp=8, sp=True, pp=2)
    plan = PlanInput(model, H100, 64, layout, 4096, 64, 1, "bf16")
    calls = (4 * 40 + 2) * 16
    act = 2 * 4096 * model.dim

    def tp_seconds(bw: float) -> float:
        bus = bw * H100.intra_node_bw_efficiency
        return calls * (2 * 7 / 8 * act / bus + 2 * 7 * H100.intra_node_latency_s)

    e1 = estimate(plan)
    e2 = estimate(dataclasses.replace(plan, hardware=with_figure(H100, "intra_node_bw_gb_s", 900)))
    assert e1.time.comm_terms["tp"] == pytest.approx(tp_seconds(450e9), rel=1e-12)
    assert e2.time.comm_terms["tp"] == pytest.approx(tp_seconds(900e9), rel=1e-12)
    saved = tp_seconds(450e9) - tp_seconds(900e9)
    assert one["time"]["step_s"] - two["time"]["step_s"] == pytest.approx(saved, rel=1e-9)
    assert e1.time.step_s == pytest.approx(one["time"]["step_s"], rel=1e-12)


def test_sweep_table_and_search(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "gpt2-124m", "--gpus", "8", "--gpu", "a100-80gb"]
    argv += ["--global-batch", "64", "--seq-len", "1024"]
    out = _plan([*argv, "--sweep", "hardware.memory_gib=0.001x,1x"], capsys)
    lines = out.splitlines()
    assert "sweep of hardware.memory_gib on best layouts (device's own figure: 79.25 GiB)" in lines
    small = next(ln for ln in lines if ln.startswith("0.07925 (0.001x)"))
    base = next(ln for ln in lines if ln.startswith("79.25 (1x)"))
    assert small.endswith("no layout fits")
    best = json.loads(_plan([*argv, "--json", "--top", "1"], capsys))[0]
    assert (
        base.split()[2:5]
        == [
            f"{best['time']['step_s']:.3f}",
            f"{best['tokens_per_s']:,.0f}",
            f"{100 * best['mfu']:.1f}%",
        ]
        and base.split()[5] == "1.00x"
    )
    assert main(["explain", "--gpus", "8", "--sweep", "hardware.memory_gib=1x"]) == 2
    assert "use scaletrain plan" in capsys.readouterr().err
