"""The elementwise kernels of MoE blocks (time.elementwise): torchtitan's MoE block run eager
(torchtitan_moe_elementwise_bytes) and a Megatron-Core MoE layer's non-expert kernels
(mcore_elementwise_bytes with moe_layer), each against a hand count of the kernels their
docstrings name for Qwen3-30B-A3B (h 2048, q 4096, kv 512, k 8 routed rows of f 768, qk_norm),
and when the planner charges them (torchtitan_moe_block_eager)."""

from __future__ import annotations

import pytest

from scaletrain.config import Layout, hardware_preset, model_preset
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.time.elementwise import (
    eager_elementwise_s,
    torchtitan_moe_block_eager,
    torchtitan_moe_elementwise_bytes,
)
from scaletrain.planner.types import PlanInput

QWEN = model_preset("qwen3-30b-a3b")


def _hand(recompute: bool) -> float:
    h, q, kv, k, f = 2048, 4096, 512, 8, 768
    norms = 2 * h + q + kv  # attention_norm, ffn_norm, q_norm, k_norm elements
    fwd = 40.25 * h + 20 * kv + 4 * norms + 10 * k * f + 6 * k * h + 4 * h
    tot = 95.5 * h + 44 * kv + 10 * norms + 28 * k * f + 12 * k * h + 8 * h
    return tot + (fwd if recompute else 0.0)


def _plan(recipe: str, ac: str = "full", compile_: bool = True) -> PlanInput:
    L = Layout(dp=8, ep=8, zero=3)
    return PlanInput(
        QWEN,
        hardware_preset("b200"),
        8,
        L,
        4096,
        64,
        8,
        "bf16",
        ac,
        recipe=recipe,
        compile=compile_,
    )


@pytest.mark.parametrize("recompute", [True, False])
def test_hand_count(recompute: bool) -> None:
    got = torchtitan_moe_elementwise_bytes(QWEN, recompute=recompute)
    assert got == pytest.approx(_hand(recompute), rel=1e-12)


def test_charged_when_eager() -> None:
    hw = hardware_preset("b200")
    # compile + full AC: the checkpointed MoE block graph-breaks and runs eager
    p = _plan("torchtitan", "full", True)
    assert torchtitan_moe_block_eager(p)
    want = _hand(True) / hw.memory_bw
    assert eager_elementwise_s(p, RECIPES["torchtitan"]) == pytest.approx(want, rel=1e-12)
    # no compile, no AC: eager, no recompute
    p = _plan("torchtitan", "none", False)
    want = _hand(False) / hw.memory_bw
    assert eager_elementwise_s(p, RECIPES["torchtitan"]) == pytest.approx(want, rel=1e-12)


def test_not_charged() -> None:
    # compiled without AC: the compiled regions are not counted
    p = _plan("torchtitan", "none", True)
    assert not torchtitan_moe_block_eager(p)
    assert eager_elementwise_s(p, RECIPES["torchtitan"]) == 0.0
    # AutoModel's own MoE block (it inherits the torchtitan recipe's other terms)
    assert RECIPES["automodel"].moe_block == "none"
    assert eager_elementwise_s(_plan("automodel"), RECIPES["automodel"]) == 0.0


def _mcore_moe_hand(fp8: bool) -> float:
    """A Megatron-Core MoE layer's non-expert kernels, per token: two norms, two
    bias-dropout-adds, RoPE on q and k, the v and GQA q copies, the QKV-gradient cat; fp8: the
    input norm writes 1 B."""
    h, q, kv = 2048, 4096, 512
    fwd = 4 * 2 * h + 6 * 2 * h + 4 * (q + kv) + 4 * kv + 4 * q - (h if fp8 else 0)
    bwd = 12 * 2 * h + 4 * (q + kv) + 4 * (q + 2 * kv)
    return bwd + fwd


@pytest.mark.parametrize("precision,fp8", [("fp8", True), ("bf16", False)])
def test_mcore_moe_layer_non_expert_kernels(precision: str, fp8: bool) -> None:
    hw = hardware_preset("b200")
    L = Layout(dp=8, ep=8, zero=1)
    p = PlanInput(QWEN, hw, 8, L, 4096, 64, 1, precision, "none", recipe="nemo")
    want = _mcore_moe_hand(fp8) / hw.memory_bw
    assert eager_elementwise_s(p, RECIPES["nemo"]) == pytest.approx(want, rel=1e-12)
