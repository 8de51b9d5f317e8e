"""Qwen2 (q/k/v biases) and Qwen3 (per-head q/k norms, head_dim != dim / heads) under tensor
parallelism, with and without sequence parallelism, and under ZeRO-3: the float64 parity
verdict of the parity matrix (test_parity_matrix.py: losses and gradient norms within 1e-10
relative, every final parameter within 1e-6 of one process)."""

from __future__ import annotations

import pytest

from scaletrain.parallel.launch import spawn

from ._parity_fns import assert_matches_reference, reference, train_modes

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

MODELS = ("tiny-qwen2", "tiny-qwen3")
LAYOUTS = {"tp2": dict(tp=2), "tp2+sp": dict(tp=2, sp=True), "zero3": dict(dp=2, zero=3)}
ROWS = [(mode, model) for mode in LAYOUTS for model in MODELS]


@pytest.fixture(scope="module")
def world2() -> list[dict]:
    modes = {f"{mode}/{model}": (model, LAYOUTS[mode], 1) for mode, model in ROWS}
    return spawn(train_modes, 2, modes)


@pytest.fixture(scope="module")
def references() -> dict:
    return {m: reference(m) for m in MODELS}


@pytest.mark.parametrize(("mode", "model"), ROWS, ids=[f"{m}-{n}" for m, n in ROWS])
def test_parity(world2, references, mode, model):
    ref = references[model]
    covered: set[str] = set()
    for rank, results in enumerate(world2):
        covered |= assert_matches_reference(
            results[f"{mode}/{model}"], ref, f"{mode}/{model} rank {rank}"
        )
    assert covered == ref["params"].keys()
    assert any(".q_norm." in n for n in covered) == (model == "tiny-qwen3")
    assert any("wq.bias" in n for n in covered) == (model == "tiny-qwen2")
