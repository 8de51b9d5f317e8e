"""Adapter dropout under a LoRA plan (`PlanInput.lora_dropout`, `memory.lora.lora_dropout_bytes`):
each dropout module's dropped copy (saved by its A) and its 1-byte mask, per block, counted
under ac none and for the recomputed block under ac full; 0 leaves a plan as it was."""

from __future__ import annotations

import copy
import tomllib
from dataclasses import replace
from importlib import resources

import pytest

from scaletrain.config import ConfigError, model_preset
from scaletrain.planner import estimate
from scaletrain.planner.memory.head import MicroBatchShape
from scaletrain.planner.memory.lora import (
    lora_dropout_bytes,
    lora_layer_activation_bytes,
    lora_terms,
)
from scaletrain.planner.recipes.published import CORPUS, load_runs, parse_runs, plan_input

ALL = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


@pytest.fixture(scope="module")
def runs():
    return load_runs()


def _setup(targets: tuple[str, ...] = ALL):
    m = model_preset("llama2-7b")
    lt = lora_terms(m, 8, targets, "bf16", "bf16")
    mb = MicroBatchShape(seq_len=512, micro_batch=2, precision="bf16")
    return m, lt, mb


def test_no_dropout_adds_nothing() -> None:
    m, lt, mb = _setup()
    assert lora_dropout_bytes(m, lt, mb, autocast=False, p=0.0) == 0.0
    base = lora_layer_activation_bytes(m, lt, mb, r=4, autocast=False)
    assert lora_layer_activation_bytes(m, lt, mb, r=4, autocast=False, dropout=0.0) == base


def test_each_adapted_linear_keeps_its_dropped_input_and_mask() -> None:
    m, lt, mb = _setup()
    h, f, t, e = m.dim, m.ffn_dim, mb.tokens, 2.0
    # q, k, v: three copies and masks where one shared input was counted; w1, w3 alike with
    # two; wo: a copy and a mask beside SDPA's saved output; w2: its mask (the product was
    # counted as w2's adapter input and is now saved only as its dropped copy)
    want = (3 * (e + 1) - e) * t * h + (2 * (e + 1) - e) * t * h + (e + 1) * t * h + t * f
    got = lora_dropout_bytes(m, lt, mb, autocast=False, p=0.1)
    assert got == pytest.approx(want)
    base = lora_layer_activation_bytes(m, lt, mb, r=4, autocast=False)
    with_drop = lora_layer_activation_bytes(m, lt, mb, r=4, autocast=False, dropout=0.1)
    assert with_drop - base == pytest.approx(want)
    # the probability does not matter, only that there is a dropout module
    assert lora_dropout_bytes(m, lt, mb, autocast=False, p=0.5) == got


def test_autocast_adds_masks_only_and_fused_qkv_one_copy() -> None:
    m, lt, mb = _setup(("wq", "wv"))
    h, t, e = m.dim, mb.tokens, 2.0
    # under autocast each A already saved its own cast: dropout adds the masks
    assert lora_dropout_bytes(m, lt, mb, autocast=True, p=0.05) == pytest.approx(2 * t * h)
    # one shared input counted; two PEFT dropouts keep two copies and two masks
    assert lora_dropout_bytes(m, lt, mb, autocast=False, p=0.05) == pytest.approx(
        (2 * (e + 1) - e) * t * h
    )
    # LitGPT's LoRAQKVLinear: one dropout and one A for q and v
    fused = lora_dropout_bytes(m, lt, mb, autocast=False, p=0.05, fused_qkv=True)
    assert fused == pytest.approx(t * h)
    assert lora_dropout_bytes(m, lt, mb, autocast=True, p=0.05, fused_qkv=True) >= 0.0


def test_plan_counts_it_per_block_under_no_ac_and_once_under_full_ac(runs) -> None:
    r = next(r for r in runs if r.name == "fsdpqlora-4090x2-llama2-7b-lora-r64-ddp-b4")
    assert r.lora_dropout == 0.1
    p = plan_input(r)
    assert p.lora_dropout == 0.1
    none = replace(p, ac="none")
    grown_none = estimate(none).memory.activations - (
        estimate(replace(none, lora_dropout=0.0)).memory.activations
    )
    assert grown_none > 0
    full = replace(p, ac="full")
    a, b = estimate(full).memory, estimate(replace(full, lora_dropout=0.0)).memory
    # under full AC the stored block inputs do not change; only the block being recomputed
    # holds the copies and masks: one block's worth of what ac none keeps in every block
    assert a.activations - b.activations == pytest.approx(grown_none / p.model.num_layers)
    assert a.total > b.total


def test_corpus_rows_state_the_dropout_their_sources_give(runs) -> None:
    by = {r.name: r for r in runs}
    assert by["peft-fsdp-h100-llama2-70b-lora-r8-all"].lora_dropout == 0.1
    assert by["peft-dsz3-a100-40gb-llama2-70b-qlora-r8-all"].lora_dropout == 0.1
    lit = by["litgpt-a10g-tinyllama-lora-r32-all"]
    assert lit.lora_dropout == 0.05 and lit.lora_fused_qkv
    # rows whose sources do not state it keep 0
    assert by["tune-4090-l31-8b-lora-r8-qv"].lora_dropout == 0.0


def test_dropout_is_checked_on_load() -> None:
    raw = tomllib.loads(resources.files("scaletrain.planner").joinpath(CORPUS).read_text())
    i = next(i for i, r in enumerate(raw["runs"]) if r["name"] == "tune-4090-l31-8b-lora-r8-qv")
    for bad in (1.0, -0.1, "0.1", True):
        data = copy.deepcopy(raw)
        data["runs"][i]["lora"]["dropout"] = bad
        with pytest.raises(ConfigError, match=r"\.lora\.dropout = .* is invalid"):
            parse_runs(data, "corpus.toml")
    data = copy.deepcopy(raw)
    data["runs"][i]["lora"]["fused_qkv"] = "yes"
    with pytest.raises(ConfigError, match=r"\.lora\.fused_qkv"):
        parse_runs(data, "corpus.toml")
