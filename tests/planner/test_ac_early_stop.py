"""Full-AC recompute under torch's non-reentrant checkpoint with early stop
(time/ac_early_stop.py): the dense blocks' MLP down projection and its TP reduction are not
recomputed where the framework's checkpoint stops early (`Recipe.ac_early_stop`, a row's
`PlanInput.ac_early_stop`), and the whole block is replayed where it does not."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset, model_preset
from scaletrain.planner.memory.rank_terms import ModelTerms
from scaletrain.planner.recipes.published import load_runs
from scaletrain.planner.recipes.registry import RECIPES, recipe_named
from scaletrain.planner.time.ac_early_stop import (
    down_projection_skipped,
    early_stop_applies,
    early_stop_skipped_forward_flops,
)
from scaletrain.planner.time.comm import comm_terms
from scaletrain.planner.time.step_time import comm_arguments, step_time
from scaletrain.planner.types import PlanInput


def _plan(
    ac: str = "full", precision: str = "bf16", model: str = "llama3-8b", **layout: int
) -> PlanInput:
    L = Layout(**{"dp": 8, "zero": 3, **layout})
    return PlanInput(
        model_preset(model),
        hardware_preset("h100-sxm"),
        L.world_size,
        L,
        4096,
        L.dp,
        1,
        precision,  # type: ignore[arg-type]
        ac,  # type: ignore[arg-type]
        recipe="torchtitan",
        efficiency=0.5,
    )


def test_which_frameworks_stop_early() -> None:
    """Non-reentrant checkpoint_wrapper with torch's default: scaletrain, torchtitan (before
    its PR #1580), torchtune, AutoModel, fms-fsdp. Reentrant replays (Megatron, NeMo, DeepSpeed,
    Nanotron) and llm-foundry's torch 2.0.1 / 1.13.1: the whole block. Each says where."""
    stops = {"scaletrain", "torchtitan", "torchtune", "automodel", "fms-fsdp"}
    for name, recipe in RECIPES.items():
        assert recipe.ac_early_stop == (name in stops), name
    for name in (
        "scaletrain",
        "torchtitan",
        "torchtune",
        "automodel",
        "megatron",
        "deepspeed",
        "fms-fsdp",
    ):
        assert "ac_early_stop" in RECIPES[name].sources, name
    for name in ("nanotron", "llm-foundry"):
        assert "ac_early_stop" in RECIPES[name].sources, name
    assert "25413d224" in RECIPES["torchtitan"].sources["ac_early_stop"]


def test_skipped_flops_are_the_dense_down_projection() -> None:
    tt = recipe_named("torchtitan")
    p = _plan()
    m = p.model
    assert early_stop_skipped_forward_flops(p, tt) == 2.0 * m.dim * m.ffn_dim
    # not under another AC mode, nor where the checkpoint replays the whole block
    assert early_stop_skipped_forward_flops(_plan("selective"), tt) == 0.0
    assert early_stop_skipped_forward_flops(p, recipe_named("megatron")) == 0.0
    # a row's version override (torchtitan from PR #1580: early_stop False)
    off = dataclasses.replace(p, ac_early_stop=False)
    assert not early_stop_applies(off, tt) and early_stop_skipped_forward_flops(off, tt) == 0.0
    on = dataclasses.replace(p, ac_early_stop=True)
    assert early_stop_applies(on, recipe_named("deepspeed"))
    # default recipe (scaletrain's trainer): non-reentrant, stops early
    assert early_stop_applies(p, None)


def test_fp8_recomputes_the_matmul_but_stops_before_its_reduction() -> None:
    """An fp8 linear's autograd Function packs its saves after its matmul: the matmul is
    recomputed, the TP reduction after it is not."""
    tt = recipe_named("torchtitan")
    p = _plan(precision="fp8")
    assert early_stop_applies(p, tt) and not down_projection_skipped(p, tt)
    assert early_stop_skipped_forward_flops(p, tt) == 0.0


def test_moe_blocks_recompute_their_experts() -> None:
    """Only the dense blocks skip their down projection: DeepSeek-V3's 3 dense first blocks of
    61, none of Qwen3-30B-A3B's."""
    tt = recipe_named("torchtitan")
    ds = _plan(model="deepseek-v3")
    dense = ds.model.dense_layer_view()
    want = 2.0 * dense.dim * dense.ffn_dim * ds.model.num_dense_layers / ds.model.num_layers
    assert early_stop_skipped_forward_flops(ds, tt) == pytest.approx(want)
    assert early_stop_skipped_forward_flops(_plan(model="qwen3-30b-a3b"), tt) == 0.0


def _compute_s(plan: PlanInput, recipe) -> float:  # type: ignore[no-untyped-def]
    return step_time(
        plan,
        8.0e9 / plan.layout.tp,
        terms=ModelTerms(plan.model),
        causal=True,
        gpus_per_node=8,
        zero_bubble="h1",
        recipe=recipe,
    ).compute_s


def test_compute_time_drops_the_down_projection_recompute() -> None:
    """The skipped matmul's seconds at the plan's matmul rate, every block, every token."""
    tt = recipe_named("torchtitan")
    p = _plan()
    m, hw = p.model, p.hardware
    saved = _compute_s(dataclasses.replace(p, ac_early_stop=False), tt) - _compute_s(p, tt)
    tokens = float(p.seq_len) * p.micro_batch * max(1, p.grad_accum)
    want = 2.0 * m.dim * m.ffn_dim * m.num_layers * tokens / (hw.flops("bf16") * 0.5)
    assert saved == pytest.approx(want, rel=1e-6)


def test_tp_reduction_of_the_down_projection_is_not_recomputed() -> None:
    """Under SP the skipped reduction is a reduce-scatter, half an all-reduce's ring bytes;
    without SP the whole all-reduce."""
    tt = recipe_named("torchtitan")
    for sp, share in ((True, 0.5), (False, 1.0)):
        p = _plan(dp=4, tp=2, sp=sp)
        on = comm_arguments(p, 4.0e9, 8, None, tt)
        off = comm_arguments(dataclasses.replace(p, ac_early_stop=False), 4.0e9, 8, None, tt)
        assert on.ac_early_stop and not off.ac_early_stop
        act = 2.0 * p.seq_len * p.micro_batch * p.model.dim
        moved = comm_terms(off)["tp"][0] - comm_terms(on)["tp"][0]
        m = max(1, p.grad_accum)
        assert moved == pytest.approx(share * on.layers * m * 2 * (2 - 1) / 2 * act)


def test_corpus_rows_after_torchtitan_pr_1580_replay_the_block() -> None:
    """The corpus' torchtitan rows read at 94609ad (ChunkedLossWrapper's dataclass config,
    after 25413d224) state ac_early_stop = false; the older ones leave the recipe's rule."""
    runs = {r.name: r for r in load_runs()}
    for name in (
        "tt-h100-qwen3-14b-tp4-fsdp2-chunk8k-eager",
        "tt-h100-qwen3-14b-tp4-fsdp2-chunk8k-inductor-loss",
    ):
        assert runs[name].layout.ac_early_stop is False
    assert runs["tt-a100-l3-70b-full"].layout.ac_early_stop is None
