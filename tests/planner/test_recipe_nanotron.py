"""Nanotron's recipe terms read off its source (nanotron c252843): the pipeline split by block
compute cost (recipes/stages.py), the decoder layer's saved tensors, the fp32 cast before the
loss and ZeRO-1's flattened all-gather (recipes/activations.py, recipes/memory.py), each
against a hand computation."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, ModelConfig
from scaletrain.planner.recipes.activations import recipe_head_bytes, recipe_layer_bytes
from scaletrain.planner.recipes.memory import recipe_rank_memory
from scaletrain.planner.recipes.registry import recipe_named
from scaletrain.planner.recipes.stages import compute_cost_stages, recipe_stages

from ._recipe_step import recipe_plan

# scripts/scaling_benchmarks.py model_configs '1B' of Nanotron's benchmark: 16 layers,
# h 2048, 32 heads (MHA), ffn 8192, vocab 131072, tied
NANO_1B = ModelConfig(
    name="nanotron-1.34b",
    vocab_size=131072,
    dim=2048,
    num_layers=16,
    num_heads=32,
    num_kv_heads=32,
    ffn_dim=8192,
    max_seq_len=4096,
    norm="rmsnorm",
    activation="swiglu",
    position="rope",
    tie_embeddings=True,
    bias=False,
)


def _plan(model: ModelConfig, layout: Layout, *, mb: int = 1, gb: int = 64, seq: int = 4096):
    return recipe_plan("nanotron", layout, model, seq=seq, gb=gb, mb=mb, gpu="h100-sxm")


def test_compute_cost_split_of_nanotrons_1b_benchmark_model() -> None:
    """A decoder layer costs 4 x 32 x 64 x 2048 + 3 x 8192 x 2048 = 67,108,864, the lm_head
    131072 x 2048 = 4 layers: 20 layer-units in all. pp 2: the threshold is 10 units; layer 10
    reaches it without exceeding it and layer 11 crosses it, staying on rank 0: 11 / 5.
    pp 4 (thresholds 5, 10, 15): layers 1-6 | 7-11 | 12-16 | the head alone.
    pp 8 (2.5 each): 3 | 3 | 2 | 3 | 2 | 3, the head on rank 6 (it crosses 17.5) and only the
    fp32 cast and the loss on rank 7."""
    assert compute_cost_stages(NANO_1B, 2).layers == (11, 5)
    assert compute_cost_stages(NANO_1B, 2).head_rank == 1
    assert compute_cost_stages(NANO_1B, 4).layers == (6, 5, 5, 0)
    assert compute_cost_stages(NANO_1B, 4).head_rank == 3
    eight = compute_cost_stages(NANO_1B, 8)
    assert eight.layers == (3, 3, 2, 3, 2, 3, 0, 0) and eight.head_rank == 6


def test_the_nanotron_recipe_uses_its_split_and_other_recipes_keep_theirs() -> None:
    """recipe_stages: Nanotron's cost split; Megatron's L / pp; scaletrain's own balance."""
    lay = Layout(dp=1, pp=2, pp_schedule="1f1b")
    p = _plan(NANO_1B, lay)
    assert recipe_stages(p, recipe_named("nanotron")).layers == (11, 5)
    assert recipe_stages(p, recipe_named("megatron")).layers == (8, 8)
    # rank 0 holds the embedding and its 11 blocks
    mem = recipe_rank_memory(p, recipe_named("nanotron"), 0)
    block = 4 * 2048 * 2048 + 3 * 2048 * 8192 + 2 * 2048  # attention, SwiGLU, two norms
    assert mem.detail["params.count"] == pytest.approx(11 * block + 131072 * 2048)


def test_nanotron_layer_saved_tensors_by_hand() -> None:
    """LlamaDecoderLayer's training path, per token, e = 2, MHA h = q = kv = 64, f = 256:
    two TritonRMSNorm inputs + fp32 rstd 2 x (2h + 4); the QKV / gate_up inputs 2 x 2h; the
    (3, b, s, heads, d) qkv buffer q is a view of 2 x 3h, the contiguous kv buffer 2 x 2h, the
    attention output 2h, log-sum-exp 4 x 4 heads; merged gate_up 2 x 2f, SiLU output 2f, the
    product 2f. Under tp 2 with SP (REDUCE_SCATTER, tp_recompute_allgather) all of it halves."""
    m = ModelConfig(
        name="tiny",
        vocab_size=256,
        dim=64,
        num_layers=2,
        num_heads=4,
        ffn_dim=256,
        max_seq_len=32,
        norm="rmsnorm",
        activation="swiglu",
        position="rope",
        bias=False,
    )
    h, f, tok = 64, 256, 32
    per_token = 2 * (2 * h + 4) + 2 * 2 * h + 2 * 3 * h + 2 * 2 * h + 2 * h + 4 * 4 + 8 * f
    r = recipe_named("nanotron")
    one = _plan(m, Layout(dp=1), seq=32, gb=1)
    assert recipe_layer_bytes(one, r) == pytest.approx(tok * per_token)
    sp = _plan(m, Layout(dp=1, tp=2, sp=True), seq=32, gb=1)
    assert recipe_layer_bytes(sp, r) == pytest.approx(tok * per_token / 2)
    # with GQA (2 kv heads of 16) q is copied apart: the dead k, v slots are not kept
    gqa = dataclasses.replace(m, num_kv_heads=2)
    per_gqa = per_token - 2 * 3 * h + 2 * h - 2 * 2 * h + 2 * 2 * 32
    assert recipe_layer_bytes(_plan(gqa, Layout(dp=1), seq=32, gb=1), r) == pytest.approx(
        tok * per_gqa
    )
    # recompute_layer keeps the layer input only
    full = dataclasses.replace(one, ac="full")
    assert recipe_layer_bytes(full, r) == pytest.approx(tok * 2 * h)


def test_nanotron_loss_forward_holds_the_16_bit_logits_and_their_fp32_cast() -> None:
    """cast_to_fp32 then _ShardedCrossEntropy's out-of-place max subtraction: at the loss
    forward the bf16 logits (2 B), the fp32 cast (4 B) and the saved softmax (4 B) coexist, 6 B
    per logit beyond the saved 4; Megatron's in-place vocab-parallel loss keeps 2 B (its 16-bit
    gradient at the loss backward)."""
    lay = Layout(dp=1)
    p = _plan(NANO_1B, lay, gb=1)
    tok, v = 4096.0, 131072
    stored, temp = recipe_head_bytes(p, recipe_named("nanotron"))
    assert temp == pytest.approx(6 * tok * v)
    assert stored == pytest.approx(2 * tok * 2048 * 2 + 4 * tok * v)
    _, mtemp = recipe_head_bytes(
        dataclasses.replace(p, recipe="megatron"), recipe_named("megatron")
    )
    assert mtemp == pytest.approx(2 * tok * v)


def test_nanotron_zero1_gathers_the_updated_weights_through_flat_copies() -> None:
    """ZeroDistributedOptimizer._all_gather_params -> distributed.all_gather_coalesced flattens
    the rank's shard and one output list per dp rank: 2 B x P (1 + 1/dp) beside the states at
    the step; none at ZeRO-0 or dp 1."""
    r = recipe_named("nanotron")
    z1 = recipe_rank_memory(_plan(NANO_1B, Layout(dp=4, zero=1)), r, 0)
    P = z1.detail["params.count"]
    assert z1.detail["optimizer_step.temp"] == pytest.approx(2 * P * (1 + 1 / 4))
    z0 = recipe_rank_memory(_plan(NANO_1B, Layout(dp=4)), r, 0)
    assert z0.detail["optimizer_step.temp"] == 0.0
