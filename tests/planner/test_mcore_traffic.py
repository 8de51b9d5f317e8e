"""The HBM traffic of a Megatron-Core decoder layer's fused non-GEMM kernels on Transformer
Engine (elementwise.mcore_elementwise_bytes), against a recount written out here kernel by
kernel, and its charge in the megatron / nemo recipes' block time."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import ModelConfig
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.time.elementwise import mcore_elementwise_bytes

from ._recipe_step import one_llama_block

E = 2  # bytes of a 16-bit activation


def _kernels(
    m: ModelConfig, fp8: bool, dropout: bool
) -> dict[str, list[tuple[list[float], list[float]]]]:
    """(bytes read, bytes written) per kernel, per token, forward and backward, tensor by
    tensor: 16-bit tensors at E bytes per element, dropout masks at 1, fp8 norm outputs at 1."""
    h, q, kv, f = m.dim, m.q_dim, m.kv_dim, m.ffn_dim
    rope, gqa, gated = m.position == "rope", kv < q, m.gated_mlp
    norm_out = 1 if fp8 else E
    fwd: list[tuple[list[float], list[float]]] = [
        ([E * h], [norm_out * h]),  # input norm in linear_qkv: x -> ln_out (saved)
    ]
    if rope:
        if gqa:
            fwd.append(([E * q], [E * q]))  # query.reshape across query groups: a copy
        fwd.append(([E * q], [E * q]))  # fused RoPE on q
        fwd.append(([E * kv], [E * kv]))  # fused RoPE on k
        fwd.append(([E * kv], [E * kv]))  # v made contiguous for TE's attention
    mask = [1.0 * h] if dropout else []
    fwd += [
        ([E * h, E * h], [E * h] + mask),  # bias-dropout-add after proj
        ([E * h], [norm_out * h]),  # pre-MLP norm in linear_fc1
        ([2 * E * f] if gated else [E * f], [E * f]),  # bias-SwiGLU / bias-GELU
        ([E * h, E * h], [E * h] + mask),  # bias-dropout-add after fc2
    ]
    bwd: list[tuple[list[float], list[float]]] = []
    if dropout:
        bwd.append(([E * h, 1.0 * h], [E * h]))  # fc2 branch: dropout backward
    if m.bias:
        bwd.append(([E * h], []))  # fc2 bias gradient
    if gated:
        bwd.append(([E * f, 2 * E * f], [2 * E * f]))  # swiglu_back
    else:
        bwd.append(([E * f, E * f], [E * f]))  # bias_gelu_back
        if m.bias:
            bwd.append(([E * f], []))  # fc1 bias gradient
    bwd += [
        ([E * h, E * h], [E * h]),  # pre-MLP norm backward: dy, x -> dx
        ([E * h, E * h], [E * h]),  # dx + the residual stream's gradient
    ]
    if dropout:
        bwd.append(([E * h, 1.0 * h], [E * h]))  # proj branch: dropout backward
    if m.bias:
        bwd.append(([E * h], []))  # proj bias gradient
    if rope:
        bwd.append(([E * q], [E * q]))  # RoPE backward on dq
        bwd.append(([E * kv], [E * kv]))  # RoPE backward on dk
        bwd.append(([E * (q + 2 * kv)], [E * (q + 2 * kv)]))  # SplitAlongDim: cat
    bwd += [
        ([E * h, E * h], [E * h]),  # input norm backward
        ([E * h, E * h], [E * h]),  # dx + the residual stream's gradient
    ]
    return {"fwd": fwd, "bwd": bwd}


def _recount(m: ModelConfig, *, fp8: bool, dropout: bool, recompute: bool) -> float:
    k = _kernels(m, fp8, dropout)
    fwd = sum(sum(r) + sum(w) for r, w in k["fwd"])
    bwd = sum(sum(r) + sum(w) for r, w in k["bwd"])
    return bwd + fwd * (2 if recompute else 1)


def _gpt(h: int, heads: int) -> ModelConfig:
    return ModelConfig(
        dim=h,
        num_heads=heads,
        num_kv_heads=heads,
        ffn_dim=4 * h,
        num_layers=1,
        norm="layernorm",
        activation="gelu",
        position="learned",
        bias=True,
    )


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize(
    "m",
    [
        one_llama_block(4096, 32, 8, 14336),  # Llama 3 8B (GQA)
        one_llama_block(4096, 32, 32, 11008),  # Llama 2 7B (MHA: no query copy)
        one_llama_block(768, 12, 4, 2048),
    ],
)
def test_mcore_llama_bytes_recounted(m: ModelConfig, fp8: bool, recompute: bool) -> None:
    want = _recount(m, fp8=fp8, dropout=False, recompute=recompute)
    got = mcore_elementwise_bytes(m, fp8_norm_out=fp8, dropout=False, recompute=recompute)
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("dropout", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_mcore_gpt_bytes_recounted(dropout: bool, recompute: bool) -> None:
    m = _gpt(2304, 24)
    want = _recount(m, fp8=False, dropout=dropout, recompute=recompute)
    got = mcore_elementwise_bytes(m, fp8_norm_out=False, dropout=dropout, recompute=recompute)
    assert got == pytest.approx(want, rel=1e-12)


def test_mcore_bytes_worked_figures() -> None:
    """The docstring's figures: Llama 3 8B under fp8 58h + 20kv + 16f, Llama 2 7B 74h + 16f."""
    assert mcore_elementwise_bytes(
        one_llama_block(4096, 32, 8, 14336), fp8_norm_out=True, dropout=False, recompute=False
    ) == (58 * 4096 + 20 * 1024 + 16 * 14336)
    assert mcore_elementwise_bytes(
        one_llama_block(4096, 32, 32, 11008), fp8_norm_out=True, dropout=False, recompute=False
    ) == (74 * 4096 + 16 * 11008)


def test_megatron_and_nemo_charge_the_fused_kernels() -> None:
    """The megatron and nemo recipes charge mcore_elementwise_bytes over memory bandwidth in
    the block time (fp8 norms under TE's fp8, dropout masks for a LayerNorm GPT block, the
    forward again under full AC); MoE blocks and a user-set efficiency are not charged."""
    from scaletrain.config import Layout, hardware_preset
    from scaletrain.planner.time.elementwise import eager_elementwise_s
    from scaletrain.planner.types import PlanInput

    hw = hardware_preset("h100-sxm")
    llama = one_llama_block(4096, 32, 8, 14336)
    p = PlanInput(llama, hw, 8, Layout(dp=8, zero=1), 4096, 1, 8, "bf16", recipe="megatron")
    for name in ("megatron", "nemo"):
        r = RECIPES[name]
        want = mcore_elementwise_bytes(llama, fp8_norm_out=False, dropout=False, recompute=False)
        assert eager_elementwise_s(p, r) == pytest.approx(want / hw.memory_bw)
        fp8 = dataclasses.replace(p, precision="fp8")
        want = mcore_elementwise_bytes(llama, fp8_norm_out=True, dropout=False, recompute=False)
        assert eager_elementwise_s(fp8, r) == pytest.approx(want / hw.memory_bw)
        full = dataclasses.replace(p, ac="full")
        want = mcore_elementwise_bytes(llama, fp8_norm_out=False, dropout=False, recompute=True)
        assert eager_elementwise_s(full, r) == pytest.approx(want / hw.memory_bw)
        assert eager_elementwise_s(dataclasses.replace(p, efficiency=0.5), r) == 0.0
    gpt = dataclasses.replace(p, model=_gpt(2304, 24))
    want = mcore_elementwise_bytes(gpt.model, fp8_norm_out=False, dropout=True, recompute=False)
    assert eager_elementwise_s(gpt, RECIPES["megatron"]) == pytest.approx(want / hw.memory_bw)
