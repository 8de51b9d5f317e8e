"""Parity of every data/tensor-parallel mode against one process on the full batch.

Each mode trains `tiny` (GPT-2: learned positions, tied head, LayerNorm, GELU) and `tiny-llama`
(RoPE, GQA 4q/2kv heads, RMSNorm, SwiGLU, untied head) for 3 AdamW steps with gradient
clipping, and must reproduce the single-process losses, pre-clip gradient norms and final
parameters. Tolerance rtol=1e-5 / atol=1e-5: fp32 throughout, the only differences are the
summation orders of all-reduce / reduce-scatter / sharded matmuls (measured max parameter
difference ~2e-6 after 3 steps at lr 1e-3).

Also checked from the same runs (one spawn per world size, to keep start-up cost down): the
per-rank bytes each ZeRO stage keeps (`test_zero_stages_shard_what_they_promise`).
"""

from __future__ import annotations

import pytest
import torch

from scaletrain.parallel.launch import spawn

from ._dp_fns import reference, train_modes, world4_suite

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

PRESETS = ("tiny", "tiny-llama")
# name -> (layout, micro-batches of gradient accumulation)
WORLD2 = {
    "ddp": (dict(dp=2, zero=0), 2),
    "zero1": (dict(dp=2, zero=1), 1),
    "zero2": (dict(dp=2, zero=2), 1),
    "zero3": (dict(dp=2, zero=3), 2),
    "tp": (dict(tp=2), 1),
    "tp_sp": (dict(tp=2, sp=True), 1),
}
WORLD4 = {
    "hsdp": (dict(dp=4, dp_replicate=2, zero=3), 1),
    "fsdp_tp_sp": (dict(dp=2, zero=3, tp=2, sp=True), 2),
}


def _runs(modes: dict) -> list:
    return [(f"{m}/{p}", p, lay, acc) for m, (lay, acc) in modes.items() for p in PRESETS]


@pytest.fixture(scope="module")
def references() -> dict:
    return {p: reference(p) for p in PRESETS}


@pytest.fixture(scope="module")
def world2() -> list[dict]:
    return spawn(train_modes, 2, _runs(WORLD2))


@pytest.fixture(scope="module")
def world4() -> list[dict]:
    return spawn(world4_suite, 4, _runs(WORLD4))


def _assert_parity(result: dict, ref: dict) -> None:
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(ref["losses"]),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(result["norms"]), torch.tensor(ref["norms"]),
                               rtol=1e-5, atol=1e-5)
    assert result["params"].keys() == ref["params"].keys()
    for name, value in ref["params"].items():
        torch.testing.assert_close(result["params"][name], value, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("mode", WORLD2)
def test_world2_mode_matches_single_process(world2, references, mode, preset):
    for rank_result in world2:
        _assert_parity(rank_result[f"{mode}/{preset}"], references[preset])


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("mode", WORLD4)
def test_world4_mode_matches_single_process(world4, references, mode, preset):
    for rank_result in world4:
        _assert_parity(rank_result[f"{mode}/{preset}"], references[preset])


def test_zero_stages_shard_what_they_promise(world2):
    """Per-rank bytes of training state, world size 2 (exact local storage on CPU).

    ZeRO-0 (DDP): everything full. ZeRO-1: optimizer states split across ranks (whole
    parameters per rank: the two ranks' shares add up to the full states, neither holds all).
    ZeRO-2: gradients sharded too, blocks' parameters still full between forward and backward.
    ZeRO-3: blocks' parameters sharded during forward/backward as well.
    """
    for preset in PRESETS:
        mem = {m: [r[f"{m}/{preset}"]["mem"] for r in world2]
               for m in ("ddp", "zero1", "zero2", "zero3")}
        full = mem["ddp"][0]
        assert all(m == full for m in mem["ddp"])
        assert full["optimizer"] == 2 * full["params_at_rest"] == 2 * full["grads"]
        # ZeRO-1: states partitioned, grads and params full.
        z1 = mem["zero1"]
        assert sum(m["optimizer"] for m in z1) == full["optimizer"]
        assert max(m["optimizer"] for m in z1) < full["optimizer"]
        assert all(m["grads"] == full["grads"] for m in z1)
        assert all(m["block_params_after_forward"] == full["block_params_after_forward"]
                   for m in z1)
        # ZeRO-2: + gradients sharded; full block parameters live from forward to backward.
        for m in mem["zero2"]:
            assert m["optimizer"] == full["optimizer"] // 2
            assert m["grads"] == full["grads"] // 2
            assert m["params_at_rest"] == full["params_at_rest"] // 2
            assert m["block_params_after_forward"] == full["block_params_after_forward"]
        # ZeRO-3: + block parameters resharded right after each block's forward.
        for m in mem["zero3"]:
            assert m["optimizer"] == full["optimizer"] // 2
            assert m["grads"] == full["grads"] // 2
            assert m["block_params_after_forward"] == full["block_params_after_forward"] // 2
        # TP: block weights split over the 2 ranks (norm weights and row-wise biases stay
        # replicated, hence not exactly half).
        for m in (r[f"tp/{preset}"]["mem"] for r in world2):
            assert m["block_params_after_forward"] < 0.55 * full["block_params_after_forward"]


def test_world4_mesh_axes_and_ranks(world4):
    """tp is the innermost axis: rank r has tp rank r % 2 and dp rank r // 2 on a 2x2 mesh."""
    for rank, res in enumerate(world4):
        hsdp = res["hsdp/tiny"]["meshes"]
        assert hsdp["dp"] == (4, rank) and hsdp["dp_cp"] == (4, rank)
        assert hsdp["dp_shard_cp"] == (2, rank % 2)  # shards inside a replica group
        fsdp_tp = res["fsdp_tp_sp/tiny"]["meshes"]
        assert fsdp_tp["tp"] == (2, rank % 2)
        assert fsdp_tp["dp"] == fsdp_tp["dp_shard_cp"] == (2, rank // 2)
        # Expert parallel (ep=2 of dp=4): groups of adjacent data-parallel ranks.
        assert res["ep_group"] == ([0, 1] if rank < 2 else [2, 3])
