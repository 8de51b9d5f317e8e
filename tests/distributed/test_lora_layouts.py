"""LoRA under data parallelism == one process (float64): the trainer's `train_step` +
`apply_update` on 2 gloo ranks (DDP, ZeRO-3/FSDP2 with a frozen base beside the trainable
adapters in each shard unit), the adapters' gradients and updated values against the
single-process run of the same job, micro-batches with unequal valid targets."""

import pytest

from scaletrain.parallel.launch import spawn

from ..adam_tolerance import assert_float64_close
from ..token_loss import assert_grads_close, job, step_grads, step_many

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

LORA = {"rank": 4, "alpha": 8.0, "targets": "wq,wk,wv,wo,w1,w2,w3"}
STEPS = 2  # the second step's gradients: B is no longer zero, so A has a gradient too
LAYOUTS = {"ddp": {"dp": 2}, "zero3": {"dp": 2, "zero": 3}}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("lora"))
    jobs = {n: job(tmp, lora=LORA, **par) for n, par in LAYOUTS.items()}
    return spawn(step_many, 2, jobs, STEPS)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lora_layout_matches_one_process(results, layout, tmp_path):
    ref = step_grads(job(str(tmp_path), lora=LORA), steps=STEPS)
    assert ref["grads"] and all(".lora_" in n for n in ref["grads"])  # adapters only
    for rank in results:
        got = rank[layout]
        assert set(got["grads"]) == set(ref["grads"])
        assert_grads_close(got, ref, layout)
        for name, value in got["params"].items():
            assert_float64_close(value, ref["params"][name], where=f"{layout} {name}")
