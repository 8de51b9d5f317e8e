"""`explain` under a framework recipe names the pipeline split its time and memory used (the
recipe's, `recipes.stages.recipe_stages`), not scaletrain's own balanced split."""

from __future__ import annotations

import re

import pytest

from scaletrain.planner import estimate
from scaletrain.planner.memory.states import stage_layer_counts
from scaletrain.planner.output.explain import explain
from scaletrain.planner.recipes.published import load_runs, plan_input

# Llama 3 70B at pp 8 x v 5: scaletrain's split (embedding and head counted as layers) is
# uneven, (9, 11, 11, 10, ...); Megatron's is 80 / 40 = 2 layers per virtual stage, 10 per rank
ROW = "megatron-h100-llama3-70b-64g-tp4-pp8-vp5-fp8"


@pytest.fixture(scope="module")
def row():
    return next(r for r in load_runs() if r.name == ROW)


def _slowest(text: str) -> tuple[int, int, bool]:
    m = re.search(r"slowest pipeline rank \(rank (\d+): (\d+) blocks( \+ head)?\)", text)
    assert m is not None, text
    return int(m.group(1)), int(m.group(2)), m.group(3) is not None


def test_megatron_label_is_the_even_split_the_time_used(row) -> None:
    text = explain(estimate(plan_input(row, "megatron")))
    assert "pipeline split (layers per rank) = (10, 10, 10, 10, 10, 10, 10, 10)" in text
    # every rank holds 10 layers and the last one the head too: it is the slowest
    assert _slowest(text) == (7, 10, True)
    assert "pp_split 'even'" in text and "config.stage_layer_ranges" not in text


def test_default_recipe_keeps_scaletrain_split(row) -> None:
    counts = stage_layer_counts(80, 8, 5, "interleaved")
    assert counts != (10,) * 8  # the two splits differ on this layout
    text = explain(estimate(plan_input(row, "scaletrain")))
    assert f"pipeline split (layers per rank) = {counts}" in text
    rank, blocks, _ = _slowest(text)
    assert blocks == counts[rank]
    assert "config.stage_layer_ranges" in text
