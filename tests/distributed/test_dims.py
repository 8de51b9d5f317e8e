"""ParallelDims and parallelize() checks that need no process group."""

from __future__ import annotations

import pytest

from scaletrain.config import MODEL_PRESETS, ConfigError, Layout, MemoryConfig, PrecisionConfig
from scaletrain.models import build_model
from scaletrain.parallel import MESH_AXES, ParallelDims, parallelize
from scaletrain.parallel.fsdp import mp_policy


def test_degrees_and_mesh_shape_follow_the_layout():
    dims = ParallelDims.from_layout(Layout(dp=4, dp_replicate=2, zero=3, tp=2, pp=2), 16)
    assert MESH_AXES == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert dims.shape == (2, 2, 2, 1, 2)
    assert (dims.dp_size, dims.dp_shard, dims.tp, dims.pp) == (4, 2, 2, 2)
    assert dims.fsdp_enabled and not dims.ddp_enabled
    # No mesh yet: ranks are those of a single process.
    assert (dims.dp_rank, dims.tp_rank, dims.pp_rank, dims.cp_rank) == (0, 0, 0, 0)
    assert not ParallelDims.from_layout(Layout(tp=2, sp=False), 2).sp
    assert not ParallelDims.from_layout(Layout(sp=True), 1).sp  # sp needs tp > 1


def test_degree_one_everywhere_enables_nothing():
    dims = ParallelDims.from_layout(Layout(zero=3), 1)
    assert not dims.fsdp_enabled and not dims.ddp_enabled and dims.shape == (1,) * 5


def test_legality_rules_come_from_config():
    with pytest.raises(ConfigError, match="world size 8"):
        ParallelDims.from_layout(Layout(dp=2, tp=2), 8)
    with pytest.raises(ConfigError, match="parallel.tp"):  # tp must divide num_kv_heads=2
        ParallelDims.from_layout(Layout(tp=4), 4, MODEL_PRESETS["tiny-llama"]())
    # the model-free composition rules hold without a model too (ZeRO-1 partitions expert
    # states across all of dp*cp, not inside HSDP replica groups)
    with pytest.raises(ConfigError, match="parallel.dp_replicate"):
        ParallelDims.from_layout(Layout(dp=4, zero=1, ep=2, dp_replicate=2), 4)


@pytest.mark.parametrize(
    ("layout", "memory", "field"),
    [
        (Layout(dp=2, zero=3), MemoryConfig(offload="optimizer"), "memory.offload"),
        (Layout(dp=2, zero=1), MemoryConfig(offload="params"), "memory.offload"),
    ],
)
def test_parallelize_refuses_unsupported_combinations_before_touching_the_model(
    layout, memory, field
):
    dims = ParallelDims.from_layout(layout, layout.world_size)
    model = build_model(MODEL_PRESETS["tiny"]())
    with pytest.raises(ConfigError, match=field):
        parallelize(model, dims, precision=PrecisionConfig(), memory=memory)


def test_mixed_precision_policy_from_precision_config():
    import torch

    assert mp_policy("fp32", "fp32").param_dtype is None
    bf16 = mp_policy("bf16", "fp32")
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mp_policy("fp16", "bf16").reduce_dtype == torch.bfloat16
