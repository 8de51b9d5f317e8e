"""Vocabulary-parallel token embedding (`tensor_parallel.VocabParallelEmbedding`) on 2 gloo
ranks == one process: loss and every gradient, tied (tiny: the same table is the head) and
untied (tiny-llama), with and without sequence parallelism.

Each rank holds V/2 rows, looks up the ids in its range and zeroes the others; the partial
outputs are all-reduced (reduce-scattered over the sequence under sp). What the test pins
beyond parity: the embedding's backward computes only this rank's rows (every
`embedding_dense_backward` output has V/2 rows; DTensor's RowwiseParallel embedding computed
all V on every rank), and the gradient held is V/2 rows.

Tolerance: both sides fp32 with different summation orders (sharded matmuls of the blocks, the
vocabulary-sharded loss); the bound 1e-5 relative to each tensor's scale is the parity
matrix's (test_vocab_parallel_loss.py measures ~1e-7).
"""

from __future__ import annotations

import pytest

from scaletrain.parallel.launch import spawn

from ._loss_fns import tp_embedding_grads
from ._parity_fns import CONFIGS, one_process_loss_grads

pytestmark = [pytest.mark.distributed]

CASES = [("tiny", False), ("tiny", True), ("tiny-llama", False), ("tiny-llama", True)]


@pytest.fixture(scope="module")
def tp2() -> list[dict]:
    return spawn(tp_embedding_grads, 2, CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-sp{int(c[1])}")
def test_tp2_embedding_equals_one_process(tp2, case):
    ref_loss, ref_grads = one_process_loss_grads(case[0])
    vocab = CONFIGS[case[0]].vocab_size
    for rank in tp2:
        got = rank[case]
        assert got["loss"] == pytest.approx(ref_loss, rel=1e-6)
        assert set(got["grads"]) == set(ref_grads)
        for name, g in got["grads"].items():
            ref = ref_grads[name]
            err = float((g - ref).abs().max())
            # + 1e-9: the key bias's gradient is zero in exact arithmetic (~1e-11 of rounding)
            assert err <= 1e-5 * float(ref.abs().max()) + 1e-9, (name, err)
        # the embedding backward ran once, on this rank's V/2 rows only
        assert got["backward_rows"] == [vocab // 2]
        assert got["grad_local_rows"] == vocab // 2
