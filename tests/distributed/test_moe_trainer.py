"""The trainer with MoE x TP and replicated experts (gloo ranks): tp 2 + sp with the experts
split over tp; tp 2 x dp 2 with the experts split by ep 2 and ZeRO-1 (expert states
partitioned over their replicas: none at ep = dp); dp 4 with ep 2 and ZeRO-1 (each expert
shard on 2 ranks). Each gives the same losses as one process, and a run stopped and resumed
from its checkpoint (ZeRO-1 partitions holding expert shards, saved as local shards)
continues as if uninterrupted. Token dropping (an expert capacity) trains on one process and
resumes to the bit, and padded under ep 2 gives the one-process losses.

Every data-parallel rank runs micro-batches of 2 sequences, so the forwards see the same
groups of sequences as the one-process run's micro-batches: the load-balancing loss, a
function of the tokens of one forward, is the same.
"""

from __future__ import annotations

import pytest

from scaletrain.config import load_config
from scaletrain.parallel.launch import spawn
from scaletrain.trainer import train

from ._trainer_fns import small_job, straight_and_resumed, train_losses, train_losses_partial

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
MOE = "--model.name=tiny-moe"
CAPACITY = ["--model.moe_capacity_factor=1.0", "--model.moe_drop_policy=position"]


@pytest.mark.parametrize(
    ("world", "layout", "batch"),
    [
        # experts split over tp: the fused vocab-parallel loss + the MoE auxiliary loss
        (2, ["--parallel.tp=2", "--parallel.sp=true"], []),
        (4, ["--parallel.tp=2", "--parallel.dp=2", "--parallel.ep=2", "--parallel.zero=1"], []),
        # 4 dp ranks x 2 micro-batches of 2 sequences
        (
            4,
            ["--parallel.dp=4", "--parallel.ep=2", "--parallel.zero=1"],
            ["--batch.global_batch=16"],
        ),
        # token dropping padded to the capacity: static all-to-all splits; each rank's
        # micro-batch is one of the one-process run's, so the capacities are the same
        (
            2,
            ["--parallel.dp=2", "--parallel.ep=2"],
            [*CAPACITY, "--model.moe_pad_to_capacity=true"],
        ),
    ],
    ids=["tp2+sp", "tp2xdp2-ep2-zero1", "dp4-ep2-zero1", "dp2-ep2-capacity-padded"],
)
def test_moe_layout_trains_like_one_process_and_resumes(tmp_path, world, layout, batch):
    alone = train(load_config(None, small_job(tmp_path / "one", "one", MOE, *batch))).losses
    straight, resumed = spawn(
        straight_and_resumed, world, tmp_path / "many", [MOE, *batch, *layout], 2
    )[0]
    # one process vs 4 ranks: the same arithmetic up to the sharded matmuls' rounding
    assert straight == pytest.approx(alone, rel=1e-5, abs=0)
    # stopping and resuming changes nothing: the same ranks redo the same sums
    assert resumed == pytest.approx(straight, rel=1e-6, abs=0)


@pytest.mark.parametrize(
    "capacity",
    [["--model.moe_capacity_factor=1.0"], [*CAPACITY, "--model.moe_pad_to_capacity=true"]],
    ids=["probs", "position-padded"],
)
def test_moe_with_token_dropping_trains_and_resumes_bitwise(tmp_path, capacity):
    """tiny-moe with `model.moe_capacity_factor=1.0` (C = N*k/E: any expert above the mean
    load drops): the loss falls over 8 steps, differs from the dropless run's from the first
    step (the capacity reaches the model), and a run stopped after 4 steps and resumed from its
    checkpoint gives the same losses to the bit."""
    extra = [MOE, "--train.steps=8", *capacity]
    straight = train_losses(small_job(tmp_path, "straight", *extra))
    dropless = train_losses(small_job(tmp_path, "dropless", MOE, "--train.steps=8"))
    first = train_losses_partial(small_job(tmp_path, "resumed", *extra), 4)
    resumed = first + train_losses(small_job(tmp_path, "resumed", *extra))
    assert len(straight) == 8 and straight[-1] < straight[0] - 0.5, straight
    assert straight[0] != dropless[0], (straight, dropless)
    assert resumed == straight
