"""llm-foundry's Triton flash attention (#39 item 2, the foundry miss class): the MPT benchmarks
ran attn_impl 'triton', a FlashAttention-1-class kernel, so the recipe's attention core runs at
FlashAttention-1's published rate (attention_core.triton_flash1_rates), not FlashAttention-2's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scaletrain.config import Layout, hardware_preset, model_preset
from scaletrain.planner import estimate
from scaletrain.planner.time.attention_core import (
    FLASH1_AMPERE_EFFICIENCY,
    FLASH2_HOPPER_BACKWARD_EFFICIENCY,
    FLASH2_HOPPER_EFFICIENCY,
    FLASH2_OVER_FLASH1,
    AttentionCore,
    attention_kernel,
    attention_seconds_per_token,
    triton_flash1_rates,
)
from scaletrain.planner.time.flops import FLASH_BACKWARD_FACTOR
from scaletrain.planner.types import PlanInput


def test_the_published_figures() -> None:
    """FA1 up to 124 TFLOP/s on the A100's 312 bf16 peak; FA2 over FA1 = 230 / 124."""
    assert round(FLASH1_AMPERE_EFFICIENCY * 312, 6) == 124.0
    assert round(FLASH2_OVER_FLASH1, 3) == 1.855


def test_only_llm_foundry_runs_the_triton_kernel() -> None:
    assert attention_kernel("llm-foundry", "model", "sdpa") == "triton_flash1"
    assert attention_kernel("llm-foundry", "naive", "sdpa") == "naive"
    assert attention_kernel("torchtitan", "model", "sdpa") == "flash2"
    assert attention_kernel("megatron", "model", "sdpa") == "fused"


@pytest.mark.parametrize("gpu", ["a100-80gb", "a100-40gb"])
def test_ampere_rate_is_fa1s(gpu: str) -> None:
    hw = hardware_preset(gpu)
    fwd, bwd, src = triton_flash1_rates(hw)
    assert fwd == bwd == pytest.approx(124e12)
    assert "124 TFLOP/s" in src


def test_hopper_rate_is_fa2s_over_the_a100_ratio() -> None:
    hw = hardware_preset("h100-sxm")
    fwd, bwd, _ = triton_flash1_rates(hw)
    peak = hw.flops("bf16")
    assert fwd == pytest.approx(peak * FLASH2_HOPPER_EFFICIENCY / FLASH2_OVER_FLASH1)
    assert bwd == pytest.approx(peak * FLASH2_HOPPER_BACKWARD_EFFICIENCY / FLASH2_OVER_FLASH1)


def test_no_figure_keeps_the_matmul_rate() -> None:
    """A device with neither an FA1 nor an FA2 figure (a V100, sm70) keeps the matmul rate."""
    assert triton_flash1_rates(hardware_preset("v100-32gb"))[:2] == (0.0, 0.0)


def _core(kernel: str, recompute: bool = False) -> AttentionCore:
    return AttentionCore(
        kernel=kernel, core_flops=1e9, heads=32, seq_len=8192, recompute=recompute, dropout=False
    )


def test_seconds_at_the_kernel_rate_never_above_the_matmul_rate() -> None:
    a100 = hardware_preset("a100-80gb")
    rate = 124e12
    for rc in (False, True):
        want = 1e9 * ((2.0 if rc else 1.0) + FLASH_BACKWARD_FACTOR) / rate
        got = attention_seconds_per_token(
            _core("triton_flash1", rc), recipe="llm-foundry", bf16_rate=2e14, hardware=a100
        )
        assert got == pytest.approx(want)
    # a matmul rate below the kernel's caps it, as for every flash kernel
    slow = attention_seconds_per_token(
        _core("triton_flash1"), recipe="llm-foundry", bf16_rate=1e14, hardware=a100
    )
    assert slow == pytest.approx(3.5e9 / 1e14)
    # a user-set efficiency (kernel_efficiency False) keeps the matmul rate
    user = attention_seconds_per_token(
        _core("triton_flash1"),
        recipe="llm-foundry",
        bf16_rate=2e14,
        hardware=a100,
        kernel_efficiency=False,
    )
    assert user == pytest.approx(3.5e9 / 2e14)


def _mpt(gpu: str, seq: int) -> PlanInput:
    # GPT-2 1.5B: a LayerNorm GELU block as MPT's, 8 GPUs under FSDP
    return PlanInput(
        replace(model_preset("gpt2-1.5b"), max_seq_len=seq),
        hardware_preset(gpu),
        8,
        Layout(dp=8, zero=3),
        seq,
        8,
        1,
        "bf16",
        recipe="llm-foundry",
    )


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_the_slower_core_weighs_more_at_long_sequences(gpu: str) -> None:
    """Against the FA2 rates the recipe's step grows with the attention's share: more at 16k
    tokens than at 1k (the core's FLOPs per token grow with s, the matmuls' do not)."""
    import scaletrain.planner.time.step_time as st

    def step(seq: int, kernel: str | None) -> float:
        p = _mpt(gpu, seq)
        if kernel is None:
            return estimate(p).time.step_s
        orig = st.attention_kernel
        st.attention_kernel = lambda *a: kernel  # type: ignore[assignment]
        try:
            return estimate(p).time.step_s
        finally:
            st.attention_kernel = orig  # type: ignore[assignment]

    short = step(1024, None) / step(1024, "flash2")
    long = step(16384, None) / step(16384, "flash2")
    assert 1.0 <= short < long


def test_explain_names_the_kernel_and_its_figure(capsys: pytest.CaptureFixture[str]) -> None:
    from scaletrain.cli import main

    rc = main(
        [
            "explain",
            "--recipe",
            "llm-foundry",
            "--model",
            "gpt2-1.5b",
            "--gpus",
            "8",
            "--gpu",
            "a100-80gb",
            "--zero",
            "3",
            "--global-batch",
            "8",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "[llm-foundry] attention core: triton_flash1 (ceiling: FlashAttention-1's" in out
