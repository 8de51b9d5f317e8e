"""`checkpoint.init_from` of a Qwen3-MoE and a Gemma 2 model on real gloo ranks: in every
layout the first step's loss equals transformers' float64 loss on the same global batch
(test_hf_init_layouts.py's check, for the families of tests/unit/test_moe_gemma_families.py).

Qwen3-MoE: 8 experts, top 3, q/k norms; ZeRO-3, TP2 + SP (experts split over tp), PP2 and EP2.
Gemma 2: a sliding-window layer and a global one, soft-capped scores and logits, a tied head
(the pipeline's last stage holds its copy), the post-sub-layer norms replicated (TP2) or
sequence-parallel (TP2 + SP); ZeRO-3 and PP2. Gemma 3 (q/k norms, two RoPE bases): TP2 + SP
and PP2.
"""

from __future__ import annotations

import pytest

from scaletrain.config import load_config
from scaletrain.parallel.launch import spawn
from tests._hf_models import first_step_batches, hf_args, hf_loss, make_hf_model

from ._trainer_fns import train_many

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
pytest.importorskip("transformers")

RTOL = 1e-4  # fp32 trainer vs float64 reference (see tests/integration/test_hf_init.py)

LAYOUTS = {
    "qwen3_moe_zero3": ("qwen3_moe", ["--parallel.dp=2", "--parallel.zero=3"]),
    "qwen3_moe_tp2_sp": ("qwen3_moe", ["--parallel.tp=2", "--parallel.sp=true"]),
    "qwen3_moe_pp2": ("qwen3_moe", ["--parallel.pp=2", "--parallel.pp_schedule=1f1b"]),
    "qwen3_moe_ep2": ("qwen3_moe", ["--parallel.dp=2", "--parallel.ep=2"]),
    "gemma2_zero3": ("gemma2", ["--parallel.dp=2", "--parallel.zero=3"]),
    "gemma2_tp2": ("gemma2", ["--parallel.tp=2"]),
    "gemma2_tp2_sp": ("gemma2", ["--parallel.tp=2", "--parallel.sp=true"]),
    "gemma2_pp2": ("gemma2", ["--parallel.pp=2", "--parallel.pp_schedule=1f1b"]),
    # Gemma 3: (1 + w) q/k norms whole on each tp rank, the local layer's own RoPE base
    "gemma3_tp2_sp": ("gemma3_text", ["--parallel.tp=2", "--parallel.sp=true"]),
    "gemma3_pp2": ("gemma3_text", ["--parallel.pp=2", "--parallel.pp_schedule=1f1b"]),
}


def _args(tmp_path, model_dir, run, *extra):
    return hf_args(tmp_path, model_dir, run, *extra, steps=2)


def test_first_step_loss_equals_transformers_in_every_layout(tmp_path):
    dirs = {k: make_hf_model(k, tmp_path / k) for k in ("qwen3_moe", "gemma2", "gemma3_text")}
    jobs = {
        name: _args(tmp_path, dirs[kind], name, *extra) for name, (kind, extra) in LAYOUTS.items()
    }
    reference = {
        kind: hf_loss(d, first_step_batches(load_config(None, _args(tmp_path, d, "x"))))
        for kind, d in dirs.items()
    }
    for rank, results in enumerate(spawn(train_many, 2, jobs)):
        for name, (kind, _) in LAYOUTS.items():
            losses = results[name][0]
            assert losses[0] == pytest.approx(reference[kind], rel=RTOL), (name, rank)
            assert losses[1] != losses[0], (name, rank)  # it trained
