"""The named terms calibrated against the dry-run (issue #5), checked by hand arithmetic.

Each expected value below is written out from the term's docstring (what tensor it counts), so a
change to a formula is a deliberate change to what it claims to count. The dry-run agreement
itself is tests/planner/test_accuracy.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset, resolve_model
from scaletrain.planner import PlanInput, estimate
from scaletrain.planner.memory.activations import (
    layer_activation_bytes,
    mlp_backward_work_bytes,
    rope_table_bytes,
    selective_recompute_bytes,
)
from scaletrain.planner.memory.head import embedding_backward_bytes, held_logits_bytes
from scaletrain.planner.time.flops import (
    FLASH_BACKWARD_FACTOR,
    counted_flops_per_token,
    flops_per_token,
    matmul_params,
)

GPT2 = resolve_model("gpt2-124m")
LLAMA = resolve_model("llama2-7b")


def test_embedding_backward_temporaries():
    V, h = GPT2.vocab_size, GPT2.dim
    # tied, no TP: embedding grad + head contribution + their sum, fp32
    assert embedding_backward_bytes(GPT2, grad_bytes=4) == 3 * V * h * 4
    # tied, tp 4 (vocabulary-parallel embedding): this rank's rows of the grad, head part, sum
    assert embedding_backward_bytes(GPT2, tp=4, grad_bytes=4) == pytest.approx(3 * V * h * 4 / 4)
    # untied llama, bf16 FSDP units: the grad alone, V/tp rows of it under tp
    V, h = LLAMA.vocab_size, LLAMA.dim
    assert embedding_backward_bytes(LLAMA, grad_bytes=2) == V * h * 2
    assert embedding_backward_bytes(LLAMA, tp=2, grad_bytes=2) == V * h * 2 / 2


def test_held_logits_and_rope_tables():
    # the pipeline's last stage (logits path) holds its logits; the fused loss holds none
    assert (
        held_logits_bytes(GPT2, seq_len=256, micro_batch=2, precision="fp32", fused=False)
        == 4 * 256 * 2 * GPT2.vocab_size
    )
    assert (
        held_logits_bytes(LLAMA, seq_len=2048, micro_batch=1, tp=2, precision="bf16", fused=False)
        == 2 * 2048 * LLAMA.vocab_size / 2
    )
    assert held_logits_bytes(LLAMA, seq_len=2048, micro_batch=1, tp=2) == 0.0
    assert rope_table_bytes(GPT2) == 0.0
    assert rope_table_bytes(LLAMA) == 2 * 4 * LLAMA.max_seq_len * LLAMA.head_dim


def test_gqa_saves_kv_heads_and_autocast_saves_casts():
    """K and V are saved at the g KV heads (SDPA enable_gqa): a GQA model saves 2 e*s*b*(h -
    kv) less than the same model with MHA; autocast adds 3 e*s*b*h for SwiGLU and the fp32
    norms' 6 B per element each."""
    gqa = resolve_model("llama3-8b")
    mha = dataclasses.replace(gqa, num_kv_heads=gqa.num_heads)
    kw = dict(seq_len=1024, micro_batch=1, precision="bf16")
    assert layer_activation_bytes(mha, **kw) - layer_activation_bytes(gqa, **kw) == pytest.approx(
        2 * 2 * 1024 * (gqa.dim - gqa.kv_dim)
    )
    plain = layer_activation_bytes(gqa, **kw, residual_fp32=False)
    cast = layer_activation_bytes(gqa, **kw, residual_fp32=True)
    # each RMSNorm over a fp32 residual saves x and the fp32 normalized output (8 B per
    # element), over a 16-bit one x alone (models/norms.py: 2 B)
    norms = 2 * (8 - 2) * 1024 * gqa.dim
    assert cast - plain == pytest.approx(norms + 3 * 2 * 1024 * gqa.dim)
    # an eager rms_norm(x.float()) over the 16-bit stream (torchtitan's) saves its fp32 upcast
    # too: 4 B more per element and norm
    upcast = layer_activation_bytes(gqa, **kw, residual_fp32=False, rmsnorm_upcast=True)
    assert upcast - plain == pytest.approx(2 * 4 * 1024 * gqa.dim)


def test_selective_recompute_recreates_the_no_ac_set_less_what_was_kept():
    """Under selective AC a block's backward re-creates its no-AC set except the tensors the
    policy kept; the kept wo/w2 outputs (and their TP reductions) are not in that set, and the
    recompute pops wo's (and its reduction) from checkpoint's cache and frees them at the
    residual add, while w2's stay cached (early stop before w2's matmul replays)."""
    m = resolve_model("tiny-llama")
    tok, h, e = 2 * 128, m.dim, 2
    kw = dict(seq_len=128, micro_batch=2, precision="bf16")
    for tp, sp in ((1, False), (2, False), (2, True)):
        full = layer_activation_bytes(m, **kw, tp=tp, sp=sp, ac="none")
        kept = layer_activation_bytes(m, **kw, tp=tp, sp=sp, ac="selective")
        reduced = 0 if tp == 1 else e * tok * h / (tp if sp else 1)
        got = selective_recompute_bytes(m, full=full, stored=kept, tokens=tok, tp=tp, sp=sp, e=e)
        assert got == pytest.approx(full - kept + (e * tok * h + reduced))
    # tiny-llama, tp 1, by hand: no-AC set 595,968 B (the norms: 2 x (2 x 256 x 64 + 4 x 256),
    # models/norms.py), kept 380,928 B, w2's output 32,768 B still cached (wo's, freed by the
    # recompute, was counted too until the 70B op trace showed the free: 280,576 B then)
    full = layer_activation_bytes(m, **kw, ac="none")
    kept = layer_activation_bytes(m, **kw, ac="selective")
    assert (full, kept) == (595968, 380928)
    assert (
        selective_recompute_bytes(m, full=full, stored=kept, tokens=tok, tp=1, sp=False, e=e)
        == 247808
    )
    # what a block's backward holds first: the output's gradient (2 x 256 x 64), the MLP's
    # two (tokens x f) gradients (2 x 2 x 256 x 176) and w2's unsharded gradient (2 x 64 x 176)
    assert (
        mlp_backward_work_bytes(m, tokens=tok, tp=1, sp=False, e=e, weight_bytes=2)
        == 32768 + 180224 + 22528
    )
    assert (
        mlp_backward_work_bytes(m, tokens=tok, tp=2, sp=True, e=e, weight_bytes=2)
        == (32768 + 180224 + 22528) / 2
    )


def test_mlp_backward_work_holds_the_gathered_gradient_under_sp_when_h_exceeds_f_over_t():
    """Under SP, w2's backward reads the output gradient all-gathered over the tp ranks
    (e*tok*h, whole) beside its input gradient (e*tok*f/t): at Llama-3-70B widths with tp8
    (h 8,192 against f/t 3,584) that outweighs SwiGLU's two (tok x f/t) gradients, where the
    dry-run peaks (w2's input-gradient matmul); without SP, or where f/t > h, the activation's
    backward stays the term."""
    m = resolve_model("llama3-70b")
    tok, e, h, f, t = 16 * 8192, 2, m.dim, m.ffn_dim, 8
    wgrad = 2 * h * f / t
    fe = e * tok * f / t
    got = mlp_backward_work_bytes(m, tokens=tok, tp=t, sp=True, e=e, weight_bytes=2)
    assert got == pytest.approx(e * tok * h / t + e * tok * h + fe + wgrad)
    assert got - (e * tok * h / t + 2 * fe + wgrad) == pytest.approx(e * tok * h - fe)
    # without SP no gathered copy: SwiGLU's stage
    plain = mlp_backward_work_bytes(m, tokens=tok, tp=t, sp=False, e=e, weight_bytes=2)
    assert plain == pytest.approx(e * tok * h + 2 * fe + wgrad)


def test_counted_flops_match_flop_counter_semantics():
    s = 1024
    per_layer, head = matmul_params(GPT2)
    blocks = 2.0 * GPT2.num_layers * per_layer
    lin = blocks + 2.0 * head
    core = GPT2.num_layers * 4.0 * s * GPT2.dim  # QK^T + AV, full s x s
    plain = dict(fused_head=False)  # the head as an nn.Linear (a pipeline's last stage)
    assert counted_flops_per_token(GPT2, s, **plain) == pytest.approx(
        3 * lin + (1 + FLASH_BACKWARD_FACTOR) * core
    )
    # the un-halved model FLOPs differ only in the attention backward factor (2 vs 2.5)
    assert counted_flops_per_token(GPT2, s, **plain) - flops_per_token(
        GPT2, s, causal=False
    ) == pytest.approx(0.5 * core)
    # the fused head + loss recomputes the logits in backward: 4 head matmuls, not 3
    assert counted_flops_per_token(GPT2, s) - counted_flops_per_token(
        GPT2, s, **plain
    ) == pytest.approx(2.0 * head)
    # tp: block linears are the group's (global shapes), attention is the rank's heads, the
    # fused head runs on this rank's V/tp rows
    assert counted_flops_per_token(GPT2, s, layout=Layout(tp=4)) == pytest.approx(
        3 * blocks + 4 * 2.0 * head / 4 + (1 + FLASH_BACKWARD_FACTOR) * core / 4
    )
    # cp 2 zigzag ring: 3/4 of the full s x s work per rank
    assert counted_flops_per_token(GPT2, s, layout=Layout(cp=2), **plain) == pytest.approx(
        3 * lin + (1 + FLASH_BACKWARD_FACTOR) * core * 0.75
    )
    # full recompute: every block matmul but the down projection, plus the attention core
    down = GPT2.dim * GPT2.ffn_dim
    assert counted_flops_per_token(GPT2, s, recompute="full") - counted_flops_per_token(
        GPT2, s
    ) == pytest.approx(2 * GPT2.num_layers * (per_layer - down) + core)
    # selective keeps every matmul and SDPA output: nothing counted is recomputed, except the
    # naive core's S x S matmuls
    assert counted_flops_per_token(GPT2, s, recompute="selective") == pytest.approx(
        counted_flops_per_token(GPT2, s)
    )
    naive = dataclasses.replace(GPT2, attention="naive")
    assert counted_flops_per_token(naive, s, recompute="selective") - counted_flops_per_token(
        naive, s
    ) == pytest.approx(core)
    with pytest.raises(ValueError):
        counted_flops_per_token(GPT2, s, recompute="some")


def _plan(model, layout, **kw):
    base = dict(
        model=model,
        hardware=hardware_preset("h100-sxm"),
        num_gpus=layout.world_size,
        layout=layout,
        seq_len=256,
        global_batch=2 * layout.dp,
        micro_batch=2,
        precision="fp32",
    )
    return PlanInput(**{**base, **kw})


def test_embedding_moment_names_its_temporaries():
    """A tied model's first stage reports the embedding-backward temporaries as a buffer term;
    under DDP fp32 at gpt2 widths that moment is the peak (dry-run: gpt2-124m-L2 dp2 z0)."""
    m = dataclasses.replace(GPT2, num_layers=2)
    est = estimate(_plan(m, Layout(dp=2, zero=0))).memory
    emb = est.buffer_terms["embedding_backward_temp"]
    assert emb == embedding_backward_bytes(m, grad_bytes=4)
    ctx = est.buffer_terms["runtime_context"]
    n = m.num_params()
    states = 4 * n * 2 + 8 * n  # params, DDP bucket copy, AdamW moments
    other_grads = 4 * (n - m.param_counts().embedding)
    logits = held_logits_bytes(m, seq_len=256, micro_batch=2, precision="fp32")
    assert est.total - ctx == pytest.approx(states + other_grads + logits + emb)
