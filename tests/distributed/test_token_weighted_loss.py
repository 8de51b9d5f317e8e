"""The step's loss and gradient are the mean over the global batch's valid targets on real gloo
ranks (`scaletrain.trainer.tokens`): the trainer's `train_step`, 2 ranks, the micro-batches'
valid targets deliberately unequal (16, 3, 0, 9 of 16), float64, against the one-process
gradient of the global token mean. Each layout splits the batch differently: dp (2 micro-batches
per rank, DDP and ZeRO-3's mean reductions), cp (unequal counts per sequence shard), pp (the
schedule's micro-batches) and tp (replicated loss). The validation loss
(`trainer.evaluation.evaluate`) of the same batches, split the same ways, is the global token
mean too."""

import pytest

from scaletrain.parallel.launch import spawn

from ..token_loss import assert_grads_close, eval_many, job, reference_grads, step_many

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


EVAL_LAYOUTS = {k: LAYOUTS[k] for k in ("ddp", "cp", "pp_1f1b", "tp")}


@pytest.fixture(scope="module")
def eval_results(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("eval"))
    return spawn(eval_many, 2, {name: job(tmp, **par) for name, par in EVAL_LAYOUTS.items()})


@pytest.mark.parametrize("layout", list(EVAL_LAYOUTS))
def test_validation_loss_is_the_global_token_mean(eval_results, layout, tmp_path):
    """Sum of token losses / valid targets, all-reduced: each dp rank's batches (16 + 3 and
    0 + 9 valid targets), each cp rank's shard, the pipeline's micro-batches, tp's replicas."""
    ref = reference_grads(job(str(tmp_path)))["loss"]
    for rank in eval_results:
        got = rank[layout]
        assert got is not None and abs(got - ref) <= 1e-12 * ref, (layout, got, ref)
