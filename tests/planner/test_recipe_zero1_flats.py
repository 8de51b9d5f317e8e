"""DeepSpeed 0.4's ZeRO-1 after the backward (planner/recipes/zero1_flats.py, the
'deepspeed-0.4' recipe): the bucket and all-gather copies by hand, the best-fit replay's new
segments, the reservation they add, and the BigScience rows that name the recipe."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import ConfigError, Layout
from scaletrain.planner.recipes.memory import recipe_rank_memory
from scaletrain.planner.recipes.published import load_runs, parse_runs, recipe_of
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.recipes.zero1_flats import largest_freed_tensor, zero1_flats

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
    ds = [r for r in runs if r.name.startswith("ds-v100-")]
    assert len(ds) == 27 and all(recipe_of(r) == "deepspeed-0.4" for r in ds)
    others = [r for r in runs if r.framework == "deepspeed" and r not in ds]
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
