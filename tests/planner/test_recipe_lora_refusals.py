"""LoRA under the framework recipes (#39): a recipe without adapter support refuses a LoRA plan
in one line naming the field and the fix (it never plans the frozen base as trained), and the
deepspeed recipe plans PEFT over DeepSpeed: the frozen base partitioned like a trained one at
ZeRO-3, fp32 master, Adam states and gradients for the adapters only."""

from __future__ import annotations

import dataclasses
from typing import cast

import pytest

from scaletrain.cli import main
from scaletrain.config import ConfigError, Layout, hardware_preset, model_preset
from scaletrain.config.choices import ZeroStage
from scaletrain.planner import estimate
from scaletrain.planner.recipes.memory import lora_refusals, recipe_problems
from scaletrain.planner.recipes.published import load_runs, plan_input, refusals
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.types import PlanInput

# tiny-llama: h 64, 2 layers, 4 heads of 16, 2 KV heads (kv_dim 32), ffn 176, vocab 256, untied
H, F, V, KV = 64, 176, 256, 32
FROZEN = H * H + KV * H + KV * H + H * H + 3 * F * H  # a block's seven projections
BASE = 2 * (FROZEN + 2 * H) + 2 * V * H + H  # blocks (with their norms), embedding, head, norm
ADAPTERS = 2 * (4 * (H + H) + 4 * (H + KV))  # rank-4 A and B of wq and wv, two blocks: 1792
NO_LORA = sorted(n for n, r in RECIPES.items() if not r.lora and n != "scaletrain")


def _plan(recipe: str, layout: Layout, rank: int = 4) -> PlanInput:
    return PlanInput(
        model_preset("tiny-llama"),
        hardware_preset("h100-sxm"),
        layout.world_size,
        layout,
        128,
        2 * layout.world_size,
        2,
        "bf16",
        ac="none",
        recipe=recipe,
        lora_rank=rank,
        lora_targets=("wq", "wv") if rank else (),
        lora_base="auto",
    )


def test_the_lora_recipes() -> None:
    assert sorted(n for n, r in RECIPES.items() if r.lora) == [
        "automodel",
        "deepspeed",
        "torchtune",
    ]
    # the DeepSpeed variants around other models run no PEFT
    for name in ("deepspeed-0.4", "deepspeed-hf", "deepspeed-bigscience-2022"):
        assert name in NO_LORA


@pytest.mark.parametrize("name", NO_LORA)
def test_a_recipe_without_adapters_refuses_a_lora_plan(name: str) -> None:
    layout = Layout(dp=2, zero=cast(ZeroStage, max(RECIPES[name].zero_stages)))
    (problem,) = [p for p in recipe_problems(name, layout, lora=8) if p.field == "lora.rank"]
    assert problem.value == 8 and "lora.rank 0" in problem.fix and "--recipe" in problem.fix
    assert "\n" not in str(problem)
    # the Python API refuses it as well, rather than plan every parameter as trained
    with pytest.raises(ConfigError, match="lora.rank"):
        estimate(_plan(name, layout))
    # without adapters nothing changes
    assert not lora_refusals(RECIPES[name], layout, 0)


@pytest.mark.parametrize("name", ["deepspeed", "torchtune", "automodel"])
def test_a_lora_recipe_refuses_tp_pp_and_cp(name: str) -> None:
    assert not lora_refusals(RECIPES[name], Layout(dp=2, zero=3), 8)
    fields = [p.field for p in lora_refusals(RECIPES[name], Layout(dp=2, tp=2, pp=2), 8)]
    assert fields == ["parallel.tp", "parallel.pp"]
    fields = [p.field for p in lora_refusals(RECIPES[name], Layout(dp=1, cp=2), 8)]
    assert fields == ["parallel.cp"]


@pytest.mark.parametrize(
    "extra",
    [
        ["--recipe", "megatron", "--dp", "8", "--zero", "1", "--micro-batch", "1"],
        ["--recipe", "nanotron"],  # a search: no layout helps
        ["--recipe", "deepspeed-hf", "--lora-base-dtype", "nf4"],
    ],
)
def test_cli_refuses_in_one_line(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--global-batch", "8"]
    rc = main(["plan", *args, "--seq-len", "4096", "--lora-rank", "8", *extra])
    assert rc == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "--lora-rank = 8" in lines[0] and "plans full training only" in lines[0]
    assert "--recipe scaletrain, deepspeed, torchtune or automodel" in lines[0]


def test_deepspeed_zero3_lora_states_hand_counted() -> None:
    m = estimate(_plan("deepspeed", Layout(dp=2, zero=3))).memory
    assert m.detail["params.count"] == ADAPTERS  # what the optimizer trains
    # zero.Init partitions every parameter: the bf16 base and adapters over 2, plus the largest
    # module gathered (the bf16 embedding, V x h) and the 5e7-value prefetch bucket
    gathered = 2 * V * H + 2 * 5e7
    assert m.detail["params.in_flight"] == gathered
    assert m.params == 2 * (BASE + ADAPTERS) / 2 + gathered
    # fp32 master and Adam's two fp32 states of the adapters only, partitioned over 2
    assert m.detail["optimizer.master"] == 4 * ADAPTERS / 2
    assert m.optimizer == (4 + 8) * ADAPTERS / 2
    # bf16 adapter gradients partitioned, one block's adapters' gradients unsharded
    assert m.grads == 2 * ADAPTERS / 2 + 2 * ADAPTERS / 2


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_deepspeed_lora_below_zero3_keeps_the_base_whole(zero: int) -> None:
    m = estimate(_plan("deepspeed", Layout(dp=2, zero=cast(ZeroStage, zero)))).memory
    assert m.params == 2 * (BASE + ADAPTERS)
    assert m.detail["optimizer.master"] == 4 * ADAPTERS / (2 if zero else 1)


def test_every_lora_row_under_every_recipe_is_refused_or_planned_as_lora() -> None:
    rows = [r for r in load_runs() if r.lora is not None]
    assert len(rows) >= 30
    for run in rows:
        for name in RECIPES:
            why = refusals(run, name)
            if name in NO_LORA:
                assert any("plans full training only" in w for w in why), (run.name, name)
            elif not why:
                # the adapters' gradients only: a small part of full training's
                p = plan_input(run, name)
                full = estimate(dataclasses.replace(p, lora_rank=0)).memory
                assert estimate(p).memory.grads < 0.1 * full.grads, (run.name, name)


def test_the_peft_deepspeed_rows_fit() -> None:
    rows = {r.name: r for r in load_runs()}
    for name in (
        "peft-dsz3-h100-llama2-70b-lora-r8-all",
        "peft-dsz3-a100-40gb-llama2-70b-qlora-r8-all",
    ):
        assert estimate(plan_input(rows[name], "deepspeed")).memory.fits, name
