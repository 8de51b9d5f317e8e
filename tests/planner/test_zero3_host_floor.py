"""ZeRO-3's host floor (time/zero3_fetch.zero3_hook_host_s): DeepSpeed's module hooks issue the
step from the host; a run with few tokens per GPU is planned no faster than that, a device-bound
run is unchanged, and only the deepspeed recipe at ZeRO-3 on a GPU gets it."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from scaletrain.config import Layout, ModelConfig, model_preset
from scaletrain.planner.estimate import estimate
from scaletrain.planner.time.zero3_fetch import (
    GATHER_ISSUE_HOST_S,
    HOOK_HOST_S_PER_VISIT,
    partition_world_size,
    partitioned_modules,
    zero3_hook_host_s,
)
from scaletrain.planner.types import PlanInput

from ._recipe_step import recipe_plan


def _small() -> ModelConfig:
    """train.py's 254M SimpleTransformerModel (the constant's source run's model)."""
    return dataclasses.replace(
        model_preset("gpt2-350m"),
        num_layers=12,
        dim=1024,
        num_heads=16,
        num_kv_heads=16,
        ffn_dim=4096,
        vocab_size=50000,
        max_seq_len=512,
        tie_embeddings=False,
    )


def _plan(
    model: ModelConfig,
    layout: Layout,
    *,
    seq: int,
    mbs: int,
    gb: int,
    ac: str = "none",
    recipe: str = "deepspeed",
    gpu: str = "h100-sxm",
) -> PlanInput:
    return recipe_plan(recipe, layout, model, seq=seq, gb=gb, mb=mbs, ac=ac, gpu=gpu)


def test_constant_is_the_source_runs_step_over_its_visits() -> None:
    """0.1042 s over the 254M model's forward + backward visits of its 51 partitioned modules
    (12 x 4 linears + token table + position table + untied head)."""
    m = _small()
    assert partitioned_modules(m, 12, embedding=True, head=True) == 51
    p = _plan(m, Layout(dp=1, zero=3), seq=512, mbs=4, gb=4)
    assert zero3_hook_host_s(p) == pytest.approx(0.1042)
    per_visit = HOOK_HOST_S_PER_VISIT
    assert per_visit == pytest.approx(0.1042 / 102)


def test_full_ac_recompute_visits_the_blocks_again_and_accumulation_repeats() -> None:
    m = _small()
    base = _plan(m, Layout(dp=4, zero=3), seq=512, mbs=1, gb=4)
    ac = dataclasses.replace(base, ac="full")
    blocks = partitioned_modules(m, 12, embedding=False, head=False)
    assert zero3_hook_host_s(ac) - zero3_hook_host_s(base) == pytest.approx(
        blocks * HOOK_HOST_S_PER_VISIT
    )
    gas2 = _plan(m, Layout(dp=4, zero=3), seq=512, mbs=1, gb=8)
    assert gas2.grad_accum == 2
    assert zero3_hook_host_s(gas2) == pytest.approx(2 * zero3_hook_host_s(base))


def test_few_tokens_per_gpu_are_host_bound() -> None:
    """The 254M model at 2048 tokens on one H100: the device terms are a few ms, the step is
    the host's; the step is never below the floor and the floor is named in the breakdown."""
    p = _plan(_small(), Layout(dp=1, zero=3), seq=512, mbs=4, gb=4)
    t = estimate(p).time
    assert t.host_bound_s > 0
    assert t.step_s == pytest.approx(zero3_hook_host_s(p))
    device = t.compute_s + t.bubble_s + t.comm_exposed_s + t.overlap_sm_s + t.optimizer_s
    assert t.step_s == pytest.approx(device + t.host_bound_s)


def test_device_bound_runs_are_unchanged() -> None:
    """Llama-3-8B at 8 x 4096 tokens per GPU: the device's step is far above the hooks' host
    time, so no host term is added."""
    p = _plan(model_preset("llama3-8b"), Layout(dp=8, zero=3), seq=4096, mbs=8, gb=64)
    t = estimate(p).time
    assert zero3_hook_host_s(p) < t.step_s
    assert t.host_bound_s == 0.0


@pytest.mark.parametrize(
    ("recipe", "zero", "gpu"),
    [("deepspeed", 2, "h100-sxm"), ("torchtitan", 3, "h100-sxm"), ("scaletrain", 3, "h100-sxm")],
)
def test_only_deepspeed_zero3_gets_the_floor(
    recipe: str, zero: Literal[0, 1, 2, 3], gpu: str
) -> None:
    p = _plan(_small(), Layout(dp=4, zero=zero), seq=512, mbs=1, gb=4, recipe=recipe, gpu=gpu)
    assert estimate(p).time.host_bound_s == 0.0


def test_gather_issue_constant_is_the_source_runs_four_gpu_step_less_its_one_gpu_step() -> None:
    """The 254M model at the same batch per GPU: 0.1189 s on 4 H100, 0.1042 s on one; the
    difference over the 4-rank run's 2 x 51 gathers; the 4-rank plan's floor is its step."""
    assert pytest.approx((0.1189 - 0.1042) / 102) == GATHER_ISSUE_HOST_S
    p = _plan(_small(), Layout(dp=4, zero=3), seq=512, mbs=4, gb=16)
    assert partition_world_size(p) == 4
    assert zero3_hook_host_s(p) == pytest.approx(0.1189)


def test_one_rank_issues_no_gather_and_every_gather_repeats_per_micro_batch() -> None:
    """dp = 1 (partition_parameters.py _no_gather_coalesced) adds nothing; over n > 1 ranks
    each micro-batch adds two gathers per partitioned module, with or without recompute."""
    m = _small()
    one = _plan(m, Layout(dp=1, zero=3), seq=512, mbs=4, gb=4)
    assert zero3_hook_host_s(one) == pytest.approx(102 * HOOK_HOST_S_PER_VISIT)
    four = _plan(m, Layout(dp=4, zero=3), seq=512, mbs=1, gb=4)
    assert zero3_hook_host_s(four) - zero3_hook_host_s(one) == pytest.approx(
        102 * GATHER_ISSUE_HOST_S
    )
    ac = dataclasses.replace(four, ac="full")
    blocks = partitioned_modules(m, 12, embedding=False, head=False)
    assert zero3_hook_host_s(ac) - zero3_hook_host_s(four) == pytest.approx(
        blocks * HOOK_HOST_S_PER_VISIT
    )
    gas2 = _plan(m, Layout(dp=4, zero=3), seq=512, mbs=1, gb=8)
    assert zero3_hook_host_s(gas2) == pytest.approx(2 * zero3_hook_host_s(four))
