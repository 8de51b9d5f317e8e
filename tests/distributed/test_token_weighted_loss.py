"""The step's loss and gradient are the mean over the global batch's valid targets on real gloo
ranks (`scaletrain.trainer.tokens`): the trainer's `train_step`, 2 ranks, the micro-batches'
valid targets deliberately unequal (16, 3, 0, 9 of 16), float64, against the one-process
gradient of the global token mean. Each layout splits the batch differently: dp (2 micro-batches
per rank, DDP and ZeRO-3's mean reductions), cp (unequal counts per sequence shard), pp (the
schedule's micro-batches) and tp (replicated loss)."""

import pytest

from scaletrain.parallel.launch import spawn

from ..token_loss import assert_grads_close, job, reference_grads, step_many

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

LAYOUTS = {
    "ddp": {"dp": 2},
    "zero3": {"dp": 2, "zero": 3},
    "cp": {"cp": 2},
    "pp_1f1b": {"pp": 2, "pp_schedule": "1f1b"},
    "tp": {"tp": 2},
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("tokens"))
    return spawn(step_many, 2, {name: job(tmp, **par) for name, par in LAYOUTS.items()})


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_gives_the_global_token_mean(results, layout, tmp_path):
    ref = reference_grads(job(str(tmp_path)))
    merged = {"loss": results[0][layout]["loss"], "grads": {}}
    for rank in results:
        assert rank[layout]["loss"] == merged["loss"]  # every rank logs the same loss
        merged["grads"].update(rank[layout]["grads"])
    assert set(merged["grads"]) == set(ref["grads"])  # the ranks cover the model
    assert_grads_close(merged, ref, layout)
