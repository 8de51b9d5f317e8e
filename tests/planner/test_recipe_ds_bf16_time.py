"""DeepSpeed's BF16_Optimizer communication in the step time (time/recipe_terms.py
_BF16_OPTIMIZER_COMM, read at DeepSpeed ab61edb02 and 38327e07f), each pinned on a small case
against a hand computation: one all-reduce of the whole gradient buffer in bf16 after the
last backward and the bf16 weights' all-gather, both exposed; the tied embedding's fp32
gradient all-reduced between the first and the last stage; and the Jean Zay A100 node the
BLOOM rows of the corpus describe (4 Omni-Path links shared by 8 GPUs)."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.cli import main
from scaletrain.config import Layout, ModelConfig, hardware_preset
from scaletrain.planner.recipes.memory import bf16_optimizer_runs, recipe_worst_rank
from scaletrain.planner.recipes.published import load_runs
from scaletrain.planner.recipes.registry import recipe_named
from scaletrain.planner.time.comm import allreduce_time, axis_link, dp_allreduce_latency
from scaletrain.planner.time.step_time import StepTime
from scaletrain.planner.types import PlanInput

from ._recipe_step import recipe_step

TINY = ModelConfig(
    name="tiny-gpt",
    vocab_size=1024,
    dim=256,
    num_layers=4,
    num_heads=4,
    ffn_dim=1024,
    max_seq_len=512,
    attention="naive",
)


def _plan(layout: Layout, *, precision: str = "bf16", gb: int = 32) -> PlanInput:
    return PlanInput(
        TINY,
        hardware_preset("a100-80gb"),
        layout.world_size,
        layout,
        512,
        gb,
        1,
        precision,
        recipe="deepspeed",
    )


def _step(plan: PlanInput) -> StepTime:
    return recipe_step(plan, recipe_named("deepspeed"))


def test_bf16_optimizer_all_reduces_the_whole_buffer_in_bf16_after_the_backward() -> None:
    """dp 16 over two nodes, bf16 at ZeRO-1: one all-reduce of 2 B (communication_data_type
    bf16) x every parameter, 2(n-1)/n of it moved, one latency term of NCCL's ring / tree
    model, then the bf16 weights' all-gather, (n-1)/n x 2 B x P; both exposed whole. fp16 at
    ZeRO-1 (DeepSpeedZeroOptimizer) keeps the reduce-scatter of half those bytes."""
    lay = Layout(dp=16, zero=1)
    p = _plan(lay)
    ds = recipe_named("deepspeed")
    assert bf16_optimizer_runs(p, ds)
    _, P = recipe_worst_rank(p)
    n = 16
    bw, _, inter = axis_link(lay, p.hardware, "dp", None)
    assert inter
    st = _step(p)
    moved = 2 * (n - 1) / n * 2 * P
    ring = moved / bw + dp_allreduce_latency(lay, p.hardware, None, n)
    assert st.comm["dp_allreduce"] == pytest.approx((moved, ring))
    assert st.comm["zero_all_gather"][0] == pytest.approx((n - 1) / n * 2 * P)
    assert st.exposed_s == pytest.approx(st.comm["dp_allreduce"][1] + st.comm["zero_all_gather"][1])
    fp16 = _step(dataclasses.replace(p, precision="fp16"))
    assert fp16.comm["dp_allreduce"][0] == pytest.approx((n - 1) / n * 2 * P)


def test_bf16_optimizer_all_reduces_the_tied_fp32_grad_between_first_and_last_stage() -> None:
    """pp 2 across two nodes (tp 4 x dp 2 = one node per stage), TINY's embedding tied to its
    head: _exec_reduce_tied_grads all-reduces weight._hp_grad, the fp32 vocab shard
    (V x h / tp elements, 4 B), over the 2-rank tied group on the pp link (one rank per node:
    the NIC), exposed whole; fp16 (no BF16_Optimizer), untied or pp 1: nothing here."""
    lay = Layout(dp=2, zero=1, tp=4, pp=2)
    p = _plan(lay, gb=8)
    st = _step(p)
    bw, lat, inter = axis_link(lay, p.hardware, "pp", None)
    assert inter and bw == p.hardware.inter_node_bw
    nbytes = 4.0 * TINY.vocab_size * TINY.dim / 4
    assert st.comm["pp_tied_allreduce"] == pytest.approx(
        (nbytes, allreduce_time(nbytes, 2, bw, lat))
    )
    assert "pp_tied_allreduce" not in _step(dataclasses.replace(p, precision="fp16")).comm
    untied = dataclasses.replace(p, model=dataclasses.replace(TINY, tie_embeddings=False))
    assert "pp_tied_allreduce" not in _step(untied).comm
    assert "pp_tied_allreduce" not in _step(_plan(Layout(dp=2, zero=1, tp=4), gb=8)).comm


def test_bloom_rows_share_four_omni_path_links_among_eight_gpus() -> None:
    """The BLOOM rows' node (published_runs.toml): 4 x 100 Gb/s Omni-Path per 8-GPU node,
    6.25 GB/s per GPU; ds-a100-bloom176b's dp group (tp 4: 2 of its ranks per node) rings
    over 2 x 6.25 GB/s."""
    row = next(r for r in load_runs() if r.name == "ds-a100-bloom176b-gbs16")
    hw = row.hardware()
    assert hw.inter_node_bw == 6.25e9 and hw.gpus_per_node == 8
    lay = Layout(dp=8, zero=1, tp=4, pp=12)
    bw, _, inter = axis_link(lay, hw, "dp", None)
    assert inter and bw == pytest.approx(2 * 6.25e9)


def test_explain_names_the_bf16_optimizer_sync(capsys: pytest.CaptureFixture[str]) -> None:
    """explain prints the BF16_Optimizer line with its seconds and source; fp16 does not."""
    args = ["explain", "--recipe", "deepspeed", "--model", "llama3-8b", "--gpus", "16"]
    args += ["--gpu", "a100-80gb", "--zero", "1", "--pp", "2", "--global-batch", "16"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "BF16_Optimizer gradients: one bf16 all-reduce" in out
    assert "time.recipe_terms._BF16_OPTIMIZER_COMM" in out
    assert main([*args, "--precision", "fp16"]) == 0
    assert "BF16_Optimizer gradients" not in capsys.readouterr().out
