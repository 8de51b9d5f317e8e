"""The planner on DeepSeek: MLA's and DeepSeekMoE's saved activations equal what the trainer's
blocks really save (the activation ledger's saved-tensor hooks), the FLOPs are the active
parameters' matmuls, pipeline stages hold the parameters the trainer's split gives them (the
dense first blocks on stage 0), and DeepSeek-V3's published training layout (2,048 H800, PP16,
EP64, ZeRO-1 data parallel, no TP) plans."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from scaletrain.config import Layout, hardware_preset, layout_problems, model_preset
from scaletrain.planner import estimate
from scaletrain.planner.memory.rank_terms import stage_params
from scaletrain.planner.memory.states import dense_layers_on_rank, stage_layer_counts
from scaletrain.planner.time.flops import layer_kinds, matmul_params
from scaletrain.planner.types import PlanInput

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import activation_ledger  # noqa: E402

BATCH, SEQ = 2, 128


def _block(moe: bool):
    """One DeepSeek block at CPU widths: MLA with both latents, values narrower than q/k; an
    MoE block (sigmoid, 4 groups, 1 shared expert) or a dense one."""
    base = replace(
        model_preset("tiny-deepseek"),
        name="ds-block",
        num_layers=1,
        num_dense_layers=0,
        dim=256,
        ffn_dim=64,
        q_lora_rank=96,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
    )
    return base if moe else base.dense_layer_view()


@pytest.mark.parametrize("params", ["bf16", "fp32"])
def test_mla_block_saves_what_the_planner_counts(params):
    """A dense DeepSeek block (MLA + SwiGLU), bf16 parameters (FSDP's path) or fp32 under
    autocast (DDP's): the planner's bytes equal the saved storages, byte for byte."""
    cfg = _block(moe=False)
    row = activation_ledger.ledger(cfg, "none", batch=BATCH, seq=SEQ, params_dtype=params)
    assert row["total"] == row["analytic"]
    # the compressed KV: kv_norm's input and wkv_b's input, (B, T, r) each, are saved
    latent = [r for r in row["rows"] if r["module"].startswith("attention.wkv_")]
    assert any(math.prod(r["shape"]) == BATCH * SEQ * cfg.kv_lora_rank for r in latent)


@pytest.mark.parametrize("params", ["bf16", "fp32"])
def test_deepseek_moe_block_saves_what_the_planner_counts(params):
    """An MoE DeepSeek block: the planner's bytes equal the saved storages but for what it
    names as ignored (the router weight's fp32 copy with bf16 parameters; the balance loss's
    (B, E) terms and the expert counts, < 256 B); under autocast the experts' bf16 weight
    casts are the planner's in-flight parameters, not activations."""
    cfg = _block(moe=True)
    row = activation_ledger.ledger(cfg, "none", batch=BATCH, seq=SEQ, params_dtype=params)
    measured = row["total"]
    if params == "fp32":  # autocast's casts of the stacked expert weights (3-D)
        measured -= sum(
            r["bytes"]
            for r in row["rows"]
            if r["producer"] == "_to_copy" and len(r["shape"]) == 3 and "experts" in r["module"]
        )
    else:
        measured -= 4 * cfg.num_experts * cfg.dim  # the router weight's fp32 copy
    assert 0 <= measured - row["analytic"] <= 256, (measured, row["analytic"])


def test_forward_flops_are_the_active_matmuls():
    """2 x (active parameters - norm weights) per token, DeepSeek-V3: every block kind with
    its own matmuls (the dense first blocks, MLA's latents, top-8 routed + 1 shared)."""
    m = model_preset("deepseek-v3")
    pc = m.param_counts()
    matmuls = sum(n * matmul_params(kind)[0] for n, kind in layer_kinds(m)) + pc.head
    norms = m.num_layers * (pc.norms + m.q_lora_rank + m.kv_lora_rank) + pc.final_norm
    assert matmuls == pc.active(m.experts_per_token) - norms


def test_pipeline_stages_hold_the_trainers_parameters():
    """pp 16 over DeepSeek-V3 (the trainer's split on a meta model): every stage's parameter
    count is the planner's, the 3 dense first blocks all on stage 0."""
    from scaletrain.models import build_model
    from scaletrain.parallel.pipeline import split_stage

    m = model_preset("deepseek-v3")
    model = build_model(m)  # meta
    hw = hardware_preset("h800")
    layout = Layout(dp=128, pp=16, ep=64, zero=1)
    plan = PlanInput(
        model=m,
        hardware=hw,
        num_gpus=2048,
        layout=layout,
        seq_len=4096,
        global_batch=15360,
        micro_batch=1,
    )
    counts = stage_layer_counts(m.num_layers, 16)
    pc = m.param_counts()
    for r in range(16):
        dense = dense_layers_on_rank(m.num_layers, m.num_dense_layers, 16, 1, r)
        assert dense == (3 if r == 0 else 0)
        sp = stage_params(plan, pc, r == 0, r == 15, counts[r], dense)
        stage = split_stage(model, r, 16)
        held = sum(p.numel() for p in stage.parameters())
        # the planner's experts are this rank's ep share (EP64): undo it to compare
        assert sp.dense + sp.expert * 64 == held, r


def test_published_training_layout_plans(capsys):
    """DeepSeek-V3 sec. 3.1 / 3.2: 2,048 H800 (8 per node), 16-way pipeline, 64-way expert
    parallelism over 8 nodes, ZeRO-1 data parallelism, no tensor parallelism; sequences of
    4K, batch 15,360 (sec. 4.2's final batch size). The layout is legal and plans; its memory
    per GPU is printed. Full recomputation fits an H800's 80 GB (DeepSeek recomputed only
    RMSNorm and the MLA up-projections and kept fp8 activations, which this trainer does not
    build; without recomputation the plan says what it would take)."""
    m = model_preset("deepseek-v3")
    layout = Layout(dp=128, pp=16, ep=64, zero=1)
    assert layout_problems(layout, m, world_size=2048, global_batch=15360) == []
    for ac in ("full", "none"):
        plan = PlanInput(
            model=m,
            hardware=hardware_preset("h800"),
            num_gpus=2048,
            layout=layout,
            seq_len=4096,
            global_batch=15360,
            micro_batch=1,
            precision="bf16",
            ac=ac,
        )
        est = estimate(plan)
        mem = est.memory
        print(
            f"deepseek-v3 on 2048 h800, dp128 z1 pp16 ep64, ac={ac}: "
            f"params {mem.params / 1e9:.1f} GB, grads {mem.grads / 1e9:.1f} GB, "
            f"optimizer {mem.optimizer / 1e9:.1f} GB, activations {mem.activations / 1e9:.1f}"
            f" GB, buffers {mem.buffers / 1e9:.1f} GB, total {mem.total / 1e9:.1f} GB "
            f"(reserved {mem.reserved / 1e9:.1f} of {mem.capacity / 1e9:.1f} GB), "
            f"MFU {est.mfu:.1%}"
        )
        assert 0 < est.mfu < 1 and est.time.step_s > 0
        # the worst rank's parameters: a 16th of the blocks, experts 64-way, about 1.6B; rank 0
        # (the worst with full recompute: 16 micro-batches in flight, receive buffers bounded by
        # them, issue #37) adds the 0.93B embedding and holds the three dense blocks: 2.7B
        assert 1.0e9 < mem.detail["params.count"] < 3.0e9
        assert mem.fits == (ac == "full")
    out = capsys.readouterr().out
    assert out.count("deepseek-v3 on 2048 h800") == 2
    with capsys.disabled():  # shown with pytest -s
        print(out, end="")
