"""PP x ZeRO-2/3 traffic counted at the collectives equals the planner's (4 gloo ranks).

torch's pipeline stages turn off gradient sync and resharding after backward between
micro-batches and reduce once per step, so the planner charges ZeRO-2 one all-gather and one
reduce-scatter per step and ZeRO-3 m + 1 all-gathers (every forward reshards). The measurement
is `benchmarks/comm_volume.py`'s: the trainer's own build, one counted step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("strategy", ["pp x zero2", "pp x zero3"])
def test_pp_zero_traffic_matches_planner(strategy, tmp_path):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import comm_volume

    res = comm_volume.measure(strategy, str(tmp_path))
    assert res["grad_accum"] == 4  # 4 micro-batches per pipeline step
    modelled = {
        r["family"]: r
        for r in res["families"]
        if not r["family"].startswith(comm_volume.NOT_MODELLED)
    }
    zero = "zero" if strategy.endswith("2") else "fsdp"
    assert {f"{zero}_all_gather", f"{zero}_reduce_scatter", "pp_p2p"} == set(modelled)
    for fam, r in modelled.items():
        assert r["ratio"] == pytest.approx(1.0, abs=0.01), (fam, r)
