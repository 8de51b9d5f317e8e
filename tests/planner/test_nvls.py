"""NVLink SHARP (NCCL's NVLS algorithm) for all-reduces inside an NVSwitch-3 node
(`planner.time.comm.allreduce_seconds`, `HardwareSpec.nvls_allreduce_busbw`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scaletrain.config import Layout, ModelConfig, hardware_preset, load_config
from scaletrain.config.loading import read_hardware_file
from scaletrain.planner.time.comm import (
    NVLS_LATENCY_S,
    CommInputs,
    allreduce_seconds,
    allreduce_time,
    axis_link,
    comm_terms,
)

H100 = hardware_preset("h100-sxm")
GB = 1e9


def test_presets_with_nvswitch3_carry_a_measured_figure() -> None:
    """The H100 SXM's 480 GB/s (nccl-tests issue 212), the H200's 475 (issue 272) and the
    B200's 830 (nccl issue 1807), above their ring figures (370, 720); parts without a cited
    NVLS figure keep 0 (rings)."""
    assert H100.nvls_allreduce_busbw == 480 * GB
    assert hardware_preset("h200").nvls_allreduce_busbw == 475 * GB
    b200 = hardware_preset("b200")
    assert b200.nvls_allreduce_busbw == 830 * GB
    assert b200.nvls_allreduce_busbw > b200.intra_node_busbw
    for name in ("a100-80gb", "h100-pcie", "h800", "mi300x"):
        assert hardware_preset(name).nvls_allreduce_busbw == 0.0, name
    assert H100.nvls_allreduce_busbw > H100.intra_node_busbw


def test_allreduce_inside_a_node_takes_the_faster_of_ring_and_nvls() -> None:
    m, n = 256 * 2**20, 8
    link = axis_link(Layout(tp=8), H100, "tp")
    assert link[2] is False
    ring = allreduce_time(m, n, link[0], link[1])
    nvls = 2 * (n - 1) / n * m / (480 * GB) + NVLS_LATENCY_S
    assert allreduce_seconds(m, n, link, H100) == pytest.approx(min(ring, nvls))
    assert nvls < ring
    # a caller's own ring price (NCCL's ring / tree latency model) is kept when it is faster
    assert allreduce_seconds(m, n, link, H100, ring=1e-9) == 1e-9


def test_groups_across_nodes_and_devices_without_nvls_keep_the_ring() -> None:
    m = 64 * 2**20
    across = axis_link(Layout(dp=16), H100, "dp")
    assert across[2] is True
    assert allreduce_seconds(m, 16, across, H100) == allreduce_time(m, 16, across[0], across[1])
    a100 = hardware_preset("a100-80gb")
    link = axis_link(Layout(tp=8), a100, "tp")
    assert allreduce_seconds(m, 8, link, a100) == allreduce_time(m, 8, link[0], link[1])
    assert allreduce_seconds(m, 1, link, H100) == 0.0


def _tp(sp: bool, hw=H100) -> float:
    model = ModelConfig(dim=4096, num_layers=4, num_heads=32)
    lay = Layout(tp=8, sp=sp)
    inputs = CommInputs(
        layout=lay,
        hardware=hw,
        stage_params=1e9,
        layers=4,
        moe_layers=0,
        tokens=4096.0,
        hidden=model.dim,
        kv_dim=model.kv_dim,
        experts_per_token=0.0,
        micro_batches=2,
    )
    return comm_terms(inputs)["tp"][1]


def test_tensor_parallel_all_reduces_take_nvls_but_sequence_parallel_gathers_do_not() -> None:
    """Megatron TP without SP all-reduces (NVLS inside the node); with SP the same bytes move
    as all-gather + reduce-scatter pairs, which stay rings at 370 GB/s."""
    no_nvls = dataclasses.replace(H100, nvls_allreduce_busbw=0.0)
    assert _tp(sp=False) < _tp(sp=False, hw=no_nvls)
    assert _tp(sp=True) == _tp(sp=True, hw=no_nvls) == _tp(sp=False, hw=no_nvls)


def test_the_figure_is_described_in_toml(tmp_path: Path) -> None:
    p = tmp_path / "hw.toml"
    p.write_text('[hardware]\ngpu = "a100-80gb"\nnvls_allreduce_busbw_gb_s = 400\n')
    spec = load_config(None, {"hardware": read_hardware_file(str(p))}).hardware_spec()
    assert spec.nvls_allreduce_busbw == 400 * GB


def test_explain_says_when_a_recipe_turns_nvls_off() -> None:
    from scaletrain.planner import estimate
    from scaletrain.planner.output.explain import explain
    from scaletrain.planner.types import PlanInput

    model = ModelConfig(dim=2048, num_layers=4, num_heads=16, vocab_size=32000)
    p = PlanInput(model, H100, 8, Layout(dp=8, zero=1), 2048, 8, 1, "bf16", recipe="nemo")
    assert "NVLink SHARP off" in explain(estimate(p))
    p = dataclasses.replace(p, recipe="megatron")
    assert "NVLink SHARP off" not in explain(estimate(p))


def test_nemo_runs_turn_nvls_off_megatron_keeps_nccls_default() -> None:
    """NeMo's performance scripts export NCCL_NVLS_ENABLE=0 (Recipe.nccl_nvls False): an
    in-node DDP all-reduce under the nemo recipe is a ring, under megatron NVLS."""
    from scaletrain.planner import estimate
    from scaletrain.planner.recipes.registry import recipe_named
    from scaletrain.planner.types import PlanInput

    assert recipe_named("megatron").nccl_nvls and not recipe_named("nemo").nccl_nvls
    model = ModelConfig(dim=2048, num_layers=4, num_heads=16, vocab_size=32000)

    def dp_allreduce(recipe: str, hw=H100) -> float:
        p = PlanInput(model, hw, 8, Layout(dp=8, zero=0), 2048, 8, 1, "bf16", recipe=recipe)
        return estimate(p).time.comm_terms["dp_allreduce"]

    no_nvls = dataclasses.replace(H100, nvls_allreduce_busbw=0.0)
    assert dp_allreduce("megatron") < dp_allreduce("megatron", no_nvls)
    assert dp_allreduce("nemo") == pytest.approx(dp_allreduce("megatron", no_nvls))
