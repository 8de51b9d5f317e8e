"""QLoRA under data parallelism == one process (float64): the frozen projections stored in NF4
or int8 (`lora.base_dtype`), sharded by FSDP2 (ZeRO-3: NF4's codes and scales all-gathered by
torchao's FSDP2 hooks, int8 codes and row scales as plain shards) or replicated (DDP), on 2
gloo ranks, against the single-process run of the same job.

The bound follows from the arithmetic: each weight is quantized whole and then split along
rows (`models.init.copy_full_into`), so every layout multiplies the same dequantized values and
differs from one process only in float64 summation order: the LoRA parity test's bounds
(`token_loss.assert_grads_close`, `adam_tolerance.FLOAT64_PARAM_ATOL`). A shard quantized on
its own (its own mean of the block scales) would be off by the quantization error, ~1e-2 of a
weight, and fail them by orders of magnitude."""

import pytest

from scaletrain.parallel.launch import spawn

from ..adam_tolerance import assert_float64_close
from ..token_loss import assert_grads_close, job, step_grads, step_many

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

# wide enough that every projection splits into whole NF4 groups over 2 ranks
# (k: 128 x 256 = 512 blocks of 64 = 2 groups of 256)
MODEL = {"dim": 256, "ffn_dim": 512, "num_heads": 4, "num_kv_heads": 2}
TARGETS = "wq,wk,wv,wo,w1,w2,w3"
STEPS = 2
LAYOUTS = {
    "nf4-zero3": ("nf4", {"dp": 2, "zero": 3}),
    "int8-zero3": ("int8", {"dp": 2, "zero": 3}),
    "nf4-ddp": ("nf4", {"dp": 2}),
    # and with the saved activations offloaded (`memory.offload`): the same numbers
    "nf4-zero3-offload": ("nf4", {"dp": 2, "zero": 3, "offload": "activations"}),
}


def _job(tmp: str, base_dtype: str, offload: str = "none", **parallel):
    lora = {"rank": 4, "alpha": 8.0, "targets": TARGETS, "base_dtype": base_dtype}
    return job(tmp, lora=lora, model=MODEL, memory={"offload": offload}, **parallel)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("qlora"))
    jobs = {n: _job(tmp, base, **par) for n, (base, par) in LAYOUTS.items()}
    return spawn(step_many, 2, jobs, STEPS)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_qlora_layout_matches_one_process(results, layout, tmp_path):
    ref = step_grads(_job(str(tmp_path), LAYOUTS[layout][0]), steps=STEPS)
    assert ref["grads"] and all(".lora_" in n for n in ref["grads"])  # adapters only
    for rank in results:
        got = rank[layout]
        assert set(got["grads"]) == set(ref["grads"])
        assert_grads_close(got, ref, layout)
        for name, value in got["params"].items():
            assert_float64_close(value, ref["params"][name], where=f"{layout} {name}")
