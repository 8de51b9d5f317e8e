"""The planner's pipeline orders and their lowering are torch's (torch 2.13 `schedules.py`).

`planner.time.pipeline` reproduces each schedule's per-rank compute order and
`planner.time.pipeline_comms.lowered_order` the passes torch's multi-stage runtime lowers it
with (UNSHARD / RESHARD, REDUCE_GRAD, and the sends and receives of `_add_send_recv`), without
importing torch: here both are held against torch's own functions, action for action. torch's
order functions read only a few attributes of their schedule (its pp size, micro-batches,
chunks per rank, round size), so a namespace carrying those stands in for a schedule with
stages. (gpipe and 1f1b run torch's single-stage loop, whose `_get_pipeline_order` is a drawing
aid, not what runs: tests/planner/test_pipeline.py checks their orders' structure.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.distributed.pipelining.schedules import (
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    _Action,
    _add_reduce_grad,
    _add_send_recv,
    _add_unshard_reshard,
    _ComputationType,
)

from scaletrain.parallel.pipeline_stage import planner_op
from scaletrain.planner.time.pipeline import (
    microbatches_per_round,
    rank_groups,
    rank_order,
    stage_rank,
)
from scaletrain.planner.time.pipeline_comms import lowered_order

KIND = {
    "F": _ComputationType.FORWARD,
    "B": _ComputationType.FULL_BACKWARD,
    "I": _ComputationType.BACKWARD_INPUT,
    "W": _ComputationType.BACKWARD_WEIGHT,
}
LOOPED = {"interleaved": ScheduleInterleaved1F1B, "zero-bubble": ScheduleInterleavedZeroBubble}


def _grid() -> list[tuple[str, int, int, int]]:
    out = []
    for schedule, vs in (
        ("interleaved", (2, 3)),
        ("zero-bubble", (1, 2)),
        ("dualpipev", (2,)),
    ):
        for v in vs:
            for p in (2, 3, 4):
                for m in sorted({2 * p, 2 * p + 1, 3 * p, 8}):
                    if schedule in LOOPED and m % max(1, m // p):
                        continue  # torch refuses m that is not a whole number of rounds
                    out.append((schedule, p, m, v))
    return out


def _torch_groups(schedule: str, p: int, m: int, v: int, rank: int) -> list[tuple]:
    """torch's compute actions of `rank` (no-op padding and REDUCE_GRAD dropped), each as a
    tuple of (stage, kind, micro-batch) of its sub-actions."""
    if schedule == "dualpipev":
        shape = SimpleNamespace(pp_group_size=p, _n_microbatches=m)
        order = ScheduleDualPipeV._calculate_single_rank_operations(shape, rank)  # type: ignore[arg-type]
    else:
        shape = SimpleNamespace(
            pp_group_size=p,
            n_local_stages=v,
            _n_microbatches=m,
            microbatches_per_round=microbatches_per_round(p, m),
        )
        order = LOOPED[schedule]._calculate_single_rank_operations(shape, rank)  # type: ignore[arg-type]
    out = []
    for a in order:
        if a is None or a.computation_type == _ComputationType.REDUCE_GRAD:
            continue
        out.append(tuple(tuple(planner_op(s))[:3] for s in (a.sub_actions or (a,))))
    return out


@pytest.mark.parametrize(("schedule", "p", "m", "v"), _grid(), ids=lambda x: str(x))
def test_compute_orders_are_torchs(schedule, p, m, v):
    for rank in range(p):
        mine = [tuple(tuple(a) for a in g) for g in rank_groups(schedule, p, m, v, rank)]
        assert mine == _torch_groups(schedule, p, m, v, rank), (schedule, p, m, v, rank)
        assert [a for g in mine for a in g] == [
            tuple(a) for a in rank_order(schedule, p, m, v, rank)
        ]


@pytest.mark.parametrize(
    ("schedule", "p", "m", "v"),
    _grid(),
    ids=lambda x: str(x),
)
def test_lowering_is_torchs(schedule, p, m, v):
    """Every rank's actions after torch's three lowering passes, sends and receives included."""

    def action(g):
        subs = tuple(_Action(a.stage, KIND[a.kind], a.microbatch) for a in g)
        return subs[0] if len(subs) == 1 else _Action(-1, _ComputationType.OVERLAP_F_B, None, subs)

    compute = {r: [action(g) for g in rank_groups(schedule, p, m, v, r)] for r in range(p)}
    torch_lowered = _add_send_recv(
        {r: _add_reduce_grad(_add_unshard_reshard(a), m) for r, a in compute.items()},
        stage_to_rank=lambda s: stage_rank(schedule, p, s),
        num_stages=p * v,
    )
    mine = lowered_order(schedule, p, m, v)
    for rank in range(p):
        theirs = [
            tuple(planner_op(s) for s in (a.sub_actions or (a,))) for a in torch_lowered[rank]
        ]
        assert list(mine[rank]) == theirs, (schedule, p, m, v, rank)
