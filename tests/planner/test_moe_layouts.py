"""The planner counts the MoE layouts the trainer now runs (tests/distributed/test_moe_tp_ep.py):
MoE x TP (experts split over tp when ep = 1, whole per tp rank under ep), ep dividing dp*cp
(experts replicated over dp*cp/ep ranks) and ZeRO-1 with EP (expert states sharded over those
replicas). Formulas first (torch-free), then against the dry-run of the trainer's build.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scaletrain.config import (
    Layout,
    expert_split,
    expert_zero_shards,
    hardware_preset,
    layout_problems,
    resolve_model,
)
from scaletrain.planner import PlanInput, estimate
from scaletrain.planner.time.comm import CommInputs, comm_volumes

H100 = hardware_preset("h100-sxm")
MIXTRAL = resolve_model("mixtral-8x7b")


def _plan(layout: Layout, seq: int = 4096) -> PlanInput:
    return PlanInput(MIXTRAL, H100, layout.world_size, layout, seq, 8 * layout.dp, 1)


def _params(layout: Layout) -> float:
    return estimate(_plan(layout)).memory.detail["params.count"]


def test_expert_split_follows_the_trainer_rule():
    assert expert_split(Layout(dp=2, tp=4)) == 4  # ep = 1: each expert's f split over tp
    assert expert_split(Layout(dp=4, tp=2, ep=4)) == 4  # ep > 1: whole experts, split by ep
    assert expert_split(Layout(dp=8, ep=2)) == 2
    # ZeRO: experts' states over their dp*cp/ep replicas; FSDP2 (zero 2/3) leaves EP alone
    assert expert_zero_shards(Layout(dp=8, ep=2, zero=1)) == 4
    assert expert_zero_shards(Layout(dp=4, cp=2, ep=2, zero=1)) == 4
    assert expert_zero_shards(Layout(dp=8, ep=2, zero=3)) == 1
    assert expert_zero_shards(Layout(dp=8, tp=2, zero=3)) == 8  # tp-split experts: FSDP'd


def test_expert_parameters_per_rank():
    pc = MIXTRAL.param_counts()
    experts = MIXTRAL.num_layers * pc.mlp
    for layout in (
        Layout(dp=4, tp=2, zero=1),
        Layout(dp=4, tp=2, ep=4, zero=1),
        Layout(dp=8, ep=2, zero=1),
    ):
        assert layout_problems(layout, MIXTRAL) == []
    # tp2 (experts /2) vs tp2 x ep4 (experts /4, whole per tp rank): the same dense part
    assert _params(Layout(dp=4, tp=2, zero=1)) - _params(
        Layout(dp=4, tp=2, ep=4, zero=1)
    ) == pytest.approx(experts / 2 - experts / 4)
    # dp8 ep2 vs ep8: experts /2 vs /8
    assert _params(Layout(dp=8, ep=2, zero=1)) - _params(
        Layout(dp=8, ep=8, zero=1)
    ) == pytest.approx(experts / 2 - experts / 8)


def test_zero1_shards_expert_states_over_the_replicas():
    """AdamW (8 B/param of fp32 m and v): dense states / dp*cp, expert states / (dp*cp/ep)."""
    pc = MIXTRAL.param_counts()
    experts = MIXTRAL.num_layers * pc.mlp / 2  # ep2
    z0 = estimate(_plan(Layout(dp=8, ep=2, zero=0))).memory
    z1 = estimate(_plan(Layout(dp=8, ep=2, zero=1))).memory
    dense = z0.detail["params.count"] - experts
    assert z0.optimizer == pytest.approx(8 * (dense + experts))
    assert z1.optimizer == pytest.approx(8 * (dense / 8 + experts / 4))


KW = dict(
    hardware=H100,
    stage_params=1e9,
    layers=4,
    moe_layers=4,
    tokens=4096.0,
    hidden=4096,
    kv_dim=1024,
    experts_per_token=2,
    micro_batches=2,
    expert_params=6e8,
)
ACT = 2 * 4096.0 * 4096  # bf16 activations of one micro-batch


def test_moe_tp_traffic():
    """Per MoE block and micro-batch: the attention's 2 all-reduces, the split experts'
    (N*k, h) output and input-gradient all-reduces; SP adds the MoE input's all-gather
    forward and its output gradient's backward; embedding + head 2 per micro-batch."""
    m, L, k, ar, ag = 2, 4, 2, 2 * (1 / 2), 1 / 2  # tp2: ring factors 2(n-1)/n, (n-1)/n
    tp = comm_volumes(CommInputs(layout=Layout(tp=2), **KW))
    assert tp == pytest.approx({"tp": m * ((2 * L + 2) * ar * ACT + 2 * L * ar * k * ACT)})
    sp = comm_volumes(CommInputs(layout=Layout(tp=2, sp=True), **KW))
    assert sp["tp"] == pytest.approx(tp["tp"] + m * 2 * L * ag * ACT)
    # experts whole per tp rank (ep > 1): no tp traffic inside the MoE without SP
    tp_ep = comm_volumes(CommInputs(layout=Layout(dp=2, tp=2, ep=2), **KW))
    assert tp_ep["tp"] == pytest.approx(m * (2 * L + 2) * ar * ACT)
    # full recompute re-runs the forward's all-reduces: attention +1, experts +1 per block
    rc = comm_volumes(CommInputs(layout=Layout(tp=2), **{**KW, "ac": "full"}))
    assert rc["tp"] == pytest.approx(m * ((3 * L + 2) * ar * ACT + 3 * L * ar * k * ACT))


def test_replicated_experts_traffic():
    """dp8 ep2: dense gradients all-reduced over 8 ranks, expert gradients over their 4
    replicas; ZeRO-1 broadcasts each over the same groups; ZeRO-3 gathers and reduce-scatters
    only the dense parameters (FSDP2 leaves experts alone) and all-reduces the experts' once
    per step."""
    dense, experts = 4 * (1e9 - 6e8), 4 * 6e8  # fp32 gradient bytes
    z0 = comm_volumes(CommInputs(layout=Layout(dp=8, ep=2), **KW))
    assert z0["dp_allreduce"] == pytest.approx(2 * 7 / 8 * dense + 2 * 3 / 4 * experts)
    z1 = comm_volumes(CommInputs(layout=Layout(dp=8, ep=2, zero=1), **KW))
    assert z1["dp_allreduce"] == z0["dp_allreduce"]
    assert z1["zero_all_gather"] == pytest.approx(7 / 8 * dense + 3 / 4 * experts)
    z3 = comm_volumes(CommInputs(layout=Layout(dp=8, ep=2, zero=3), **KW))
    assert z3["dp_allreduce"] == pytest.approx(2 * 3 / 4 * experts)
    assert z3["fsdp_reduce_scatter"] == pytest.approx(2 * 7 / 8 * dense)  # per micro-batch
    assert z3["fsdp_all_gather"] == pytest.approx(2 * 2 * 7 / 8 * 2 * (1e9 - 6e8))  # bf16
    # ep = dp*cp: no replicas, no expert traffic at all
    assert (
        comm_volumes(CommInputs(layout=Layout(dp=8, ep=8, zero=3), **KW)).get("dp_allreduce")
        is None
    )


# Planner vs the dry-run of the trainer's build (benchmarks/planner_accuracy.py's harness).
# Model states are exact for every new layout. ep rows: totals within 0.3% (measured). MoE x
# TP rows: the transient part of the peak is 4-7% under, the MoE gap the planner already has
# at tp = 1 (tiny-moe w1 z0: -1.8% of the total, 125 KiB) staying while the rest halves; FLOPs
# are not compared there: FlopCounterMode counts DTensor matmuls at their global shape (the
# harness's convention) but the split experts multiply local shards.
ACCURACY = [  # (case, extra?, total bound)
    (("tiny-moe", 2, 1, 0, 1, 2, False, 1, "none", "bf16", 2, 128, 1), False, 0.04),
    (("tiny-moe", 4, 2, 1, 1, 2, True, 1, "none", "bf16", 2, 128, 1), False, 0.04),
    (("tiny-moe", 4, 2, 3, 1, 2, True, 1, "none", "bf16", 2, 128, 1), False, 0.06),
    (("tiny-moe", 4, 4, 0, 1, "1f1b", 1, 2, "bf16", 2, 128, 1), True, 0.03),
    (("tiny-moe", 4, 4, 1, 1, "1f1b", 1, 2, "bf16", 2, 128, 1), True, 0.03),
    (("tiny-moe", 4, 4, 3, 1, "1f1b", 1, 2, "bf16", 2, 128, 1), True, 0.03),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "extra", "bound"), ACCURACY, ids=lambda v: str(v))
def test_states_match_the_dry_run(case, extra, bound):
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import planner_accuracy as pa

    r = pa.measure_extra(case) if extra else pa.measure_case(case, flops=False)
    e = r["rel_error"]
    for k in ("params", "grads", "optimizer"):
        # ZeRO-1's whole-parameter partition: the busiest rank's share, within 3%
        assert abs(e[k]) <= (0.03 if k == "optimizer" else 1e-9), (k, e)
    assert abs(e["total"]) <= bound, e


def test_experts_whole_per_tp_rank_cost_tp_times_their_flops():
    """tp2 x ep4: each tp rank runs its experts whole on the same tokens, so the experts'
    matmuls (3 x forward) are not divided by tp as under tp2 with split experts."""
    from scaletrain.planner.time.step_time import plan_efficiency

    split, whole = _plan(Layout(dp=4, tp=2, zero=1)), _plan(Layout(dp=4, tp=2, ep=4, zero=1))
    assert split.grad_accum == whole.grad_accum == 8
    rate = H100.flops("bf16") * plan_efficiency(split)
    expert_f = 2.0 * MIXTRAL.experts_per_token * 3 * MIXTRAL.dim * MIXTRAL.ffn_dim  # SwiGLU
    per_token = 3 * expert_f / rate * MIXTRAL.num_layers
    extra = 8 * per_token * 4096 / 2  # m micro-batches of 4096 tokens, the tp2 split undone
    assert estimate(whole).time.compute_s - estimate(split).time.compute_s == pytest.approx(
        extra, rel=1e-9
    )


def test_zero3_ep_peak_holds_the_later_blocks_expert_gradients():
    """Mixtral-8x7B dp8 ZeRO-3 ep8, s4096 mb1, selective AC: FSDP2 leaves the expert-parallel
    experts alone, so each block keeps 0.73 GB of fp32 expert gradients, more than its 0.63 GB
    of stored activations; the dry-run's peak is in the backward of block 1 of 32, next to
    blocks 2..31's gradients (issue #16). Every extra block then adds its whole states (params,
    grads, AdamW's two moments) to the peak, and the plan is within 3% of the dry-run's
    96.04 GB (was 94.17 GB = -1.9%, modelling only the start of backward; 8 blocks -2.5%)."""
    import dataclasses

    def plan(layers: int):
        m = dataclasses.replace(MIXTRAL, num_layers=layers)
        layout = Layout(dp=8, zero=3, ep=8)
        return estimate(PlanInput(m, H100, 8, layout, 4096, 8, 1, ac="selective")).memory

    short, full = plan(16), plan(32)
    assert full.moment == "block backward under ZeRO-2/3"
    per_block = (full.params + full.grads + full.optimizer - short.params - short.grads) / 16
    per_block -= short.optimizer / 16
    assert (full.total - short.total) / 16 == pytest.approx(per_block, rel=1e-3)
    planned = full.total - full.buffer_terms["runtime_context"]
    assert abs(planned / 96.038e9 - 1) <= 0.03
