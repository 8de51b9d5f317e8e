"""Pipeline x context parallelism (4 gloo ranks, pp 2 x cp 2) == one process; and pipeline x
DDP / ZeRO-1 (pp 2 x dp 2), which this fixed (DDP's reducer under torch's schedules).

The pipeline cuts each sequence to this cp rank's load-balanced shard, its stages pass the
shard's hidden states and run ring attention over their cp group, and each stage supplies the
shard's global positions (RoPE for llama, learned positions on gpt2's first stage). The rows
train as the parity matrix does (5 AdamW steps, clipping, float64) with its tolerances and their
reasons (tests/adam_tolerance.py): losses and gradient norms 1e-10 relative, parameters 1e-6
(`_parity_fns.assert_matches_reference`); pipeline ranks
together cover every parameter.
"""

from __future__ import annotations

import pytest

from scaletrain.parallel.launch import spawn

from ._parity_fns import assert_matches_reference, reference, train_modes

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

_PP = dict(pp=2, pp_schedule="1f1b", cp=2)
# mode -> (preset, layout, pipeline micro-batches per step)
MODES = {
    "pp2xcp2/llama4": ("tiny-llama-4l", _PP, 4),  # DDP over the cp ranks
    "pp2xcp2-zero3/gpt2": ("tiny", dict(_PP, zero=3), 2),  # FSDP over them; tied head copy
    # data parallelism without FSDP under pipelining (one gradient sync after the schedule)
    "pp2xdp2/llama4": ("tiny-llama-4l", dict(pp=2, dp=2, pp_schedule="1f1b"), 2),
    "pp2xdp2-zero1/llama4": ("tiny-llama-4l", dict(pp=2, dp=2, zero=1, pp_schedule="1f1b"), 2),
}


@pytest.fixture(scope="module")
def world4() -> list[dict]:
    return spawn(train_modes, 4, MODES)


@pytest.mark.parametrize("mode", list(MODES))
def test_pp_cp_matches_one_process(world4, mode):
    ref = reference(MODES[mode][0])
    covered: set[str] = set()
    for rank, results in enumerate(world4):
        got = results[mode]
        covered |= assert_matches_reference(got, ref, f"{mode} rank {rank}")
        axis = "cp" if "cp2" in mode else "dp"
        assert got["meshes"][axis] == (2, rank % 2) and got["meshes"]["pp"] == (2, rank // 2)
    assert covered == ref["params"].keys()
