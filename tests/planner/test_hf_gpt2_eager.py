"""The deepspeed-hf recipe: DeepSpeed's terms around a Hugging Face transformers GPT-2, whose
eager GPT2Block moves HF_GPT2_EAGER_* bytes per token outside its matmuls and whose
GPT2Attention._attn runs its score ops as separate kernels (NAIVE_SCORE_BYTES['hf_gpt2']):
each against a recount written out here kernel by kernel, and their charge in the step."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, ModelConfig, hardware_preset
from scaletrain.planner import estimate
from scaletrain.planner.recipes.registry import RECIPES, recipe_named
from scaletrain.planner.time.attention_core import (
    NAIVE_SCORE_BYTES,
    AttentionCore,
    attention_seconds_per_token,
)
from scaletrain.planner.time.elementwise import (
    HF_GPT2_LOSS_BYTES,
    eager_elementwise_s,
    eager_loss_s,
    hf_gpt2_eager_elementwise_bytes,
)
from scaletrain.planner.types import PlanInput

E = 2  # bytes of a 16-bit activation (DeepSpeed's fp16 engine halves the module)


def _gpt2(h: int = 1024, layers: int = 24) -> ModelConfig:
    return ModelConfig(
        vocab_size=50257,
        dim=h,
        num_layers=layers,
        num_heads=h // 64,
        num_kv_heads=h // 64,
        ffn_dim=4 * h,
        norm="layernorm",
        activation="gelu",
        position="learned",
        tie_embeddings=True,
        bias=True,
        attention="naive",
    )


def _recount(h: int, f: int) -> tuple[float, float]:
    """(forward, backward) bytes per token of a GPT2Block's eager kernels, (reads, writes) per
    kernel written out from modeling_gpt2.py, Conv1D's addmm and gelu_new."""
    fwd: list[tuple[float, float]] = [
        (E * h, E * h),  # ln_1
        (E * h, E * h),  # ln_2
    ]
    for n in (3 * h, h, f, h):  # c_attn, attn c_proj, c_fc, mlp c_proj
        fwd.append((0.0, E * n))  # addmm copies the expanded bias into its output
        fwd.append((E * n, 0.0))  # the GEMM reads it (beta 1)
    fwd += [(E * h, E * h)] * 3  # q, k^T, v reshaped for bmm: copies
    fwd.append((E * h, E * h))  # _merge_heads: permute().contiguous()
    fwd += [(E * h, E * h + h)] * 2  # resid_dropout, mlp dropout: output and 1-byte mask
    fwd += [(2 * E * h, E * h)] * 2  # the two residual adds
    # gelu_new: pow, 0.044715 *, x + ., sqrt(2/pi) *, tanh, 1 + ., 0.5 * x, product
    fwd += [(E * f, E * f)] * 2 + [(2 * E * f, E * f)] + [(E * f, E * f)] * 4
    fwd += [(2 * E * f, E * f)]
    bwd: list[tuple[float, float]] = []
    bwd += [(E * h + h, E * h)] * 2  # dropout backwards
    bwd += [(2 * E * h, E * h)] * 2  # residual-stream gradient sums
    bwd += [(2 * E * h, E * h), (2 * E * h, 0.0)] * 2  # layer_norm backward: dx, dw / db
    for n in (3 * h, h, f, h):
        bwd.append((E * n, 0.0))  # bias gradient: a sum over tokens
    bwd.append((E * h, E * h))  # attention output gradient made contiguous for bmm
    bwd += [(E * h, E * h)] * 3  # q, k, v gradients reshaped through the permuted views
    bwd.append((3 * E * h, 3 * E * h))  # SplitBackward: cat into the c_attn gradient
    # gelu_new backward: product's two gradients, 0.5 scale, tanh backward, two scalar
    # scales, pow backward (x^2, x 3, x grad), two adds summing x's gradient paths
    bwd += [(2 * E * f, E * f)] * 2 + [(E * f, E * f)] + [(2 * E * f, E * f)]
    bwd += [(E * f, E * f)] * 2  # the two scalar scales
    bwd += [(E * f, E * f)] * 2 + [(2 * E * f, E * f)]  # pow_backward
    bwd += [(2 * E * f, E * f)] * 2
    return sum(r + w for r, w in fwd), sum(r + w for r, w in bwd)


@pytest.mark.parametrize("h", [768, 1024, 1600])
def test_hf_gpt2_block_bytes_match_the_recount(h: int) -> None:
    m = _gpt2(h)
    fwd, bwd = _recount(m.dim, m.ffn_dim)
    assert hf_gpt2_eager_elementwise_bytes(m, recompute=False) == pytest.approx(fwd + bwd)
    assert hf_gpt2_eager_elementwise_bytes(m, recompute=True) == pytest.approx(2 * fwd + bwd)


def test_hf_score_bytes_match_the_recount() -> None:
    """GPT2Attention._attn per score element: scale, where (1-byte mask), mask add, softmax,
    dropout forward; dropout, softmax, where and scale backward."""
    fwd = 2 * E + (E + 1 + E) + 2 * E + 2 * E + (E + E + 1)
    bwd = (E + 1 + E) + 3 * E + (E + 1 + E) + 2 * E
    assert NAIVE_SCORE_BYTES["hf_gpt2"] == (fwd, bwd, 2 * E + 1)


def _plan(recipe: str) -> PlanInput:
    hw = hardware_preset("v100-32gb")
    return PlanInput(_gpt2(), hw, 16, Layout(dp=16, zero=1), 1024, 6, 96, "fp16", recipe=recipe)


def test_deepspeed_hf_charges_the_eager_block() -> None:
    """deepspeed-hf charges the GPT2Block's bytes over memory bandwidth (again under full AC);
    DeepSpeed's plain recipe (Megatron-DeepSpeed's fused kernels) and a user-set efficiency do
    not, nor an RMSNorm or gated block."""
    p = _plan("deepspeed-hf")
    hw = p.hardware
    r = RECIPES["deepspeed-hf"]
    want = hf_gpt2_eager_elementwise_bytes(p.model, recompute=False) / hw.memory_bw
    assert eager_elementwise_s(p, r) == pytest.approx(want)
    full = dataclasses.replace(p, ac="full")
    want = hf_gpt2_eager_elementwise_bytes(p.model, recompute=True) / hw.memory_bw
    assert eager_elementwise_s(full, r) == pytest.approx(want)
    assert eager_elementwise_s(p, RECIPES["deepspeed"]) == 0.0
    assert eager_elementwise_s(dataclasses.replace(p, efficiency=0.5), r) == 0.0
    rms = dataclasses.replace(p, model=dataclasses.replace(p.model, norm="rmsnorm"))
    assert eager_elementwise_s(rms, r) == 0.0


def test_hf_scores_cost_more_than_megatrons_fused_softmax() -> None:
    """The naive core's score traffic under the 'hf_gpt2' key: (22 x 1 + 20) B per score
    element against Megatron's (9 + 11), both with dropout, at the same matmul time."""
    hw = hardware_preset("v100-32gb")
    core = AttentionCore(
        kernel="naive", core_flops=1e6, heads=16, seq_len=1024, recompute=False, dropout=True
    )
    kw = {"recipe": "deepspeed", "bf16_rate": 50e12, "hardware": hw}
    meg = attention_seconds_per_token(core, **kw)  # type: ignore[arg-type]
    hf = attention_seconds_per_token(
        dataclasses.replace(core, scores="hf_gpt2"),
        **kw,  # type: ignore[arg-type]
    )
    extra = (22.0 + 20.0 - 9.0 - 11.0) * 16 * 1024 / hw.memory_bw
    assert hf - meg == pytest.approx(extra)


def test_deepspeed_hf_moves_time_not_memory() -> None:
    """The recipe is DeepSpeed's in every memory term: the plan's memory is the same, its step
    longer by the eager kernels and the score traffic."""
    ds, hf = estimate(_plan("deepspeed")), estimate(_plan("deepspeed-hf"))
    assert hf.memory.total == pytest.approx(ds.memory.total)
    assert hf.time.step_s > ds.time.step_s
    assert recipe_named("deepspeed-hf").name == "deepspeed-hf"


def test_hf_loss_bytes_match_the_recount() -> None:
    """GPT2LMHeadModel's loss per logit: the shift's contiguous copy and log_softmax forward;
    nll_loss's zero-filled gradient, log_softmax's backward and the slice's zero-filled
    gradient with the copy in, backward."""
    fwd = (E + E) + (E + E)
    bwd = E + (E + E + E) + (E + E + E)
    assert fwd + bwd == HF_GPT2_LOSS_BYTES


def test_deepspeed_hf_charges_the_loss_on_the_head() -> None:
    p = _plan("deepspeed-hf")
    want = HF_GPT2_LOSS_BYTES * p.model.vocab_size / p.hardware.memory_bw
    assert eager_loss_s(p, RECIPES["deepspeed-hf"]) == pytest.approx(want)
    assert eager_loss_s(p, RECIPES["deepspeed"]) == 0.0
    assert eager_loss_s(dataclasses.replace(p, efficiency=0.5), RECIPES["deepspeed-hf"]) == 0.0
