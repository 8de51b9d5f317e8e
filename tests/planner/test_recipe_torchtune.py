"""The torchtune recipe: bf16 parameters, gradients and AdamW states, LoRA / QLoRA over a frozen
bf16 or NF4 base, the chunked fp32 loss, hand-counted on tiny-llama; and the corpus's torchtune
rows planned with it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scaletrain.config import Layout, hardware_preset, model_preset
from scaletrain.planner import estimate
from scaletrain.planner.memory.lora import (
    compiled_dequantize_bytes,
    dequantize_work_bytes,
    lora_terms,
)
from scaletrain.planner.recipes.defaults import apply_defaults
from scaletrain.planner.recipes.memory import recipe_problems
from scaletrain.planner.recipes.published import FRAMEWORK_RECIPE, load_runs, plan_input, recipe_of
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.types import PlanInput

# tiny-llama: h 64, 2 layers, 4 heads of 16, 2 KV heads (kv_dim 32), ffn 176, vocab 256, untied
H, F, V, KV = 64, 176, 256, 32
T = 128 * 2  # tokens of one micro-batch (seq 128 x micro-batch 2)
FROZEN = H * H + KV * H + KV * H + H * H + 3 * F * H  # a block's seven projections: 46080
BASE = 2 * (FROZEN + 2 * H) + 2 * V * H + H  # blocks (with their norms), embedding, head, norm


def _plan(targets: tuple[str, ...], base: str, ac: str = "none") -> PlanInput:
    return PlanInput(
        model_preset("tiny-llama"),
        hardware_preset("a100-80gb"),
        1,
        Layout(dp=1),
        128,
        2,
        2,
        "bf16",
        ac=ac,
        recipe="torchtune",
        lora_rank=4,
        lora_targets=targets,
        lora_base=base,
    )


def test_lora_states_are_bf16_and_the_adapters_only_train() -> None:
    p = _plan(("wq", "wv"), "bf16")
    assert p.model.param_counts().total == BASE
    adapters = 2 * (4 * (H + H) + 4 * (H + KV))  # A and B of wq and wv, two blocks: 1792
    m = estimate(p).memory
    assert m.params == 2 * (BASE + adapters)  # everything bf16, no fp32 master, no cast
    assert m.grads == 2 * adapters
    assert m.optimizer == (2 + 2) * adapters  # AdamW's m and v zeros_like the bf16 adapters


def test_lora_activations_hand_counted() -> None:
    p = _plan(("wq", "wv"), "bf16")
    norms = 2 * (4 * H + 4) * T  # torchtune's RMSNorm saves its fp32 upcast and rstd
    qv_in = 2 * T * H  # the A's of q and v share the block's normed input
    attn = 2 * T * (2 * H + 2 * H) + 4 * 4 * T  # q, K and V expanded to 4 heads, out, lse
    mlp = 3 * 2 * T * F  # gate, silu(gate), up (no adapter on w2: its input is not saved)
    lora_out = 2 * 2 * T * 4  # each A's output, saved by its B
    block = norms + qv_in + attn + mlp + lora_out
    first = (4 * H + 4) * T  # the first block's first norm: its input needs no gradient
    head = 4 * T * V + 4 * T * H + 4 * T  # fp32 log-softmax of every chunk, final norm's upcast
    m = estimate(p).memory
    assert m.activations == 2 * block - first + head
    # the loss forward: the 16-bit chunks and one chunk's fp32 upcast (8 chunks)
    assert m.buffer_terms["loss_backward_temp"] == 2 * T * V + 4 * T * V / 8
    # compiled, each chunk keeps its 16-bit logits and 8 B of statistics per token instead
    c = estimate(replace(p, compile=True)).memory
    assert c.buffer_terms["loss_backward_temp"] == 2 * T * V / 8


def test_full_ac_keeps_the_block_inputs_and_recomputes_one_block() -> None:
    p = _plan(("wq", "wv"), "bf16", ac="full")
    none = estimate(_plan(("wq", "wv"), "bf16")).memory
    m = estimate(p).memory
    head = 4 * T * V + 4 * T * H + 4 * T
    assert m.activations == 2 * 2 * T * H + head
    # while one block recomputes, its whole ac-none set (the first block's included); the
    # head's saved tensors were freed by the head's backward before it, and what is left
    # outweighs the loss forward's temporaries (the peak without recompute)
    block = (none.activations - head + (4 * H + 4) * T) / 2
    loss = none.buffer_terms["loss_backward_temp"]
    assert block - head > loss
    assert m.total - m.activations == none.total - none.activations - loss + block - head


def test_the_head_is_freed_before_a_block_recomputes() -> None:
    # the peak under full AC is the larger of the loss backward (every block's input, the
    # head's saved tensors, the loss temporaries) and a block's recompute after the head's
    # backward freed what it saved (every block's input, the recomputed block's set)
    p = _plan(("wq", "wv"), "bf16", ac="full")
    m = estimate(p).memory
    head = 4 * T * V + 4 * T * H + 4 * T
    inputs = 2 * 2 * T * H
    none = estimate(_plan(("wq", "wv"), "bf16")).memory
    block = (none.activations - head + (4 * H + 4) * T) / 2
    loss = m.buffer_terms["loss_backward_temp"]
    assert m.activations == inputs + head
    # dp 1: no unit in flight; no gradient yet (set to none after every step: they come
    # block by block, and the backward's end, with every one of them, is lower here)
    states, other = m.params + m.optimizer, m.buffers - loss
    assert m.total == states + other + max(inputs + head + loss, inputs + block)
    assert inputs + block > inputs + head + loss  # here the recompute is the peak ...
    assert m.total < states + other + inputs + head + block  # ... without the head beside it


def test_qlora_nf4_base_and_its_bf16_dequantization() -> None:
    targets = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
    p = _plan(targets, "nf4")
    lt = lora_terms(p.model, 4, targets, "nf4", "bf16")
    adapters = 2 * (4 * (2 * H) + 2 * 4 * (H + KV) + 4 * (2 * H) + 3 * 4 * (H + F))
    assert 2 * lt.adapters == adapters == 9344
    m = estimate(p).memory
    assert m.params == 2 * (BASE - 2 * FROZEN) + 2 * lt.stored + 2 * adapters
    assert m.grads == 2 * adapters and m.optimizer == 4 * adapters
    # torchao's get_original_weight on a bf16 NF4 tensor: int64 codes (8 B) and three bf16
    # tensors per value of the largest projection (176 x 64)
    assert m.buffer_terms["lora_dequantize"] == (8 + 3 * 2) * F * H
    # compiled (training.compile_model compiles each layer), Inductor fuses the dequantization
    # into one kernel whose only output is the bf16 weight the matmul reads, and the backward
    # recomputes it from the NF4 codes: 2 B per value of the largest projection
    c = estimate(replace(p, compile=True)).memory
    assert c.buffer_terms["lora_dequantize"] == 2 * F * H
    assert c.params == m.params and c.activations <= m.activations


def test_compiled_dequantization_is_the_compute_dtype_weight() -> None:
    assert compiled_dequantize_bytes("nf4", 176, 64, "bf16") == 2 * 176 * 64
    assert compiled_dequantize_bytes("int8", 176, 64, "bf16") == 2 * 176 * 64
    assert compiled_dequantize_bytes("nf4", 176, 64, "fp32") == 4 * 176 * 64
    assert compiled_dequantize_bytes("bf16", 176, 64, "bf16") == 0.0
    assert compiled_dequantize_bytes("bf16", 176, 64, "fp32") == 4 * 176 * 64
    assert compiled_dequantize_bytes("auto", 176, 64, "bf16") == 0.0
    # the eager temporaries it replaces: int64 codes and three bf16 tensors per value
    assert dequantize_work_bytes("nf4", 176, 64, "bf16", 2.0) == 7 * compiled_dequantize_bytes(
        "nf4", 176, 64, "bf16"
    )


def test_full_training_is_bf16_with_bf16_adamw_states() -> None:
    p = replace(_plan((), "auto"), lora_rank=0)
    m = estimate(p).memory
    assert m.params == 2 * BASE and m.grads == 2 * BASE and m.optimizer == 4 * BASE


def test_defaults_refusals_and_other_recipes_untouched() -> None:
    assert apply_defaults("torchtune", Layout(dp=8), None, ()).layout.zero == 3
    one = apply_defaults("torchtune", Layout(dp=1), None, ())
    assert one.layout.zero == 0 and one.ac == "full"
    assert recipe_problems("torchtune", Layout(dp=4, tp=2, zero=3))
    assert recipe_problems("torchtune", Layout(dp=4, pp=2, zero=3))
    assert recipe_problems("torchtune", Layout(dp=8, zero=3), ac="selective")
    for name, r in RECIPES.items():
        if name != "torchtune":
            assert not r.sdpa_kv_expanded, name
            assert r.loss != "chunked_fp32", name
        if name not in ("torchtune", "automodel"):
            # NeMo AutoModel shares the bf16 states and LoRA terms (test_recipe_automodel.py);
            # deepspeed plans PEFT's adapters (test_recipe_lora_refusals.py)
            assert not r.optimizer_state_bytes, name
            assert not r.lora or name == "deepspeed", name


def test_corpus_torchtune_rows_take_the_recipe() -> None:
    assert FRAMEWORK_RECIPE["torchtune"] == "torchtune"
    rows = [r for r in load_runs() if r.framework == "torchtune"]
    assert len(rows) == 8
    for run in rows:
        assert recipe_of(run) == "torchtune"
        p = plan_input(run, "torchtune")
        assert not recipe_problems("torchtune", p.layout, ac=p.ac), run.name
        m = estimate(p).memory
        assert m.total > 0
        if run.lora is not None:
            # the adapters' gradients only: well under 1% of the bf16 weights
            assert m.grads < 0.01 * m.params, run.name


@pytest.mark.parametrize("base", ["bf16", "nf4"])
def test_lora_under_zero3_shards_the_base_and_gathers_units(base: str) -> None:
    p = replace(
        _plan(("wq", "wv"), base),
        num_gpus=2,
        layout=Layout(dp=2, zero=3),
        global_batch=4,
    )
    one = estimate(_plan(("wq", "wv"), base)).memory
    m = estimate(p).memory
    assert m.optimizer == pytest.approx(one.optimizer / 2)
    adapters = 2 * 896  # wq and wv of both blocks
    # sharded adapter gradients and one unit's unsharded ones
    assert m.grads == 2 * adapters / 2 + 2 * 896
    if base == "bf16":
        # the shard of the states, the unit computing and the prefetched one (frozen
        # projections, norms, adapters), the root (embedding, final norm, head) kept gathered
        unit = 2 * (FROZEN + 2 * H + 896)
        assert m.params == one.params / 2 + 2 * unit + 2 * (2 * V * H + H)


def test_a_run_with_the_unchunked_loss_upcasts_the_whole_logits() -> None:
    p = replace(_plan(("wq", "wv"), "bf16"), chunked_loss=False)
    chunked = estimate(_plan(("wq", "wv"), "bf16")).memory
    m = estimate(p).memory
    # the same saved fp32 log-softmax; its backward's two fp32 gradients of every logit
    assert m.activations == chunked.activations
    assert m.buffer_terms["loss_backward_temp"] == 8 * T * V
    # compiled over the model's fp32 logits: the fp32 input and per-token statistics kept, the
    # fp32 gradient and its 16-bit cast at the backward
    c = estimate(replace(p, compile=True)).memory
    assert c.activations - m.activations == 8 * T
    assert c.buffer_terms["loss_backward_temp"] == (4 + 2) * T * V


@pytest.mark.parametrize("ac", ["none", "full"])
def test_gradients_set_to_none_meet_the_activations_only_at_the_backward_end(ac: str) -> None:
    p = replace(_plan((), "auto", ac=ac), lora_rank=0)
    none = estimate(replace(p, ac="none")).memory
    m = estimate(p).memory
    ctx = m.buffer_terms["runtime_context"]
    loss = m.buffer_terms["loss_backward_temp"]
    per_layer = m.detail["activations.per_layer"]
    # under full AC one block's ac-none set while it recomputes
    recompute = 0.0 if ac == "none" else none.detail["activations.per_layer"]
    # the head's saved tensors are freed by its backward, before any block recomputes
    head = m.detail["activations.head"]
    start = m.params + m.optimizer + m.activations + max(recompute - head, loss)
    end = m.params + m.optimizer + m.grads + per_layer + recompute
    assert m.total == ctx + max(start, end)
    # the start holds no gradient, the end every one
    assert end - per_layer - recompute == m.params + m.optimizer + m.grads
    # a framework that allocates its gradients up front (every other recipe) adds them all
    # (NeMo AutoModel's train_ft.py zero_grad() frees them too: test_recipe_automodel.py)
    assert not any(
        r.grads_set_to_none for n, r in RECIPES.items() if n not in ("torchtune", "automodel")
    )
