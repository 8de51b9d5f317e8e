"""The trainer's pipeline holds communication buffers for its micro-batches in flight, not for
all of them (issue #37): on 2 gloo ranks, every schedule's stages keep at most as many receive
buffers alive at once, and its ledger as many sends outstanding, at 16 micro-batches as at 8.

torch's stock `PipelineStage` would hold 8 and 16 forward receive buffers (one per micro-batch,
for the stage's life) and its multi-stage runtime every send until the step's end. What is
alive is measured with weak references to the buffers the stages allocate (a buffer lives on as
its stage's saved input until the micro-batch's backward: that is in flight too)."""

from __future__ import annotations

import pytest

from scaletrain.parallel.launch import spawn

from ._pp_buffer_fns import pp_buffer_peaks

pytestmark = [pytest.mark.distributed]

SCHEDULES = [("1f1b", 1), ("interleaved", 2), ("zero-bubble", 2), ("dualpipev", 2)]
CASES = [(s, v, m) for s, v in SCHEDULES for m in (8, 16)]


@pytest.fixture(scope="module")
def peaks() -> list[dict]:
    return spawn(pp_buffer_peaks, 2, CASES)


@pytest.mark.parametrize(("schedule", "virtual"), SCHEDULES, ids=[s for s, _ in SCHEDULES])
def test_buffers_do_not_grow_with_the_micro_batches(peaks, schedule, virtual):
    for rank, got in enumerate(peaks):
        few, many = got[(schedule, virtual, 8)], got[(schedule, virtual, 16)]
        assert few["received"] == many["received"], (rank, few, many)
        assert few["sends"] == many["sends"], (rank, few, many)
        # every stage but the first receives; none keeps a buffer per micro-batch
        assert any(n > 0 for n in many["received"].values()), many
        assert all(n < 8 for n in many["received"].values()), many
        multi = schedule not in ("gpipe", "1f1b")
        assert (many["sends"] is not None) == multi
        assert all(loss == loss for loss in many["losses"])  # finite: the step ran through
