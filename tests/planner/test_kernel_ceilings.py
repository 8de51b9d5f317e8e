"""Per-device kernel ceilings (planner/time/efficiency.py attention_ceiling, kernel_ceilings;
HardwareSpec.intra_node_busbw): each device's own published figure where one is cited, another
device's only where the cause carries over (sm90's FlashAttention-2), and `explain` says which."""

from __future__ import annotations

import dataclasses
import math

import pytest

from scaletrain.config import ConfigError, Layout, hardware_preset, load_config, resolve_model
from scaletrain.planner import estimate
from scaletrain.planner.output.explain import explain
from scaletrain.planner.time.attention_core import (
    FLASH2_HOPPER_EFFICIENCY,
    AttentionCore,
    attention_ceiling,
    attention_seconds_per_token,
    fused_attention_rates,
    kernel_ceilings,
)
from scaletrain.planner.time.comm import axis_link
from scaletrain.planner.time.flops import FLASH_BACKWARD_FACTOR
from scaletrain.planner.types import PlanInput

MI300X = hardware_preset("mi300x")
CORE = AttentionCore(
    kernel="flash2", core_flops=1e9, heads=32, seq_len=8192, recompute=False, dropout=False
)


def _flash_s(hw_spec: object, bf16_rate: float) -> float:
    return attention_seconds_per_token(
        CORE, recipe="torchtitan", bf16_rate=bf16_rate, hardware=hw_spec
    )


def test_mi300x_attention_takes_its_own_figure_not_the_h100s() -> None:
    """MI300X: its own flash-attn (CK) forward + backward figure, 231.57 TFLOP/s (ROCm/flash-
    attention issue #142), 17.7% of its peak: not the H100's 35%, whose cause is Hopper's
    instructions. A matmul rate above it is capped to it."""
    rate, why = attention_ceiling(MI300X)
    assert rate == 231.57e12 and "mi300x's own measured figure" in why
    assert rate / MI300X.flops("bf16") == pytest.approx(0.177, abs=0.001)
    fast = 0.5 * MI300X.flops("bf16")
    assert _flash_s(MI300X, fast) == pytest.approx(1e9 * (1 + FLASH_BACKWARD_FACTOR) / rate)


def test_a_device_with_no_figure_keeps_the_matmul_rate() -> None:
    """A non-sm90 part with no measured figure (A100: FA2 reaches 50-73% of peak) keeps its
    matmul rate, even above 35% of its peak."""
    a100 = hardware_preset("a100-80gb")
    rate, why = attention_ceiling(a100)
    assert rate == 0.0 and "no published figure" in why
    fast = 0.5 * a100.flops("bf16")
    assert _flash_s(a100, fast) == pytest.approx(1e9 * (1 + FLASH_BACKWARD_FACTOR) / fast)


@pytest.mark.parametrize("name", ["h100-sxm", "h200", "h800", "h100-pcie"])
def test_every_sm90_part_takes_the_h100_figure_and_says_so(name: str) -> None:
    hw_spec = hardware_preset(name)
    rate, why = attention_ceiling(hw_spec)
    assert rate == pytest.approx(hw_spec.flops("bf16") * FLASH2_HOPPER_EFFICIENCY)
    assert "H100 SXM's" in why


@pytest.mark.parametrize("name", ["h100-sxm", "h200", "h100-hbm2e-500w"])
def test_every_sm90_part_takes_the_h100_backward_figure(name: str) -> None:
    """The flash core's backward on an sm90 part: the H100's published FA2 backward share
    of peak, below its forward's."""
    from scaletrain.planner.time.attention_core import (
        FLASH2_HOPPER_BACKWARD_EFFICIENCY,
        attention_backward_ceiling,
    )

    hw_spec = hardware_preset(name)
    bwd = attention_backward_ceiling(hw_spec)
    assert bwd == pytest.approx(hw_spec.flops("bf16") * FLASH2_HOPPER_BACKWARD_EFFICIENCY)
    assert bwd < attention_ceiling(hw_spec)[0]


def test_backward_ceiling_none_or_the_devices_own() -> None:
    """No backward ceiling where the device has no published figure (A100: the matmul rate);
    a device's own single measured figure caps both passes."""
    from scaletrain.planner.time.attention_core import attention_backward_ceiling

    assert attention_backward_ceiling(hardware_preset("a100-80gb")) == 0.0
    assert attention_backward_ceiling(MI300X) == attention_ceiling(MI300X)[0]
    own = dataclasses.replace(hardware_preset("h100-sxm"), attention_bf16=300e12)
    assert attention_backward_ceiling(own) == 300e12


def test_a_measured_attention_figure_wins_over_the_fallback() -> None:
    """`attention_bf16` (a preset's citation or [hardware] attention_bf16_tflops) caps the
    flash core on any device; a matmul rate below it is kept."""
    for base in (MI300X, hardware_preset("h100-sxm")):
        measured = dataclasses.replace(base, attention_bf16=300e12)
        assert attention_ceiling(measured)[0] == 300e12
        assert "own measured" in attention_ceiling(measured)[1]
        want = 1e9 * (1 + FLASH_BACKWARD_FACTOR) / 300e12
        assert _flash_s(measured, 600e12) == pytest.approx(want)
        assert _flash_s(measured, 200e12) == pytest.approx(want * 300 / 200)


def test_intra_node_collectives_run_at_the_achieved_share() -> None:
    """MI300X: the 318.98 GB/s all-reduce bus bandwidth AMD's RCCL / xGMI blog measures on 8
    GPUs (rccl-tests) of the 448 GB/s raw figure; NVLink parts their cited share; a part with
    none keeps the raw link figure."""
    assert MI300X.intra_node_bw_efficiency == pytest.approx(318.98 / 448)
    bw, _, inter = axis_link(Layout(dp=8, zero=3), MI300X, "dp")
    assert not inter and bw == pytest.approx(318.98e9)
    # across nodes the multi-rail figure is capped by the achieved intra-node one
    bw16 = axis_link(Layout(dp=16, zero=3), MI300X, "dp")[0]
    assert bw16 == pytest.approx(min(318.98e9, 8 * MI300X.inter_node_bw))
    # H100 / H200: the NCCL maintainer's 370 of 450 GB/s; H800 its own 160 of 200
    for name, busbw in (("h100-sxm", 370e9), ("h200", 370e9), ("h800", 160e9)):
        assert axis_link(Layout(dp=8), hardware_preset(name), "dp")[0] == pytest.approx(busbw)
    # V100 / A100 / B200: NCCL's per-link model (20 of 25, 40.1 of 50 GB/s)
    for name, busbw in (("v100-32gb", 120e9), ("a100-80gb", 240e9), ("b200", 900e9 * 40.1 / 50)):
        assert axis_link(Layout(dp=8), hardware_preset(name), "dp")[0] == pytest.approx(busbw)
    pcie = hardware_preset("h100-pcie")  # no cited achieved share: the raw link
    assert pcie.intra_node_bw_efficiency == 1.0
    assert axis_link(Layout(dp=8), pcie, "dp")[0] == pcie.intra_node_bw


def test_mi300x_subgroups_reach_their_peers_links_only() -> None:
    """MI300X's xGMI is a full mesh, one 64 GB/s link per pair (AMD's RCCL / xGMI blog): a
    group of g < 8 GPUs reaches (g - 1) links x the achieved share, all eight the 448 GB/s x
    it (318.98 GB/s); a pair 45.6 GB/s, inside the blog's TransferBench 45.1-47.2 per link."""
    share = 318.98 / 448
    assert MI300X.intra_node_pair_bw == 64e9
    assert MI300X.intra_node_group_busbw(2) == pytest.approx(64e9 * share)
    assert 45.1e9 < MI300X.intra_node_group_busbw(2) < 47.2e9
    assert MI300X.intra_node_group_busbw(4) == pytest.approx(3 * 64e9 * share)
    assert MI300X.intra_node_group_busbw(8) == pytest.approx(318.98e9)
    assert axis_link(Layout(tp=4, dp=2), MI300X, "tp")[0] == pytest.approx(3 * 64e9 * share)
    assert axis_link(Layout(dp=8, zero=3), MI300X, "dp")[0] == pytest.approx(318.98e9)


def test_achieved_share_slows_an_mi300x_plan_by_the_comm_only() -> None:
    """The same ZeRO-3 plan with the raw xGMI figure: identical compute, less communication
    time (every intra-node collective at 1 / 0.75 the bandwidth)."""
    model = resolve_model("llama3-8b")

    def plan(hw_spec: object) -> PlanInput:
        return PlanInput(model, hw_spec, 8, Layout(dp=8, zero=3), 4096, 8, 1, "bf16")

    raw = estimate(plan(dataclasses.replace(MI300X, intra_node_bw_efficiency=1.0)))
    real = estimate(plan(MI300X))
    assert real.time.compute_s == pytest.approx(raw.time.compute_s)
    for k, v in raw.time.comm_terms.items():
        assert real.time.comm_terms[k] == pytest.approx(v / 0.75, rel=0.05) or v == 0.0


def test_toml_sets_each_ceiling_and_refuses_a_share_above_one() -> None:
    job = load_config(
        None,
        [
            "--hardware.gpu=h100-sxm",
            "--hardware.attention_bf16_tflops=500",
            "--hardware.intra_node_bw_efficiency=0.8",
        ],
    )
    spec = job.hardware_spec()
    assert spec.attention_bf16 == 500e12 and spec.intra_node_bw_efficiency == 0.8
    assert spec.intra_node_busbw == pytest.approx(0.8 * 450e9)
    with pytest.raises(ConfigError, match="intra_node_bw_efficiency"):
        load_config(
            None, ["--hardware.gpu=mi300x", "--hardware.intra_node_bw_efficiency=1.25"]
        ).hardware_spec()


def test_explain_names_each_ceilings_source() -> None:
    model = resolve_model("llama3-8b")
    est = estimate(PlanInput(model, MI300X, 8, Layout(dp=8, zero=3), 4096, 8, 1, "bf16"))
    text = explain(est)
    assert "kernel ceilings of mi300x" in text
    lines = kernel_ceilings(MI300X)
    for line in lines:
        assert line in text
    assert "own measured MAMF 668.4" in lines[0]
    assert "232 TFLOP/s, mi300x's own measured figure" in lines[1]
    assert "319 GB/s" in lines[2] and "published achieved share" in lines[2]
    h100_lines = kernel_ceilings(hardware_preset("h100-sxm"))
    assert "no MAMF measured" in h100_lines[0] and "370 GB/s" in h100_lines[2]
    assert "raw link figure" in kernel_ceilings(hardware_preset("rtx4090"))[2]


B200 = hardware_preset("b200")
FUSED = dataclasses.replace(CORE, kernel="fused")


def _fused_s(hw_spec: object, bf16_rate: float, core: AttentionCore = FUSED) -> float:
    return attention_seconds_per_token(core, recipe="nemo", bf16_rate=bf16_rate, hardware=hw_spec)


def test_b200_fused_attention_runs_at_its_measured_cudnn_rates() -> None:
    """B200: cuDNN 9.13's own forward / backward figures (NVIDIA/cudnn-frontend
    sdpa_bf16_benchmark_results_NVIDIA_B200.csv, 'pyt_cudnn'), 1171.278 / 942.509 TFLOP/s at
    8192, below the matmul rate: forward and backward each run at theirs."""
    fwd, bwd = fused_attention_rates(B200, 8192)
    assert (fwd, bwd) == (1171.278e12, 942.509e12)
    fast = 0.6 * B200.flops("bf16")  # above both
    want = 1e9 * (1.0 / fwd + FLASH_BACKWARD_FACTOR / bwd)
    assert _fused_s(B200, fast) == pytest.approx(want)
    # a forward recompute runs at the forward's rate
    rc = dataclasses.replace(FUSED, recompute=True)
    assert _fused_s(B200, fast, rc) == pytest.approx(want + 1e9 / fwd)
    # a matmul rate below both is kept
    slow = 500e12
    assert _fused_s(B200, slow) == pytest.approx(1e9 * (1 + FLASH_BACKWARD_FACTOR) / slow)
    # a user-set efficiency keeps the matmul rate
    plain = attention_seconds_per_token(
        FUSED, recipe="nemo", bf16_rate=fast, hardware=B200, kernel_efficiency=False
    )
    assert plain == pytest.approx(1e9 * (1 + FLASH_BACKWARD_FACTOR) / fast)


def test_b200_fused_table_reads_in_log_length_and_holds_its_ends() -> None:
    f4, b4 = fused_attention_rates(B200, 4096)
    f8, b8 = fused_attention_rates(B200, 8192)
    w = math.log2(6144) - 12
    f6, b6 = fused_attention_rates(B200, 6144)
    assert f6 == pytest.approx(f4 + w * (f8 - f4)) and b6 == pytest.approx(b4 + w * (b8 - b4))
    assert fused_attention_rates(B200, 128) == fused_attention_rates(B200, 512)
    assert fused_attention_rates(B200, 1 << 20) == fused_attention_rates(B200, 131072)
    # a context-parallel call's chunk (kernel_seq_len) picks the row, not the full length
    chunk = dataclasses.replace(FUSED, seq_len=65536, kernel_seq_len=8192)
    fast = 0.6 * B200.flops("bf16")
    assert _fused_s(B200, fast, chunk) == pytest.approx(_fused_s(B200, fast))


def test_fused_attention_without_a_table_keeps_the_matmul_rate() -> None:
    """H100 (cuDNN runs above its matmul rate: no published shortfall) and every part without
    a cited table: the fused core at the matmul rate; the B200's flash2 core too (no FA2
    figure set for it)."""
    for name in ("h100-sxm", "mi300x", "a100-80gb"):
        hw_spec = hardware_preset(name)
        assert fused_attention_rates(hw_spec, 8192) == (0.0, 0.0)
        fast = 0.5 * hw_spec.flops("bf16")
        assert _fused_s(hw_spec, fast) == pytest.approx(1e9 * (1 + FLASH_BACKWARD_FACTOR) / fast)
    fast = 0.5 * B200.flops("bf16")
    assert _flash_s(B200, fast) == pytest.approx(1e9 * (1 + FLASH_BACKWARD_FACTOR) / fast)


def test_explain_names_the_b200_cudnn_table() -> None:
    line = kernel_ceilings(B200)[1]
    assert "cuDNN fused" in line and "1171 / 943 TFLOP/s" in line and "b200's own" in line
    assert "cuDNN" not in kernel_ceilings(hardware_preset("h100-sxm"))[1]
