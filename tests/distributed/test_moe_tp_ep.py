"""MoE x TP and flexible expert parallelism (gloo ranks) == one process.

Rows (tiny-moe: 2 layers, 4 SwiGLU experts of f=128, top-2):

- tensor parallelism with the experts split over tp (ep = 1: w1/w3 column-wise, w2 row-wise
  per expert, `tensor_parallel.TensorParallelExperts`), alone, with sp, under DDP, ZeRO-1 and
  ZeRO-3 (FSDP2 over the 2-D dp x tp experts);
- tp x ep: experts split whole by ep over the dp ranks and kept whole on each tp rank, under
  ZeRO-1 (ep = dp: each rank its own experts' states);
- ep dividing dp (dp4 ep2): each expert shard replicated over 2 ranks, its gradient averaged
  over those (`ep_replicate`), with DDP-style sync, ZeRO-1 (expert states split over the
  replicas, `zero._LocalShardZero`) and ZeRO-3 (FSDP2 leaves experts alone);
- pp2 x tp2+sp: every pipeline stage's MoE blocks split as above.

The reference sees each data-parallel forward's tokens as one shard (the load-balancing loss
is per forward): dp shards, or dp x micro-batches with accumulation. Runs and tolerances are
the parity matrix's, for its reasons (float64; tests/adam_tolerance.py): losses and pre-clip
gradient norms 1e-10 relative, parameters 1e-6.
"""

from __future__ import annotations

import pytest

from scaletrain.config import MODEL_PRESETS, Layout, expert_split
from scaletrain.parallel.launch import spawn

from ._parity_fns import assert_matches_reference, reference, train_modes

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

# the fused head's gathered-logits path: under loss_parallel the parity step's loss is a
# DTensor, which cannot be added to the (plain) MoE auxiliary loss; the trainer's fused head
# + loss returns a plain loss (tensor_parallel.vocab_parallel_head_loss)
GATHERED = {"loss_parallel": False}

# mode -> (layout, micro-batches, reference shards, options)
WORLD2 = {"tp2": (dict(tp=2), 1, 1, GATHERED), "tp2+sp": (dict(tp=2, sp=True), 1, 1, GATHERED)}
WORLD4 = {
    "tp2xdp2": (dict(dp=2, tp=2, zero=0), 1, 2, GATHERED),
    # 2 micro-batches per dp rank: 4 forwards of one sequence each
    "tp2+spxzero1": (dict(dp=2, tp=2, sp=True, zero=1), 2, 4, GATHERED),
    "tp2+spxzero3": (dict(dp=2, tp=2, sp=True, zero=3), 1, 2, GATHERED),
    "tp2xdp2-ep2-zero1": (dict(dp=2, tp=2, ep=2, zero=1), 1, 2, GATHERED),
    "dp4-ep2": (dict(dp=4, ep=2, zero=0), 1, 4, {}),
    "dp4-ep2-zero1": (dict(dp=4, ep=2, zero=1), 1, 4, {}),
    "dp4-ep2-zero3": (dict(dp=4, ep=2, zero=3), 1, 4, {}),
    # pipeline stages parallelized like whole models; 2 micro-batches = the 2 shards
    "pp2xtp2+sp": (dict(tp=2, sp=True, pp=2, pp_schedule="1f1b"), 2, 2, GATHERED),
}
ROWS = [(2, m) for m in WORLD2] + [(4, m) for m in WORLD4]


def _modes(rows: dict) -> dict:
    return {
        mode: ("tiny-moe", layout, micro, opts) for mode, (layout, micro, _, opts) in rows.items()
    }


@pytest.fixture(scope="module")
def world2() -> list[dict]:
    return spawn(train_modes, 2, _modes(WORLD2))


@pytest.fixture(scope="module")
def world4() -> list[dict]:
    return spawn(train_modes, 4, _modes(WORLD4))


@pytest.fixture(scope="module")
def references() -> dict:
    return {n: reference("tiny-moe", shards=n) for n in (1, 2, 4)}


@pytest.mark.parametrize(("world", "mode"), ROWS, ids=[m for _, m in ROWS])
def test_moe_layout_matches_one_process(request, references, world, mode):
    rows = WORLD2 if world == 2 else WORLD4
    ref = references[rows[mode][2]]
    covered: set[str] = set()
    for rank, results in enumerate(request.getfixturevalue(f"world{world}")):
        covered |= assert_matches_reference(results[mode], ref, f"{mode} rank {rank}")
    assert covered == ref["params"].keys()  # pipeline ranks: their stages together


def _expert_bytes() -> int:
    cfg = MODEL_PRESETS["tiny-moe"]()
    return cfg.num_layers * 3 * cfg.num_experts * cfg.ffn_dim * cfg.dim * 8  # SwiGLU, float64


@pytest.mark.parametrize(("world", "mode"), ROWS, ids=[m for _, m in ROWS])
def test_each_rank_holds_its_split_of_the_experts(request, world, mode):
    """Experts split tp ways (ep = 1) or ep ways (kept whole over tp): `expert_split`, the
    rule the planner counts with; ZeRO-3 shards tensor-parallel experts over dp too (FSDP2
    leaves expert-parallel ones alone)."""
    rows = WORLD2 if world == 2 else WORLD4
    layout = Layout(**rows[mode][0])
    split = expert_split(layout)
    assert split == 2
    fsdp = layout.dp if layout.zero >= 2 and layout.ep == 1 else 1
    for results in request.getfixturevalue(f"world{world}"):
        # a pipeline rank holds its stage's blocks: 1 of tiny-moe's 2
        assert results[mode]["mem"]["expert_params"] == _expert_bytes() // (
            split * fsdp * layout.pp
        )


def test_zero1_shards_expert_states_over_their_replicas(world4):
    """dp4 ep2: rank r holds expert shard r % 2, replicated on ranks {r % 2, r % 2 + 2}.
    ZeRO-1 splits those two replicas' expert states between them (whole parameters each:
    neither holds all, together exactly the DDP rank's); dense states over all 4 ranks."""
    ddp = [r["dp4-ep2"]["mem"] for r in world4]
    z1 = [r["dp4-ep2-zero1"]["mem"] for r in world4]
    full_experts = ddp[0]["expert_optimizer"]
    assert full_experts == 2 * _expert_bytes() // 2  # AdamW m and v of half the experts
    for e in (0, 1):
        pair = [z1[e]["expert_optimizer"], z1[e + 2]["expert_optimizer"]]
        assert sum(pair) == full_experts and min(pair) > 0 and max(pair) < full_experts
    dense = [m["optimizer"] - m["expert_optimizer"] for m in z1]
    assert sum(dense) == ddp[0]["optimizer"] - full_experts and max(dense) < sum(dense)
    # ep = dp (tp2 x dp2 ep2): no replicas, each rank steps all of its own experts
    for r in world4:
        mem = r["tp2xdp2-ep2-zero1"]["mem"]
        assert mem["expert_optimizer"] == 2 * mem["expert_params"]
