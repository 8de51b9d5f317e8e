"""DeepSpeed 0.4's ZeRO-1 after the backward (planner/recipes/zero1_flats.py, the
'deepspeed-0.4' recipe): the bucket and all-gather copies by hand, the best-fit replay's new
segments, the reservation they add, and the BigScience rows that name the recipe; the ZeRO-1/2
step's slice checks (fp32 and fp64 copies of the largest gradient slice) of both recipes."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import ConfigError, Layout
from scaletrain.planner.recipes.memory import recipe_rank_memory
from scaletrain.planner.recipes.published import load_runs, parse_runs, plan_input, recipe_of
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.recipes.zero1_flats import (
    largest_freed_tensor,
    step_check_copies,
    step_segments,
    zero1_flats,
)

from .test_recipes import SMALL, _plan

DS04 = RECIPES["deepspeed-0.4"]


def test_copies_and_segments_by_hand() -> None:
    """1.2e9 params over dp 8, 5e8-element buckets, 2 B weights: the reduction flattens
    5e8 + 5e8 + 2e8 elements (1e9, 1e9, 4e8 B); the partition of 1.5e8 is gathered in
    max(1, 1.5e8 x 8 // 5e8) = 2 calls of a 8 x 7.5e7-element copy (1.2e9 B each). SMALL's
    freed tensors are kilobytes, so every copy is a new segment except the step's 16-bit flat
    (3e8 B) and fp32 copy (6e8 B), which reuse the reduction's freed 4e8 and 1e9 B blocks."""
    p = _plan("deepspeed-0.4", Layout(dp=8, zero=1), gb=8)
    f = zero1_flats(p, DS04, 1.2e9, head=False)
    assert f.reduce_flats == (1e9, 1e9, 4e8)
    assert f.gather_flats == pytest.approx((1.2e9, 1.2e9))
    assert f.largest_freed < 1e6
    assert f.segments == pytest.approx(2.4e9 + 2.4e9)


def test_a_freed_tensor_as_large_holds_the_copies() -> None:
    """A copy no larger than the largest tensor the backward freed takes a cached block: with
    a 2e9 B tensor freed no copy of the case above costs a segment."""
    p = _plan("deepspeed-0.4", Layout(dp=8, zero=1), gb=8)
    f = zero1_flats(p, DS04, 1.2e9, head=False)
    assert largest_freed_tensor(p, DS04, head=False) < max(f.reduce_flats + f.gather_flats)
    # the head's 16-bit logits T x V x 2 B grow with the vocabulary: make them 2e9 B
    wide = dataclasses.replace(p, model=dataclasses.replace(SMALL, vocab_size=31_250_000))
    assert largest_freed_tensor(wide, DS04, head=True) == pytest.approx(2e9)
    assert zero1_flats(wide, DS04, 1.2e9, head=True).segments == 0.0


def test_no_reduction_buffer_in_the_backward_and_segments_in_reserved() -> None:
    """At ZeRO-1 the 0.4 recipe has no ipg buffer (contiguous gradients forced off) and its
    reservation is the forward/backward's plus the new segments; today's recipe keeps the
    buffer and nothing after the backward. Other stages are today's recipe unchanged."""
    lay = Layout(dp=4, zero=1)
    # fp16, as BigScience ran it (today's bf16 ZeRO-1 runs the BF16_Optimizer: no ipg bucket)
    now = recipe_rank_memory(
        dataclasses.replace(_plan("deepspeed", lay), precision="fp16"), RECIPES["deepspeed"], 0
    )
    old = recipe_rank_memory(
        dataclasses.replace(_plan("deepspeed-0.4", lay), precision="fp16"), DS04, 0
    )
    assert "reduce_bucket" in now.buffer_terms and "reduce_bucket" not in old.buffer_terms
    assert now.detail["zero1.new_segments"] == 0.0
    seg = old.detail["zero1.new_segments"]
    assert seg > 0
    base_total = now.total - now.buffer_terms["reduce_bucket"]
    ctx = old.buffer_terms["runtime_context"]
    base = base_total + DS04.fragmentation * (base_total - ctx)
    assert old.reserved == pytest.approx(max(base + seg, old.total * 1.05 - 0.05 * ctx))
    for z in (0, 2, 3):
        a = recipe_rank_memory(_plan("deepspeed", Layout(dp=4, zero=z)), RECIPES["deepspeed"], 0)
        b = recipe_rank_memory(_plan("deepspeed-0.4", Layout(dp=4, zero=z)), DS04, 0)
        assert (a.total, a.reserved) == (b.total, b.reserved)


def test_bigscience_rows_name_the_recipe_of_their_deepspeed() -> None:
    runs = load_runs()
    # BigScience's tr3m V100 rows (not DeepSpeedExamples' autotuning GPT-2 rows, ds-v100-hf-*)
    ds = [r for r in runs if r.name.startswith("ds-v100-") and "bigscience" in r.source]
    assert len(ds) == 27 and all(recipe_of(r) == "deepspeed-0.4" for r in ds)
    bs = [r for r in runs if r.name.startswith("ds-a100-bloom-prequel-02-25-")]
    assert len(bs) == 23 and all(recipe_of(r) == "deepspeed-bigscience-2022" for r in bs)
    hf = [r for r in runs if r.name.startswith("ds-v100-hf-")]
    assert len(hf) == 11 and all(recipe_of(r) == "deepspeed-hf" for r in hf)
    others = [r for r in runs if r.framework == "deepspeed" and r not in ds + bs + hf]
    assert others and all(recipe_of(r) == "deepspeed" for r in others)


def test_unknown_row_recipe_is_refused() -> None:
    row = {
        "name": "x",
        "framework": "deepspeed",
        "recipe": "deepspeed-0.3",
        "source": "https://example.org/table",
        "gpu": "v100-32gb",
        "num_gpus": 1,
        "seq_len": 32,
        "model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 128},
        "layout": {"dp": 1, "micro_batch": 1, "global_batch": 1},
        "measured": {"oom": False},
    }
    with pytest.raises(ConfigError, match="recipe"):
        parse_runs({"runs": [row]})


def test_step_check_copies_by_hand() -> None:
    """The largest slice is the largest parameter, at most the dp partition: 1e6 of 8e6
    params over dp 4 (partition 2e6) -> fp32 4e6 B then fp64 8e6 B; a 1e7 parameter is cut to
    the 2e6 partition; under fp32 the overflow check's cast copies nothing."""
    p = dataclasses.replace(_plan("deepspeed", Layout(dp=4, zero=1)), precision="fp16")
    assert step_check_copies(p, 1e6, 8e6) == (4e6, 8e6)
    assert step_check_copies(p, 1e7, 8e6) == (8e6, 1.6e7)
    p32 = dataclasses.replace(p, precision="fp32")
    assert step_check_copies(p32, 1e6, 8e6) == (8e6,)


def test_step_segments_by_hand() -> None:
    """SMALL's freed tensors are kilobytes: the fp32 check copy (4e6 B) is a new segment, the
    fp64 one (8e6 B) does not fit it and is another; the partition's 16-bit flat (2 B x 2e6)
    and fp32 copy (8e6 B) then take those two cached blocks: 1.2e7 B in all."""
    p = dataclasses.replace(_plan("deepspeed", Layout(dp=4, zero=1)), precision="fp16")
    ds = RECIPES["deepspeed"]
    assert largest_freed_tensor(p, ds, head=False) < 1e6
    assert step_segments(p, ds, 8e6, False, (4e6, 8e6)) == pytest.approx(1.2e7)


def test_step_checks_only_on_the_zero_optimizer_path() -> None:
    """fp16 at ZeRO-1 and 2 runs DeepSpeedZeroOptimizer (slice checks counted); bf16 at ZeRO-1
    runs BF16_Optimizer (its norm reads the fp32 partition: no copy), ZeRO-0 and 3 other
    optimizers: none counted."""
    ds = RECIPES["deepspeed"]
    for z, prec, counted in (
        (1, "fp16", True),
        (2, "fp16", True),
        (2, "bf16", True),
        (1, "bf16", False),
        (0, "fp16", False),
        (3, "fp16", False),
    ):
        p = dataclasses.replace(_plan("deepspeed", Layout(dp=4, zero=z)), precision=prec)
        m = recipe_rank_memory(p, ds, 0)
        assert (m.detail["zero_step.check_copies"] > 0) is counted, (z, prec)


def test_bigscience_02_25_row_checks_its_embedding_slice() -> None:
    """BLOOM's 02-25 topology search, dp 4 tp 8 pp 12 (fp16, ZeRO-1), under its
    Megatron-DeepSpeed's halved weight-decay group: rank 0's weight matrices are the embedding
    and 6 layers x (QKV 3h^2, dense h^2, h-to-4h 4h^2, 4h-to-h 4h^2) / 8, 25 in all; the first
    group holds the embedding and the next 11 (emb + 4 h^2), a quarter of which is the largest
    slice (under the embedding's 250880 x 14336 / 8). Its 4 + 8 B copies are new segments (a
    freed activation block is far smaller); the partition's flat and fp32 copy fit them. Under
    one weight group ('deepspeed') the slice is the whole embedding."""
    run = next(
        r
        for r in load_runs()
        if r.name == "ds-a100-bloom-prequel-02-25-h14336-l72-a64-dp4-tp8-pp12-mb4-gbs2048"
    )
    h, emb = 14336, 250880 * 14336 / 8
    piece = (emb + 4 * h * h) / 4
    assert piece < emb
    bs = recipe_rank_memory(plan_input(run, recipe_of(run)), RECIPES[recipe_of(run)], 0)
    assert recipe_of(run) == "deepspeed-bigscience-2022"
    assert bs.detail["zero_step.check_copies"] == pytest.approx(12 * piece)
    assert bs.detail["zero_step.new_segments"] == pytest.approx(12 * piece)
    ds = recipe_rank_memory(plan_input(run, "deepspeed"), RECIPES["deepspeed"], 0)
    assert ds.detail["zero_step.check_copies"] == pytest.approx(12 * emb)
