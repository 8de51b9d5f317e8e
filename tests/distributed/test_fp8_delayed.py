"""fp8 delayed scaling across data-parallel ranks: the amax histories are shared (all-reduce MAX
once per step), so every rank scales like one process on the whole batch would, and a run
checkpointed mid-way (histories saved once, from rank 0) resumes every rank exactly."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from scaletrain.parallel.launch import spawn
from scaletrain.precision import Float8Linear, amax_histories, sync_amax_histories

from ._trainer_fns import straight_and_resumed

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _histories(model) -> torch.Tensor:
    return torch.stack([h.history.clone() for h in amax_histories(model)])


def _sync_case(_: int) -> dict[str, torch.Tensor]:
    """Each rank feeds its own tokens (rank r: inputs scaled by r + 1) through the same
    delayed-scaling Linear for 3 micro-batches, then syncs."""
    torch.manual_seed(0)
    lin = Float8Linear(64, 32, bias=False, amax="delayed", history_len=4)
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(10 + rank)
    for _step in range(3):
        x = torch.randn(8, 64, generator=gen) * (rank + 1)
        lin(x).square().sum().backward()
    before = _histories(lin)
    gathered = [torch.empty_like(before) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, before)
    n = sync_amax_histories(lin)
    return {
        "before": before,
        "all_before": torch.stack(gathered),
        "after": _histories(lin),
        "reduced": torch.tensor(n),
    }


def test_sync_makes_every_rank_hold_the_max_history():
    per_rank = spawn(_sync_case, 2, 0)
    want = per_rank[0]["all_before"].amax(dim=0)  # elementwise max over ranks
    assert not torch.equal(per_rank[0]["before"], per_rank[1]["before"])  # the data differed
    for r in per_rank:
        assert torch.equal(r["after"], want)
        assert int(r["reduced"]) == 3 * 4  # x, w, dy histories of 4 values


EXTRA = (
    "--parallel.dp=2",
    "--parallel.zero=3",
    "--precision.dtype=fp8",
    "--precision.fp8_amax=delayed",
    "--precision.fp8_history_len=4",
)


def test_delayed_fp8_run_resumes_every_rank_exactly(tmp_path):
    for straight, resumed in spawn(straight_and_resumed, 2, tmp_path, EXTRA, 2):
        assert len(straight) == 4
        assert resumed == straight  # bit for bit: same scales on every rank after the resume
