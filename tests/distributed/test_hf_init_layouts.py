"""`checkpoint.init_from` on real gloo ranks: every layout reads its own slices of the HF
weights and its first step's loss equals transformers' loss on the same global batch."""

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
    "gpt2_zero3": ("gpt2", ["--parallel.dp=2", "--parallel.zero=3"]),
    "gpt2_tp2": ("gpt2", ["--parallel.tp=2"]),
    "llama_ddp": ("llama", ["--parallel.dp=2"]),
    "llama_zero1": ("llama", ["--parallel.dp=2", "--parallel.zero=1"]),
    "llama_zero3_sharded": ("llama-sharded", ["--parallel.dp=2", "--parallel.zero=3"]),
    "llama_tp2_sp": ("llama-sharded", ["--parallel.tp=2", "--parallel.sp=true"]),
    "llama_pp2": ("llama", ["--parallel.pp=2", "--parallel.pp_schedule=1f1b"]),
    "mixtral_ep2": ("mixtral", ["--parallel.dp=2", "--parallel.ep=2"]),
}


def _args(tmp_path, model_dir, run, *extra):
    return hf_args(tmp_path, model_dir, run, *extra, steps=2)


def test_first_step_loss_equals_transformers_in_every_layout(tmp_path):
    dirs = {
        "gpt2": make_hf_model("gpt2", tmp_path / "gpt2"),
        "llama": make_hf_model("llama", tmp_path / "llama"),
        "llama-sharded": make_hf_model("llama", tmp_path / "llama-sharded", max_shard_size="20KB"),
        "mixtral": make_hf_model("mixtral", tmp_path / "mixtral"),
    }
    jobs = {
        name: _args(tmp_path, dirs[kind], name, *extra) for name, (kind, extra) in LAYOUTS.items()
    }
    reference = {
        kind: hf_loss(d, first_step_batches(load_config(None, _args(tmp_path, d, "x"))))
        for kind, d in dirs.items()
    }
    per_rank = spawn(train_many, 2, jobs)
    for rank, results in enumerate(per_rank):
        for name, (kind, _) in LAYOUTS.items():
            losses = results[name][0]
            assert losses[0] == pytest.approx(reference[kind], rel=RTOL), (name, rank)


def test_fsdp_over_tp_and_hsdp_on_four_ranks(tmp_path):
    """FSDP over TP shards dim 0 twice (`_StridedShard`: the local piece is not one box, so
    those tensors are read whole and cut by `distribute_tensor`); HSDP replicates shards."""
    d = make_hf_model("llama", tmp_path / "llama", max_shard_size="20KB")
    jobs = {
        "fsdp_tp": _args(
            tmp_path,
            d,
            "fsdp_tp",
            "--parallel.dp=2",
            "--parallel.zero=3",
            "--parallel.tp=2",
            "--batch.global_batch=4",
        ),
        "hsdp": _args(
            tmp_path,
            d,
            "hsdp",
            "--parallel.dp=4",
            "--parallel.zero=3",
            "--parallel.dp_replicate=2",
            "--batch.micro_batch=1",
        ),
    }
    reference = hf_loss(d, first_step_batches(load_config(None, _args(tmp_path, d, "x"))))
    for rank, results in enumerate(spawn(train_many, 4, jobs)):
        for name in jobs:
            assert results[name][0][0] == pytest.approx(reference, rel=RTOL), (name, rank)


FAMILY_LAYOUTS = {
    # each tp rank reads its rows of Phi-3's fused qkv_proj / gate_up_proj
    "phi3_tp2_sp": ("phi3", ["--parallel.tp=2", "--parallel.sp=true"]),
    "phi3_zero3": ("phi3", ["--parallel.dp=2", "--parallel.zero=3"]),
    "qwen2_tp2": ("qwen2", ["--parallel.tp=2"]),  # q/k/v bias rows; tied head
    "qwen3_tp2": ("qwen3", ["--parallel.tp=2"]),  # q/k norms whole on each rank
}


def test_qwen_and_phi3_first_step_loss_equals_transformers_under_tp_and_zero3(tmp_path):
    dirs = {k: make_hf_model(k, tmp_path / k) for k in ("phi3", "qwen2", "qwen3")}
    jobs = {
        name: _args(tmp_path, dirs[kind], name, *extra)
        for name, (kind, extra) in FAMILY_LAYOUTS.items()
    }
    reference = {
        kind: hf_loss(d, first_step_batches(load_config(None, _args(tmp_path, d, "x"))))
        for kind, d in dirs.items()
    }
    for rank, results in enumerate(spawn(train_many, 2, jobs)):
        for name, (kind, _) in FAMILY_LAYOUTS.items():
            assert results[name][0][0] == pytest.approx(reference[kind], rel=RTOL), (name, rank)
