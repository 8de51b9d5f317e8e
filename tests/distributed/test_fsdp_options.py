"""FSDP2 options and TP variants, against the same single-process reference as the parity tests.

One world-2 spawn: parameter CPU offload (ZeRO-3), full and selective activation checkpointing
composed with ZeRO-3 / TP+SP (and with `model.fused_qkv`), tensor parallelism with gathered
(non loss-parallel) logits and ZeRO-3 with expert parallelism (MoE x TP has its own parity rows:
test_moe_tp_ep.py), each in float64 against the float64 reference with the parity matrix's
bounds; and bf16 mixed precision (loose tolerance: bf16 compute, fp32 master weights).
"""

from __future__ import annotations

import pytest
import torch

from scaletrain.parallel.launch import spawn

from ._parity_fns import assert_matches_reference, reference, train_modes

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

# name -> (preset, layout, micro-batches, options)
RUNS = {
    "offload": ("tiny-llama", dict(dp=2, zero=3), 1, {"offload": "params"}),
    "ac_full_zero3": ("tiny", dict(dp=2, zero=3), 1, {"ac": "full"}),
    "ac_selective_tp_sp": ("tiny-llama", dict(tp=2, sp=True), 1, {"ac": "selective"}),
    "tp_gathered_logits": ("tiny", dict(tp=2, sp=True), 1, {"loss_parallel": False}),
    "tp_gathered_logits_llama": ("tiny-llama", dict(tp=2), 1, {"loss_parallel": False}),
    "bf16": ("tiny-llama", dict(dp=2, zero=3), 1, {"dtype": "bf16"}),
    # ZeRO-3 around expert-parallel experts (ep = dp): FSDP must leave the experts alone.
    "zero3_ep": ("tiny-moe", dict(dp=2, zero=3, ep=2), 1, {}),
    # model.fused_qkv under FSDP2 (it unshards wq/wk/wv, the fused forward reads them) and
    # selective checkpointing (the fused matmul's output is saved, the weights' cat redone)
    "zero3_fused_qkv_ac_selective": (
        "tiny-llama-fused",
        dict(dp=2, zero=3),
        1,
        {"ac": "selective"},
    ),
}
EXACT = [name for name in RUNS if name != "bf16"]


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return spawn(train_modes, 2, RUNS)


@pytest.fixture(scope="module")
def references() -> dict:
    # tiny-moe: the 2 data-parallel shards seen separately (the load-balancing loss is per
    # forward), as in the parity matrix
    return {
        p: reference(p, shards=2 if p == "tiny-moe" else 1)
        for p in ("tiny", "tiny-llama", "tiny-moe", "tiny-llama-fused")
    }


@pytest.mark.parametrize("name", EXACT)
def test_option_keeps_float64_parity(results, references, name):
    ref = references[RUNS[name][0]]
    for i, rank in enumerate(results):
        covered = assert_matches_reference(rank[name], ref, f"{name} rank {i}")
        assert covered == ref["params"].keys()


def test_gathered_logits_are_plain_tensors(results):
    assert results[0]["tp_gathered_logits"]["logits_type"] == "Tensor"
    assert results[0]["ac_selective_tp_sp"]["logits_type"] == "DTensor"  # loss parallel


def test_bf16_mixed_precision_tracks_fp32_and_keeps_fp32_master(results, references):
    ref = references["tiny-llama"]
    r = results[0]["bf16"]
    # bf16 has 8 mantissa bits: losses agree to ~1e-2 relative, not to fp32 precision.
    torch.testing.assert_close(
        torch.tensor(r["losses"]), torch.tensor(ref["losses"]), rtol=2e-2, atol=2e-2
    )
    assert r["losses"] != ref["losses"]  # bf16 compute really happened
    assert r["param_dtypes"] == ["torch.float32"]  # sharded master weights stay fp32
