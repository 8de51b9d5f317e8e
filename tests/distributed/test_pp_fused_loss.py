"""The pipeline's last stage runs the fused chunked head + cross-entropy (`models.loss`), as
an unpipelined model does: on 2 gloo ranks, pp2 (1F1B, GPipe, interleaved v2) == one process,
loss and every gradient, tied (tiny: the last stage's head copy and the embedding get the tied
gradient) and untied (tiny-llama-4l); and no (tokens x V) logits exist on the last stage
(checked on tiny-llama-4l, whose MLP width differs from its vocabulary):
the largest tensor with a vocabulary-wide last dimension is one chunk of `chunk` tokens (5,
which does not divide a micro-batch's 32 tokens) instead of the micro-batch's 32 x V logits.

Tolerance: fp32 on both sides with different summation orders (chunked weight-gradient
accumulation, micro-batch means); 1e-6 relative on the loss and 1e-5 of each tensor's scale
on the gradients, the parity matrix's bounds (measured differences ~1e-7).
"""

from __future__ import annotations

import pytest

from scaletrain.parallel.launch import spawn

from ._loss_fns import pp_fused_loss
from ._parity_fns import CONFIGS, GLOBAL_BATCH, SEQ_LEN, one_process_loss_grads

pytestmark = [pytest.mark.distributed]

CHUNK = 5
CASES = [
    ("tiny", "1f1b", 1, CHUNK),
    ("tiny-llama-4l", "1f1b", 1, CHUNK),
    ("tiny-llama-4l", "gpipe", 1, CHUNK),
    ("tiny-llama-4l", "interleaved", 2, CHUNK),
]


@pytest.fixture(scope="module")
def pp2() -> list[dict]:
    return spawn(pp_fused_loss, 2, CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-v{c[2]}")
def test_pp2_fused_loss_equals_one_process(pp2, case):
    ref_loss, ref_grads = one_process_loss_grads(case[0])
    vocab = CONFIGS[case[0]].vocab_size
    seen: set[str] = set()
    for rank in pp2:
        got = rank[case]
        assert got["loss"] == pytest.approx(ref_loss, rel=1e-6)
        for name, g in got["grads"].items():
            # a tied model's last stage holds a head copy with the embedding's gradient
            ref = ref_grads[
                "tok_embeddings.weight"
                if name == "output.weight" and "output.weight" not in ref_grads
                else name
            ]
            err = float((g - ref).abs().max())
            assert err <= 1e-5 * float(ref.abs().max()) + 1e-9, (name, err)
            seen.add(name)
        if got["is_last"] and CONFIGS[case[0]].ffn_dim != vocab:  # (tiny: f = V = 256)
            # one CHUNK-token chunk of logits at a time, never a micro-batch's
            tokens = GLOBAL_BATCH // 2 * SEQ_LEN
            assert got["largest_vocab_tensor"] == CHUNK * vocab < tokens * vocab
    assert set(ref_grads) <= seen
