"""torchtitan version terms of the torchtitan recipe: FSDP2 end units (`PlanInput.fsdp_ends`,
recipes/memory.py `fsdp_end_units`): torchtitan before 83e6941 keeps the root unit (embedding,
final norm, head) gathered through the backward; from it the embedding is its own unit,
resharded after forward, and the final norm + head one unit reduce-scattered among the stored
activations; and the op-SAC save list missing the run's SDPA kernel (`PlanInput.sdpa_saved`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scaletrain.config import ConfigError, Layout, hardware_preset, model_preset
from scaletrain.planner.recipes.memory import recipe_rank_memory
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.types import PlanInput

TT = RECIPES["torchtitan"]


def _plan(seq: int = 8192, **layout: int) -> PlanInput:
    L = Layout(**{"dp": 8, "zero": 3, **layout})
    return PlanInput(
        model=model_preset("llama3-8b"),
        hardware=hardware_preset("h100-sxm"),
        num_gpus=L.dp * L.tp * L.pp * L.cp,
        layout=L,
        seq_len=seq,
        global_batch=L.dp,
        micro_batch=1,
        ac="selective",
        compile=True,
        recipe="torchtitan",
    )


def test_own_units_drop_the_embedding_from_the_backward_peak() -> None:
    base = _plan()
    root = recipe_rank_memory(base, TT, 0)
    unstated = recipe_rank_memory(dataclasses.replace(base, fsdp_ends="root"), TT, 0)
    own = recipe_rank_memory(dataclasses.replace(base, fsdp_ends="own_units"), TT, 0)
    assert unstated.total == root.total and unstated.reserved == root.reserved
    pc = base.model.param_counts()
    # the embedding's bf16 copy is no longer gathered at the peak
    assert root.detail["params.in_flight"] - own.detail["params.in_flight"] == pytest.approx(
        2.0 * pc.embedding
    )
    # seq 8192: the head unit's fp32 reduce-scatter input (4 B x V x h) equals the compiled
    # loss's bf16 logits gradient (2 B x T x V) but for the final norm's 4 x h, so the
    # embedding is what moves the total
    assert root.total - own.total == pytest.approx(2.0 * pc.embedding - 4.0 * pc.final_norm)


def test_own_units_head_reduce_scatter_can_set_the_peak() -> None:
    """seq 2048: the head unit's fp32 copy-in (4 B x its parameters) exceeds the loss
    backward's temporaries and a block's reduce-scatter, so it is the transient counted."""
    base = _plan(seq=2048)
    own = recipe_rank_memory(dataclasses.replace(base, fsdp_ends="own_units"), TT, 0)
    pc = base.model.param_counts()
    tail = 4.0 * (pc.final_norm + pc.head)
    d, b = own.detail, own.buffer_terms
    fixed = own.params + own.grads + own.optimizer + own.activations + b["runtime_context"]
    assert tail > b["loss_backward_temp"] and tail > b["fsdp_reduce_scatter"]
    assert own.total == pytest.approx(fixed + tail)
    assert d["params.in_flight"] > 0


def test_own_units_leave_pipelines_and_other_recipes_alone() -> None:
    pp = _plan(pp=2)
    assert (
        recipe_rank_memory(dataclasses.replace(pp, fsdp_ends="own_units"), TT, 1).total
        == recipe_rank_memory(pp, TT, 1).total
    )


def test_bad_fsdp_ends_is_refused() -> None:
    with pytest.raises(ConfigError, match="fsdp_ends"):
        recipe_rank_memory(dataclasses.replace(_plan(), fsdp_ends="split"), TT, 0)


def test_published_row_fsdp_ends_parses(tmp_path: Path) -> None:
    """`layout.fsdp_ends` reaches PlanInput under the framework recipe only; an unknown name
    is refused by its field."""
    from scaletrain.planner.recipes.published import load_runs, plan_input

    row = """
[[runs]]
name = "t"
framework = "torchtitan"
source = "https://example.org/table 1"
gpu = "h100-sxm"
num_gpus = 8
seq_len = 8192
model = { preset = "llama3-8b" }
layout = { dp = 8, zero = 3, micro_batch = 1, global_batch = 8, ac = "selective", fsdp_ends = "%s" }
measured = { memory_gib = 40.0, memory_kind = "reserved" }
"""
    p = tmp_path / "runs.toml"
    p.write_text(row % "own_units")
    (run,) = load_runs(p)
    assert plan_input(run, "torchtitan").fsdp_ends == "own_units"
    assert plan_input(run, "scaletrain").fsdp_ends == "unstated"
    p.write_text(row % "split")
    with pytest.raises(ConfigError, match="fsdp_ends"):
        load_runs(p)


def test_unsaved_sdpa_drops_its_output_from_every_layer() -> None:
    """`sdpa_saved` False (torchtitan's cuDNN attention on compute capability >= 10.0, absent
    from the op-SAC save list until b39377f): each layer stores neither SDPA's bf16 output nor
    its fp32 log-sum-exp."""
    base = _plan()
    saved = recipe_rank_memory(base, TT, 0)
    same = recipe_rank_memory(dataclasses.replace(base, sdpa_saved=True), TT, 0)
    cut = recipe_rank_memory(dataclasses.replace(base, sdpa_saved=False), TT, 0)
    m = base.model
    per_layer = 8192 * (2.0 * m.dim + 4.0 * m.num_heads)
    assert same.total == saved.total
    assert saved.detail["activations.per_layer"] - cut.detail[
        "activations.per_layer"
    ] == pytest.approx(per_layer)
    assert saved.activations - cut.activations == pytest.approx(m.num_layers * per_layer)
    # full AC and no AC do not read it
    full = dataclasses.replace(base, ac="full")
    assert (
        recipe_rank_memory(dataclasses.replace(full, sdpa_saved=False), TT, 0).total
        == recipe_rank_memory(full, TT, 0).total
    )


def test_corpus_rows_state_the_torchtitan_version_terms() -> None:
    """The tao rows carry their torchtitan commit's terms to the framework recipe only."""
    from scaletrain.planner.recipes.published import load_runs, plan_input

    runs = {r.name: r for r in load_runs() if r.name.startswith("tao-")}
    b200 = runs["tao-b200pl-l3-8b-fsdp8-bf16"]
    p = plan_input(b200, "torchtitan")
    assert p.fsdp_ends == "own_units" and p.sdpa_saved is False
    q = plan_input(b200, "scaletrain")
    assert q.fsdp_ends == "unstated" and q.sdpa_saved is None
    mi = plan_input(runs["tao-mi300x-l3-8b-fsdp8-bf16"], "torchtitan")
    assert mi.fsdp_ends == "own_units" and mi.sdpa_saved is None
    h100 = plan_input(runs["tao-h100-l3-8b-fsdp8-bf16"], "torchtitan")
    assert h100.fsdp_ends == "root" and h100.compile_loss is False
