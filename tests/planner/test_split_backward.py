"""What a split backward (zero-bubble, DualPipeV) keeps between a micro-batch's input-gradient
pass (I) and its weight pass (W): `planner.memory.split_backward` and the schedule moments
that count it (torch-free). The agreement with the dry-run is benchmarks/planner_accuracy.py
(the llama-1024-V128k zero-bubble rows, issue #35)."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset, resolve_model
from scaletrain.planner import PlanInput, estimate, pipeline_rank_memory
from scaletrain.planner.memory.head import MicroBatchShape, head_activation_bytes
from scaletrain.planner.memory.pipeline_ranks import schedule_moments
from scaletrain.planner.memory.rank_terms import ModelTerms, activation_terms
from scaletrain.planner.memory.split_backward import (
    block_recorded_bytes,
    head_after_input_bytes,
    head_weight_pass_bytes,
)
from scaletrain.planner.output.explain import explain

LLAMA = resolve_model("llama3-8b")  # a 128,256-row head


def _big_head(layers: int = 4):
    """A 1024-wide llama with Llama 3's vocabulary (planner_accuracy's llama-1024-V128k): the
    head outweighs the blocks; at pp4 the last rank holds the head alone."""
    return dataclasses.replace(
        resolve_model("tiny-llama"),
        vocab_size=128256,
        dim=1024,
        num_heads=16,
        num_kv_heads=4,
        ffn_dim=2816,
        num_layers=layers,
        name="llama-1024-v128k",
    )


def _plan(model, layout: Layout, *, m: int = 8, seq: int = 512) -> PlanInput:
    gpus = layout.pp * layout.tp * layout.dp
    return PlanInput(
        model=model,
        hardware=hardware_preset("h100-sxm"),
        num_gpus=gpus,
        layout=layout,
        seq_len=seq,
        global_batch=m * layout.dp,
        micro_batch=1,
        precision="bf16",
    )


def test_a_head_past_its_input_pass_holds_the_logits_gradient_only():
    """I frees the loss's graph above the head's matmul: the bf16 logits and their fp32
    log-softmax (6 B a logit) give way to the logits' gradient the matmul recorded (2 B), and
    the final norm's recorded output gradient (r = 4 B under autocast) comes in."""
    mb = MicroBatchShape(seq_len=512, micro_batch=1, precision="bf16")
    tok, v, h = 512, LLAMA.vocab_size, LLAMA.dim
    before = head_activation_bytes(LLAMA, mb, residual_fp32=True, fused=False)
    after = head_after_input_bytes(LLAMA, mb, residual_fp32=True)
    assert before - after == pytest.approx(6 * tok * v - 2 * tok * v - 4 * tok * h)
    # offloaded: the stored inputs are on the host, the recorded gradients are not
    offloaded = head_after_input_bytes(LLAMA, mb, residual_fp32=True, offloaded=True)
    assert offloaded == pytest.approx(2 * tok * v + 4 * tok * h)


def test_tensor_parallel_heads_gather_their_logits_but_record_their_shard():
    """Pipeline stages run without loss_parallel: the logits before I are all-gathered (the
    whole vocabulary on every tp rank); the gradient I records is the head matmul's own
    (vocabulary-sharded) output's."""
    one = MicroBatchShape(seq_len=512, micro_batch=1, precision="bf16")
    tp2 = MicroBatchShape(seq_len=512, micro_batch=1, tp=2, precision="bf16")
    tok, v = 512, LLAMA.vocab_size
    assert head_activation_bytes(LLAMA, one, fused=False) == head_activation_bytes(
        LLAMA, tp2, fused=False
    )
    drop = head_after_input_bytes(LLAMA, one) - head_after_input_bytes(LLAMA, tp2)
    assert drop == pytest.approx(2 * tok * v / 2)
    # W's weight gradient: 16-bit, and fp32 next to it under autocast (an fp32 weight)
    table = v * LLAMA.dim
    assert head_weight_pass_bytes(LLAMA, weight_bytes=4) == 6 * table
    assert head_weight_pass_bytes(LLAMA, weight_bytes=2) == 2 * table
    assert head_weight_pass_bytes(LLAMA, precision="fp32") == 4 * table
    assert head_weight_pass_bytes(LLAMA, tp=2, weight_bytes=4) == 3 * table


def test_blocks_record_one_gradient_per_weight_join():
    """A block records its linears' and norms' output gradients; under LoRA only the adapters
    have weights with gradients."""
    mb = MicroBatchShape(seq_len=512, micro_batch=1, precision="bf16")
    h, q, kv, f = LLAMA.dim, LLAMA.q_dim, LLAMA.kv_dim, LLAMA.ffn_dim
    per_tok = 2 * 2 * h + 2 * (q + 2 * kv) + 2 * h + 2 * (2 * f + h)  # bf16 stream, no autocast
    assert block_recorded_bytes(LLAMA, mb) == pytest.approx(512 * per_tok)
    lora = block_recorded_bytes(LLAMA, mb, lora_rank=8, lora_targets=("wq", "wv"))
    assert lora == pytest.approx(512 * 2 * ((8 + q) + (8 + kv)))
    # MoE: each token's k expert copies, and DeepSeek's fp32 router logits
    v3 = resolve_model("deepseek-v3")
    dense = block_recorded_bytes(v3.dense_layer_view(), mb)
    assert block_recorded_bytes(v3, mb) > dense
    assert block_recorded_bytes(v3, mb, ep=8) == block_recorded_bytes(v3, mb)


def test_the_first_stage_records_nothing_and_later_ranks_wait_longer():
    """torch's first stage skips I (its whole backward runs at W); ZB-H1 defers W more on the
    later ranks, so more of their blocks hold what I recorded."""
    first = schedule_moments("zero-bubble", 4, 16, 1, 0, 8)
    assert all(x.layers_after_input == 0 for x in first)
    past = [
        max(x.layers_after_input for x in schedule_moments("zero-bubble", 4, 16, 1, r, 8))
        for r in (1, 2, 3)
    ]
    assert 0 < past[0] < past[1]
    # 1F1B has no input-gradient pass
    assert all(x.layers_after_input == 0 for x in schedule_moments("1f1b", 4, 16, 1, 2, 8))


def test_zero_bubble_plans_hold_no_logits_between_passes():
    """The last rank of a zero-bubble pipeline that holds only the head: its peak is its loss
    backward or its W, never the m logits paths the planner once kept until W (+109% on
    DeepSeek-V3's pp32 layout at 1/8 widths, issue #35); no logits are held after the loss
    backward (the schedule keeps no outputs)."""
    model = _big_head(layers=4)
    zb = _plan(model, Layout(pp=4, pp_schedule="zero-bubble"))
    terms = activation_terms(zb, ModelTerms(model), True)
    assert terms.held_logits == 0.0
    assert terms.head_after_input < terms.head / 2
    last = pipeline_rank_memory(zb, 3)
    assert last.moment in (
        "head weight pass (W) on the last stage",
        "loss backward on the last stage",
    )
    # the steady state: 8 or 64 micro-batches, the same peak
    longer = pipeline_rank_memory(_plan(model, Layout(pp=4, pp_schedule="zero-bubble"), m=64), 3)
    assert longer.total == pytest.approx(last.total, rel=1e-9)
    # the most it stores: one micro-batch's logits path (at its loss backward) beside pp - 1
    # heads past their I, not pp logits paths
    assert last.activations == pytest.approx(terms.head + 3 * terms.head_after_input)


def test_explain_names_the_head_weight_pass():
    """With a 128k-row head on a head-only last rank, the W's 16-bit and fp32 V x h
    gradients outweigh the loss backward's two fp32 (tokens, V) buffers at 512 tokens."""
    model = _big_head(layers=4)
    plan = _plan(model, Layout(pp=4, pp_schedule="zero-bubble"))
    est = estimate(plan)
    assert est.memory.moment == "head weight pass (W) on the last stage"
    assert "peak moment: head weight pass (W) on the last stage" in explain(est)


def test_the_search_cache_keeps_each_schedules_head_apart():
    """The search shares one `ModelTerms` cache over every layout: a zero-bubble layout
    evaluated after a 1F1B one of the same widths gets the unfused head and the split
    backward's terms, not the 1F1B layout's fused head (and the other way round)."""
    model = _big_head(layers=4)
    terms = ModelTerms(model)
    one_f_one_b = activation_terms(_plan(model, Layout(pp=4)), terms, True)
    zb = activation_terms(_plan(model, Layout(pp=4, pp_schedule="zero-bubble")), terms, True)
    assert one_f_one_b.head_after_input == one_f_one_b.recorded_per_layer == 0.0
    assert zb.head > 100 * one_f_one_b.head  # the logits path, not the fused loss's
    assert zb.recorded_per_layer > 0.0
    assert activation_terms(_plan(model, Layout(pp=4)), terms, True) is one_f_one_b
