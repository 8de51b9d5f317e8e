"""Tensor parallelism under DDP and ZeRO-1 (4 gloo ranks, tp 2 x dp 2) == one process.

DDP and torch's ZeroRedundancyOptimizer cannot hold DTensors, so with tp > 1 the trainer
all-reduces the gradients' local shards over dp x cp after accumulation
(`parallel.data_parallel.apply_manual_grad_sync`) and ZeRO-1 broadcasts the owners' updated
local shards (`parallel.zero._LocalShardZero`). The rows train as the parity matrix does (5
AdamW steps, clipping, float64) and are held to the same bounds, with the same reasons
(tests/adam_tolerance.py): losses and gradient norms 1e-10 relative, parameters 1e-6
(`_parity_fns.assert_matches_reference`).
"""

from __future__ import annotations

import pytest

from scaletrain.parallel.launch import spawn

from ._parity_fns import assert_matches_reference, reference, train_modes

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

# mode -> (preset, layout, micro-batches per step)
MODES = {
    # 2 micro-batches: the shards' all-reduce must wait for accumulation to end
    "tp2xdp2/llama": ("tiny-llama", dict(dp=2, tp=2, zero=0), 2),
    "tp2xzero1/llama": ("tiny-llama", dict(dp=2, tp=2, zero=1), 1),
    # the one-process reference fuses q/k/v, the tp ranks project with three sharded Linears
    "tp2xdp2/llama-fused": ("tiny-llama-fused", dict(dp=2, tp=2, zero=0), 1),
    # SP: the norm weights' gradients are Partial DTensors; gpt2 ties the head to the embedding
    "tp2+spxzero1/gpt2": ("tiny", dict(dp=2, tp=2, sp=True, zero=1), 2),
}


@pytest.fixture(scope="module")
def world4() -> list[dict]:
    return spawn(train_modes, 4, MODES)


@pytest.mark.parametrize("mode", list(MODES))
def test_tp_with_data_parallel_matches_one_process(world4, mode):
    ref = reference(MODES[mode][0])
    for rank, results in enumerate(world4):
        got = results[mode]
        assert got["params"].keys() == ref["params"].keys()
        assert_matches_reference(got, ref, f"{mode} rank {rank}")


def test_zero1_over_tp_partitions_the_local_states(world4):
    """ZeRO-1 over tp: the two dp ranks of one tp rank split its shards' Adam states (whole
    shards each), together holding all of them; DDP's ranks each hold all of them."""
    for tp_rank in (0, 1):
        ranks = [tp_rank, tp_rank + 2]  # mesh (dp, tp): rank = 2 * dp_rank + tp_rank
        ddp = [world4[r]["tp2xdp2/llama"]["mem"]["optimizer"] for r in ranks]
        z1 = [world4[r]["tp2xzero1/llama"]["mem"]["optimizer"] for r in ranks]
        assert ddp[0] == ddp[1] > 0
        assert sum(z1) == ddp[0] and max(z1) < ddp[0]
