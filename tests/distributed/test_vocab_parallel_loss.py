"""Vocabulary-parallel fused cross-entropy (`tensor_parallel.vocab_parallel_head_loss`) on 2
gloo ranks == one process's logits path (`causal_lm_loss(model(x), y)`).

Each tp rank keeps V/2 head rows; the row max, the sum of exponentials and the target logit are
all-reduced, nothing is gathered; the hidden-state gradient is reduced by the DTensor
redistribution. Cases: untied head (tiny-llama) and tied embeddings (tiny, GPT-2), with and
without sequence parallelism, chunk sizes 5 (does not divide the 64 tokens) and auto, and
selective activation checkpointing on the tp-sharded blocks.

Tolerance: both sides are fp32 with different summation orders (sharded vocabulary sums,
chunked weight-gradient accumulation, the sharded matmuls of the blocks under TP);
measured differences are ~1e-7 relative, the bound 1e-5 relative to each tensor's scale is the
parity matrix's.
"""

from __future__ import annotations

import pytest

from scaletrain.parallel.launch import spawn

from ._loss_fns import tp_loss_and_grads
from ._parity_fns import CONFIGS, one_process_loss_grads

pytestmark = [pytest.mark.distributed]

CASES = [
    ("tiny-llama", False, 5, "none"),
    ("tiny-llama", True, 0, "none"),
    ("tiny", False, 0, "none"),
    ("tiny", True, 5, "none"),
    # selective AC's per-op policy on DTensor blocks (saved matmuls and reduce-scatters)
    ("tiny-llama", True, 0, "selective"),
    ("tiny", False, 5, "selective"),
]


@pytest.fixture(scope="module")
def tp2() -> list[dict]:
    return spawn(tp_loss_and_grads, 2, CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-sp{int(c[1])}-chunk{c[2]}-{c[3]}")
def test_tp2_equals_one_process(tp2, case):
    ref_loss, ref_grads = one_process_loss_grads(case[0])
    for rank in tp2:
        got = rank[case]
        assert got["loss_type"] == "Tensor"  # a plain loss, not a DTensor
        assert got["loss"] == pytest.approx(ref_loss, rel=1e-6)
        assert set(got["grads"]) == set(ref_grads)
        for name, g in got["grads"].items():
            ref = ref_grads[name]
            err = float((g - ref).abs().max())
            # + 1e-9: the key bias's gradient is zero in exact arithmetic (softmax ignores a
            # constant added to every key's score), ~1e-11 of rounding on either side
            assert err <= 1e-5 * float(ref.abs().max()) + 1e-9, (name, err)
        vocab = CONFIGS[case[0]].vocab_size
        assert got["head_grad_local_rows"] == vocab // 2  # each rank keeps V/tp rows
