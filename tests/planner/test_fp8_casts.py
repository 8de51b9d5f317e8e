"""fp8's cost beside its GEMMs (time/fp8_casts.py): the float8 GEMM rate from the measured
fp8 / bf16 MAMF shares, and the memory-bound casts of each converted Linear by the kernels that
run them (torchao's roofline under compile, eager chains, Transformer Engine's cast-transpose).
Each is pinned against a hand computation of its formula."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset, resolve_model
from scaletrain.planner import estimate
from scaletrain.planner.recipes.registry import recipe_named
from scaletrain.planner.time.fp8_casts import (
    CAST_BYTES,
    fp8_cast_bytes_per_token,
    fp8_cast_kernels,
    fp8_cast_s,
    fp8_gemm_share,
    fp8_weight_cast_bytes,
)
from scaletrain.planner.time.step_time import default_efficiency, plan_efficiency
from scaletrain.planner.types import PlanInput

H100 = hardware_preset("h100-sxm")
LLAMA = resolve_model("llama3-8b")


def _plan(**kw) -> PlanInput:
    base = dict(
        model=LLAMA,
        hardware=H100,
        num_gpus=8,
        layout=Layout(dp=8, zero=3),
        seq_len=8192,
        global_batch=16,
        micro_batch=2,
        precision="fp8",
        ac="selective",
    )
    base.update(kw)
    return PlanInput(**base)


def test_fp8_gemm_share_is_the_measured_mamf_ratio() -> None:
    """ml-engineering's MAMF tables: H100 SXM fp8 1402.6 / 1979, bf16 794.5 / 989; H200 fp8
    1453.4 / 1979 (bf16 as H100's); B200 3432.5 / 4500 against 1745.0 / 2250; a device with
    no fp8 peak runs bf16 (1); the default efficiency is bf16's times the share."""
    assert fp8_gemm_share(H100) == pytest.approx((1402.6 / 1979) / (794.5 / 989))
    assert fp8_gemm_share(hardware_preset("h200")) == pytest.approx((1453.4 / 1979) / 0.8033, 1e-3)
    assert fp8_gemm_share(hardware_preset("b200")) == pytest.approx(
        (3432.5 / 4500) / (1745.0 / 2250)
    )
    assert fp8_gemm_share(hardware_preset("a100-80gb")) == 1.0
    assert default_efficiency("fp8", 8192, H100) == pytest.approx(0.55 * fp8_gemm_share(H100))


def test_plan_efficiency_keeps_each_generations_fp8_share() -> None:
    """An H200 has the H100's bf16 peak and MAMF but its own fp8 share: an fp8 plan on one
    must not take the other's cached efficiency, in either order (the corpus once priced
    NeMo's H100 fp8 rows at the H200's share when an H200 row came first)."""
    h200 = hardware_preset("h200")
    for first, second in ((h200, H100), (H100, h200)):
        plan_efficiency(_plan(hardware=first))
        assert plan_efficiency(_plan(hardware=second)) == pytest.approx(
            default_efficiency("fp8", LLAMA.dim, second)
        )
    assert plan_efficiency(_plan(hardware=h200)) > plan_efficiency(_plan())


def test_kernel_family_by_recipe_backend_and_compile() -> None:
    """torchtitan runs torchao's Float8Linear, fused under compile; Megatron / NeMo Transformer
    Engine; the default recipe its fp8_backend; other precisions and a CPU none."""
    tt, meg = recipe_named("torchtitan"), recipe_named("megatron")
    assert fp8_cast_kernels(_plan(compile=True), tt) == "torchao_fused"
    assert fp8_cast_kernels(_plan(), tt) == "torchao_eager"
    assert fp8_cast_kernels(_plan(), meg) == "transformer_engine"
    assert fp8_cast_kernels(_plan(), None) == "scaletrain"
    assert fp8_cast_kernels(_plan(fp8_backend="torchao"), None) == "torchao_eager"
    assert fp8_cast_kernels(_plan(compile=True), None) == "torchao_fused"
    assert fp8_cast_kernels(_plan(precision="bf16"), tt) == ""
    assert fp8_cast_kernels(_plan(), recipe_named("deepspeed")) == ""


def test_torchao_fused_bytes_per_token_by_hand() -> None:
    """Llama 3 8B block under torchtitan's op-SAC, torchao's roofline (6 B per activation and
    gradient element, 4 B for a recompute with abs / max saved): inputs 5h (wq, wk, wv, w1,
    w3) + q (wo) + f (w2), gradients q + 2kv + h + 2f + h, recomputed wk, wo, w3 inputs h + q
    + h."""
    h, q, kv, f = 4096, 4096, 1024, 14336
    want = 6 * (5 * h + q + f) + 6 * (q + 2 * kv + h + 2 * f + h) + 4 * (h + q + h)
    plan = _plan(compile=True)
    assert fp8_cast_bytes_per_token(plan, recipe_named("torchtitan")) == want
    # full AC: the forward's casts again, no op-SAC term
    full = dataclasses.replace(plan, ac="full")
    want_full = 2 * 6 * (5 * h + q + f) + 6 * (q + 2 * kv + h + 2 * f + h)
    assert fp8_cast_bytes_per_token(full, recipe_named("torchtitan")) == want_full


def test_transformer_engine_casts_by_hand_and_no_weight_casts() -> None:
    """Fused QKV and fc1 after the norm (a 2 B transpose each), proj and fc2 cast-transposed
    (4 B), the four output gradients 4 B; weights cached per step: none per micro-batch."""
    h, q, kv, f = 4096, 4096, 1024, 14336
    meg = recipe_named("megatron")
    plan = _plan(ac="none")
    want = 2 * 2 * h + 4 * (q + f) + 4 * (q + 2 * kv + h + 2 * f + h)
    assert fp8_cast_bytes_per_token(plan, meg) == want
    assert fp8_weight_cast_bytes(plan, meg, 1e9) == 0.0
    assert CAST_BYTES["transformer_engine"].activation < CAST_BYTES["torchao_fused"].activation


def test_weight_casts_per_micro_batch_and_fp8_all_gather() -> None:
    """torchao fused: 8 B per weight element per micro-batch (+5 B forward under full AC);
    torchao's fp8 all-gather hands the Linear fp8 weights: no cast; ours dequantizes after
    the gather, so its 64 B stay."""
    tt = recipe_named("torchtitan")
    plan = _plan(compile=True)
    assert fp8_weight_cast_bytes(plan, tt, 1e9) == 8e9
    assert fp8_weight_cast_bytes(dataclasses.replace(plan, ac="full"), tt, 1e9) == 13e9
    gathered = dataclasses.replace(plan, fp8_all_gather=True)
    assert fp8_weight_cast_bytes(gathered, tt, 1e9) == 0.0
    ours = dataclasses.replace(_plan(), fp8_all_gather=True)
    assert fp8_weight_cast_bytes(ours, None, 1e9) == 64e9


def test_casts_add_their_bytes_over_bandwidth_to_the_step() -> None:
    """The torchtitan fp8 compiled step's compute holds its casts as bytes over memory
    bandwidth: halving the bandwidth adds exactly the casts once more beyond what it adds to
    the same step in bf16 (whose memory-bound terms, the compiled block's fused kernels and
    FSDP2's copies, fp8 shares without the fp8 all-gather): per-token casts x tokens x blocks
    + 8 B per converted weight; a set efficiency charges none."""
    tt = recipe_named("torchtitan")

    def added(plan: PlanInput) -> float:
        slow = dataclasses.replace(
            plan, hardware=dataclasses.replace(H100, memory_bw=H100.memory_bw / 2)
        )
        return estimate(slow).time.compute_s - estimate(plan).time.compute_s

    plan = _plan(compile=True, recipe="torchtitan")
    params = LLAMA.param_counts()
    linear = LLAMA.num_layers * (params.attention_per_tp(1) + params.mlp)
    tokens = plan.seq_len * plan.micro_batch
    casts = (
        tokens * LLAMA.num_layers * fp8_cast_bytes_per_token(plan, tt) + 8.0 * linear
    ) / H100.memory_bw
    delta = added(plan) - added(dataclasses.replace(plan, precision="bf16"))
    assert delta == pytest.approx(casts, rel=1e-9)
    assert casts == pytest.approx(0.10, rel=0.05)  # Llama 3 8B, 16,384 tokens, 3.35 TB/s
    assert fp8_cast_s(dataclasses.replace(plan, efficiency=0.5), tt) == 0.0


def test_b200_fp8_to_bf16_gemm_rate_is_the_measured_mamf_ratio() -> None:
    """On a B200 a large fp8 GEMM runs at the measured fp8 / bf16 MAMF ratio of the bf16 one
    (ml-engineering's MAMF tables: 3432.5 / 1745.0 TFLOP/s, 1.97x), not at the 2x peak ratio:
    the planner's rate (efficiency x peak) keeps what the measurement says."""
    b200 = hardware_preset("b200")
    fp8 = default_efficiency("fp8", 8192, b200) * b200.peak_flops["fp8"]
    bf16 = default_efficiency("bf16", 8192, b200) * b200.peak_flops["bf16"]
    assert fp8 / bf16 == pytest.approx(3432.5 / 1745.0)
