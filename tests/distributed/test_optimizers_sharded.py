"""8-bit AdamW and Adafactor sharded by FSDP2 (ZeRO-3) and ZeRO-1, on real gloo ranks: the
states are sharded as the parameters are (DTensors under FSDP2), saved by DCP, and a run
stopped and resumed gives exactly the losses of the run straight through. Adafactor (with its
first moment, trainer/adafactor.py) also equals one process under ZeRO-1/2/3 in float64, and
its step on sharded DTensors equals its step on the whole tensors."""

import pytest

from scaletrain.parallel.launch import spawn

from ._adafactor_fns import SHAPES, adafactor_suite
from ._parity_fns import assert_matches_reference, reference
from ._trainer_fns import straight_and_resumed

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.parametrize(
    ("optim", "zero"), [("adamw8bit", 3), ("adamw8bit", 1), ("adafactor", 3), ("adafactor", 1)]
)
def test_sharded_optimizer_resumes_bitwise(tmp_path, optim, zero):
    if optim == "adamw8bit":
        pytest.importorskip("torchao")
    # the default beta1 (0.9): Adafactor's first moment is in the checkpoint too
    extra = [f"--optim.name={optim}", "--parallel.dp=2", f"--parallel.zero={zero}"]
    for straight, resumed in spawn(straight_and_resumed, 2, tmp_path, extra, 2):
        assert resumed == straight  # exact: the checkpoint holds the whole optimizer state
        assert straight[-1] < straight[0]


ADAFACTOR = {"optimizer": "adafactor"}
MODES = {  # (preset, layout, micro-batches, opts): as the parity matrix's rows
    "zero1": ("tiny-llama", dict(dp=2, zero=1), 1, ADAFACTOR),
    "zero2": ("tiny-llama", dict(dp=2, zero=2), 1, ADAFACTOR),
    "zero3": ("tiny-llama", dict(dp=2, zero=3), 2, ADAFACTOR),
}
STEPS = 4
SHARD_ATOL = 1e-12
"""Sharded vs whole Adafactor steps in float64: the shards' sums of squares add in another
order (relative rounding ~n u = 1e-15 for n <= 35 values), which the rsqrt and the scalars
carry on relatively into each step (|step| <= alpha ~ 0.05 x RMS ~ 0.1 after clipping), over 4
steps: ~1e-16 absolute; 1e-12 leaves 4 orders of headroom, and a missing reduction (a per-shard
mean or RMS) is off by ~alpha = 1e-2 at the first step."""


def test_adafactor_under_zero_1_2_3_equals_one_process():
    """The parity matrix's bound (tests/adam_tolerance.py, float64): losses and gradient
    norms within 1e-10 relative, parameters within 1e-6, for Adafactor with beta1 = 0.9 under
    ZeRO-1 (plain parameters, partitioned states) and FSDP2 (ZeRO-2/3: DTensor shards, its
    row and column means reduced over them); and the optimizer alone on DTensors split by
    rows and by the last dim (uneven shards, a batch of matrices, a vector), with and without
    the first moment, against the same steps on whole tensors."""
    ref = reference("tiny-llama", optimizer="adafactor")
    for rank, out in enumerate(spawn(adafactor_suite, 2, MODES, STEPS)):
        for name, got in out["modes"].items():
            covered = assert_matches_reference(got, ref, f"{name} rank {rank}")
            assert covered == set(ref["params"])
        for key in ("rows/0.0", "rows/0.9", "last/0.0", "last/0.9"):
            got = out[key]
            for shape in SHAPES:
                assert got[str(shape)] <= SHARD_ATOL, (key, shape, got)
            # row + column per matrix (3) and a whole second moment for the vector, plus a
            # first moment per parameter with beta1: every one a DTensor
            assert got["states"] == (7 if key.endswith("/0.0") else 11), (key, got)
            assert got["dtensor_states"] == got["states"], (key, got)
