"""Transformer Engine under fp8 (Recipe.te_fp8_gemm_inputs): the megatron/nemo recipes save
the fp8 casts of the GEMM inputs, checked against a hand count of Korthikanti et al. 2022
Table 2 with those tensors at 1 byte; recipes without TE layers keep the 16-bit count."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import GiB, Layout, ModelConfig, hardware_preset, model_preset
from scaletrain.planner.recipes.activations import recipe_layer_bytes
from scaletrain.planner.recipes.memory import recipe_worst_rank
from scaletrain.planner.recipes.published import load_runs, plan_input
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.types import PlanInput

# GPT-2-style: h=64, a=4, f=4h, GELU, LayerNorm (dropout masks), flash-style core
GPT = ModelConfig(
    name="gpt", vocab_size=128, dim=64, num_layers=2, num_heads=4, ffn_dim=256, max_seq_len=32
)


def _plan(recipe: str, layout: Layout, precision: str, model: ModelConfig = GPT) -> PlanInput:
    return PlanInput(
        model,
        hardware_preset("h100-sxm"),
        layout.world_size,
        layout,
        32,
        4,
        1,
        precision,
        "none",
        recipe=recipe,
    )


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (2, True), (4, True)])
def test_fp8_layer_saves_fp8_gemm_inputs(tp: int, sp: bool) -> None:
    """Per token, bf16 -> fp8: the two layernorm outputs h each (/t only with SP), the fc2
    input f/t, and an fp8 copy h/t of the attention output for the projection:
    with SP and f = 4h, sbh(34 - 2 + 1 - 4)/t = 29 sbh/t (+ the log-sum-exp)."""
    s, h, f, a = 32, GPT.dim, GPT.ffn_dim, GPT.num_heads
    L = Layout(dp=1, tp=tp, sp=sp)
    tsp = tp if sp else 1
    for name in ("megatron", "nemo"):
        bf16 = recipe_layer_bytes(_plan(name, L, "bf16"), RECIPES[name])
        fp8 = recipe_layer_bytes(_plan(name, L, "fp8"), RECIPES[name])
        assert bf16 - fp8 == pytest.approx(s * (2 * h / tsp - h / tp + f / tp), rel=1e-12)
    if sp:
        lse = 4 * a * s / tp
        want = s * h * 29 / tp + lse
        assert recipe_layer_bytes(_plan("megatron", L, "fp8"), RECIPES["megatron"]) == (
            pytest.approx(want, rel=1e-12)
        )
    # DeepSpeed's Megatron-DeepSpeed layers are not TE: fp8 changes nothing there
    ds = [
        recipe_layer_bytes(_plan("deepspeed", L, p), RECIPES["deepspeed"]) for p in ("bf16", "fp8")
    ]
    assert ds[0] == ds[1]


def test_fp8_swiglu_saves_its_f_wide_output_in_fp8() -> None:
    """Llama-style SwiGLU: the fused swiglu keeps its 2f input in 16 bits and the f-wide
    output fc2 reads as fp8: 3 e f -> 2 e f + f, the same h + f per token less (no SP)."""
    m = dataclasses.replace(model_preset("llama3-8b"), num_layers=2)
    L = Layout(dp=1)
    bf16 = recipe_layer_bytes(_plan("nemo", L, "bf16", m), RECIPES["nemo"])
    fp8 = recipe_layer_bytes(_plan("nemo", L, "fp8", m), RECIPES["nemo"])
    assert bf16 - fp8 == pytest.approx(32 * (2 * m.dim - m.dim + m.ffn_dim), rel=1e-12)


def test_nemo_fp8_rows_fit_the_cuda_capacity() -> None:
    """The two NeMo FP8 rows the nemo recipe called OOM although they ran: with TE's fp8 GEMM
    inputs both fit the 79.10 GiB CUDA reports on an H100 80GB (the h100-sxm preset), and
    neither fits the 80e9 B the preset held before (so the capacity and the fp8 terms are both
    needed)."""
    runs = {r.name: r for r in load_runs()}
    for name in ("nemo-h100-gpt3-175b-512g", "nemo-h100-llama3-8b-8g-cp2"):
        run = runs[name]
        assert run.gpu == "h100-sxm" and run.gpu_memory_gb is None
        assert run.hardware().memory_bytes == 79.10 * GiB
        mem, _ = recipe_worst_rank(plan_input(run, "nemo"))
        assert mem.fits and mem.reserved > 80e9
