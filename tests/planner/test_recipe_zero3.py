"""DeepSpeed ZeRO-3's step-time terms (time/zero3_fetch.py): one gather per partitioned module,
bf16 reduce-scatters per reduce bucket, charged on the critical path; other recipes and ZeRO
stages keep their families."""

from __future__ import annotations

import dataclasses
import math

import pytest

from scaletrain.config import Layout, hardware_preset, model_preset
from scaletrain.planner.estimate import estimate
from scaletrain.planner.time.comm import axis_link
from scaletrain.planner.time.zero3_fetch import partitioned_modules
from scaletrain.planner.types import PlanInput


def _plan(recipe: str, layout: Layout, *, model: str = "llama3-8b", gb: int = 16) -> PlanInput:
    return PlanInput(
        model_preset(model),
        hardware_preset("h100-sxm"),
        layout.world_size,
        layout,
        2048,
        gb,
        1,
        "bf16",
        "full",
        recipe=recipe,
    )


def test_partitioned_modules_follow_the_model_definitions() -> None:
    """Llama family (HF LlamaAttention / LlamaMLP): q, k, v, o, gate, up, down per block, the
    embedding and the untied head: Llama-3-70B 80 x 7 + 2 = 562. GPT-2 family: fused QKV,
    output projection, fc1, fc2, with the learned position table and a tied head: 4 L + 2."""
    assert partitioned_modules(model_preset("llama3-70b"), 80, embedding=True, head=True) == 562
    gpt = model_preset("gpt2-124m")
    assert gpt.tie_embeddings and gpt.position == "learned"
    assert partitioned_modules(gpt, 12, embedding=True, head=True) == 4 * 12 + 2


def test_deepspeed_zero3_charges_its_gathers_and_reduce_scatters_in_full() -> None:
    """dp 8, 2 micro-batches: the 16-bit weights gathered twice per micro-batch ((n-1)/n x 2 B
    x P each), the gradients reduce-scattered once in bf16; exposed = their sum (the recipe's
    step is compute + both + optimizer)."""
    lay = Layout(dp=8, zero=3)
    p = _plan("deepspeed", lay)
    t = estimate(p).time
    terms = t.comm_terms
    assert set(terms) == {"zero3_param_gather", "zero3_grad_reduce_scatter"}
    P = p.model.param_counts().total
    n, m = 8, 2
    bw, lat, _ = axis_link(lay, p.hardware, "dp", None)
    modules = partitioned_modules(p.model, p.model.num_layers, embedding=True, head=True)
    gather = 2 * m * ((n - 1) / n * 2 * P / bw + modules * (n - 1) * lat)
    reduce = m * ((n - 1) / n * 2 * P / bw + math.ceil(P / 5e8) * (n - 1) * lat)
    assert terms["zero3_param_gather"] == pytest.approx(gather)
    assert terms["zero3_grad_reduce_scatter"] == pytest.approx(reduce)
    assert t.comm_exposed_s == pytest.approx(gather + reduce)
    # + what ZeRO-3's hooks' host time adds beyond the device's (zero3_fetch.zero3_hook_host_s;
    # 2 x 2048 tokens per GPU with full AC: host-bound; test_zero3_host_floor.py)
    device = t.compute_s + gather + reduce + t.optimizer_s
    assert t.step_s == pytest.approx(device + t.host_bound_s)


def test_other_recipes_and_stages_keep_their_families() -> None:
    """torchtitan's FSDP2 keeps fsdp_all_gather / fsdp_reduce_scatter (overlapped); DeepSpeed's
    ZeRO-1 keeps the reduce-scatter + all-gather of its distributed optimizer."""
    tt = estimate(_plan("torchtitan", Layout(dp=8, zero=3))).time.comm_terms
    assert "fsdp_all_gather" in tt and "zero3_param_gather" not in tt
    z1 = estimate(_plan("deepspeed", Layout(dp=8, zero=1))).time.comm_terms
    assert "zero_all_gather" in z1 and "zero3_param_gather" not in z1
    # one rank: nothing to gather
    solo = estimate(dataclasses.replace(_plan("deepspeed", Layout(dp=1, zero=3)), global_batch=2))
    assert "zero3_param_gather" not in solo.time.comm_terms
