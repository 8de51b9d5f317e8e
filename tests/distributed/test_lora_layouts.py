"""LoRA in every layout == one process (float64): the trainer's `train_step` + `apply_update`
on 2 gloo ranks, the adapters' gradients and updated values after 2 steps against the
single-process run of the same job, micro-batches with unequal valid targets. Layouts: DDP,
ZeRO-3 (FSDP2, a frozen base beside the trainable adapters in each shard unit), tp2 and
tp2+sp (each adapter split with its base, `parallel.tensor_parallel_lora`), pp2 under 1F1B
with a tied embedding (the last stage's head copy frozen with it) and under the zero-bubble
schedule (the weight gradients computed apart from the input gradients).

Only the adapters have a gradient and optimizer states, on every rank; the PEFT export gathers
each layout's adapters (TP shards, pipeline stages) into the single-process file. The bounds are the
float64 summation-order ones of the token-weighted loss tests (`token_loss.assert_grads_close`,
`adam_tolerance`): every layout computes the same products, split and summed differently.
"""

import pytest
from safetensors.torch import load_file

from scaletrain.checkpoint.peft import ADAPTER_WEIGHTS
from scaletrain.parallel.launch import spawn

from ..adam_tolerance import assert_float64_close
from ..token_loss import assert_grads_close, job, step_grads, step_many

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

LORA = {"rank": 4, "alpha": 8.0, "targets": "wq,wk,wv,wo,w1,w2,w3"}
STEPS = 2  # the second step's gradients: B is no longer zero, so A has a gradient too
TIED = {"tie_embeddings": True}
SIX = {"num_layers": 6}  # zero-bubble: 4 stages of 1, 2, 2, 1 layers
LAYOUTS: dict[str, tuple[dict, dict]] = {  # name: (model overrides, parallel)
    "ddp": ({}, {"dp": 2}),
    "zero3": ({}, {"dp": 2, "zero": 3}),
    "tp2": ({}, {"tp": 2}),
    "tp2_sp": ({}, {"tp": 2, "sp": True}),
    "pp2_1f1b_tied": (TIED, {"pp": 2, "pp_schedule": "1f1b"}),
    "pp2_zero_bubble": (SIX, {"pp": 2, "pp_schedule": "zero-bubble", "pp_virtual": 2}),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    jobs = {n: job(str(tmp), lora=LORA, model=m, **par) for n, (m, par) in LAYOUTS.items()}
    return {"ranks": spawn(step_many, 2, jobs, STEPS, str(tmp / "adapters")), "dir": tmp}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lora_layout_matches_one_process(results, layout, tmp_path):
    model = LAYOUTS[layout][0]
    ref = step_grads(
        job(str(tmp_path), lora=LORA, model=model), steps=STEPS, export=str(tmp_path / "adapter")
    )
    adapters = set(ref["grads"])
    assert adapters and all(".lora_" in n for n in adapters)  # adapters only
    assert ref["with_grad"] == ref["with_state"] == adapters
    held: set[str] = set()  # pp: each rank holds its stages' adapters
    for rank in results["ranks"]:
        got = rank[layout]
        assert set(got["grads"]) <= adapters
        # nothing frozen got a gradient or an optimizer state (a torch parallel style that
        # re-registers a frozen weight as trainable would show here)
        assert got["with_grad"] == got["with_state"] == set(got["grads"])
        held |= set(got["grads"])
        assert_grads_close(got, ref, layout)
        for name, value in got["params"].items():
            assert_float64_close(value, ref["params"][name], where=f"{layout} {name}")
    assert held == adapters
    # the PEFT export gathers every adapter whole (shards, stages) under PEFT's names
    written = load_file(results["dir"] / "adapters" / layout / ADAPTER_WEIGHTS)
    expected = load_file(tmp_path / "adapter" / ADAPTER_WEIGHTS)
    assert set(written) == set(expected) and len(expected) == len(adapters)
    for key, value in expected.items():
        assert_float64_close(written[key], value, where=f"{layout} export {key}")
