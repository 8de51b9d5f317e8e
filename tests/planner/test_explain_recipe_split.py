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


def test_comm_counts_the_blocks_of_the_recipes_fullest_stage() -> None:
    """Megatron's 1T of SC21 Table 1 (128 layers, pp 64): Megatron builds 2 layers per stage
    (get_num_layers_to_build), scaletrain's own split 3 on some ranks (embedding and head
    counted as layers). The TP all-reduces the step charges are the recipe's stage's."""
    from scaletrain.planner.recipes.registry import recipe_named
    from scaletrain.planner.time.step_time import comm_arguments

    run = next(r for r in load_runs() if r.name == "megatron-a100-sc21-gpt-1t-tp8-pp64-dp6")
    p = plan_input(run, "megatron")
    assert max(stage_layer_counts(128, 64, 1, "1f1b")) == 3
    assert comm_arguments(p, 1e9, 8, None, recipe_named("megatron")).layers == 2
    assert comm_arguments(p, 1e9, 8, None, None).layers == 3


def test_a_rows_stated_attention_kernel_is_the_frameworks_only() -> None:
    """SC21 rows state Megatron-LM 2021's materialized core (model.attention 'naive'): the
    framework recipe plans it, scaletrain's own recipe its default SDPA."""
    run = next(r for r in load_runs() if r.name.startswith("megatron-a100-sc21-gpt-1.7b"))
    assert run.model.attention == "naive"
    assert plan_input(run, "megatron").model.attention == "naive"
    assert plan_input(run, "scaletrain").model.attention == "sdpa"


def test_megatron_2021_pipeline_sends_scatter_gather_and_block() -> None:
    """SC21 rows state Megatron-LM 2021's p2p (`PlanInput.pp_scatter_gather`): each tp rank
    sends 1/tp of the boundary tensor plus a tp all-gather on receipt, and the interleaved
    schedule does not hide the sends; scaletrain's own recipe ignores the statement."""
    import dataclasses

    from scaletrain.planner.recipes.registry import recipe_named
    from scaletrain.planner.time.exposure import run_overlap

    run = next(r for r in load_runs() if r.name.startswith("megatron-a100-sc21-gpt-530b"))
    assert run.layout.pp_scatter_gather
    p = plan_input(run, "megatron")
    assert p.pp_scatter_gather and not plan_input(run, "scaletrain").pp_scatter_gather
    off = dataclasses.replace(p, pp_scatter_gather=False)
    mega = recipe_named("megatron")
    assert "pp_p2p_interleaved" in run_overlap(off, mega)
    assert "pp_p2p_interleaved" not in run_overlap(p, mega)
    full, sg = (estimate(x).time.comm_terms["pp_p2p"] for x in (off, p))
    assert sg < full / 4  # 1/8 of the bytes over the network, plus an NVLink all-gather


def test_deferred_head_wgrad_leaves_the_last_ranks_steady_state(row) -> None:
    """The 70B row states NeMo's defer_embedding_wgrad_compute with wgrad_deferral_limit 22
    (`PlanInput.head_wgrad_deferred`): 22 of its 64 micro-batches run 2 of the head's 3 GEMMs
    on the last rank, the deferred weight gradients run in its flush idle. The step shrinks
    by at most those 22 weight gradients; scaletrain's own recipe ignores the statement."""
    import dataclasses

    from scaletrain.planner.time.step_time import plan_efficiency

    p = plan_input(row, "megatron")
    assert p.head_wgrad_deferred == 22 and plan_input(row, "scaletrain").head_wgrad_deferred == 0
    off = dataclasses.replace(p, head_wgrad_deferred=0)
    on_t, off_t = estimate(p).time, estimate(off).time
    hf = 2 * p.model.dim * p.model.vocab_size  # head forward FLOPs per token
    tokens = p.seq_len * p.micro_batch / p.layout.tp
    # the head runs at the 16-bit peak x the plan's efficiency (step_time._block_time's `slow`)
    wgrad_s = hf * tokens / (p.hardware.flops("bf16") * plan_efficiency(p))
    assert 0 < off_t.step_s - on_t.step_s <= 22 * wgrad_s * 1.01
