"""The Nanotron benchmark rows ran on AWS p5 nodes over EFA (published_runs.toml, the Nanotron
block's header): their row hardware table gives the h100-sxm preset the bus bandwidth NCCL
reaches per GPU over EFA, and every other figure stays the preset's. Pinned here: the figure
against the measurement it is read from, the rows carrying it, and what it changes in the
planner's pricing (an axis that crosses nodes; nothing inside a node)."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest

from scaletrain.config import hardware_preset
from scaletrain.planner import estimate
from scaletrain.planner.recipes.published import load_runs, plan_input, recipe_of
from scaletrain.planner.time.comm import axis_link

P5_ALLREDUCE_1GIB_BUSBW = {4: 280.30, 8: 274.47, 16: 269.23, 32: 220.08}
"""nccl-tests all_reduce_perf out-of-place busbw (GB/s) at 1 GiB on p5.48xlarge, 8 GPUs per
node, by node count: crazyguitar/aws-gpu-communication-benchmark data/nccl_all_reduce.csv at
4fdb5a4 (the 2-node row is left out: NCCL's tree reports more than the wire on 2 nodes)."""


@pytest.fixture(scope="module")
def nanotron_rows():
    return [r for r in load_runs() if r.framework == "nanotron"]


def test_efa_figure_is_the_measured_busbw_per_gpu() -> None:
    per_gpu = statistics.median(P5_ALLREDUCE_1GIB_BUSBW.values()) / 8
    assert round(per_gpu, 1) == 34.0
    # below the 4 x 100 Gb/s EFA line rate of a p5 GPU (the preset's 50 GB/s)
    assert per_gpu * 1e9 < hardware_preset("h100-sxm").inter_node_bw


def test_every_nanotron_row_carries_the_efa_figure_and_only_it(nanotron_rows) -> None:
    assert len(nanotron_rows) == 26
    preset = hardware_preset("h100-sxm")
    for r in nanotron_rows:
        hw = r.hardware()
        assert hw.inter_node_bw == 34.0e9, r.name
        assert replace(hw, inter_node_bw=preset.inter_node_bw, notes=preset.notes) == preset


def test_efa_slows_axes_that_cross_nodes_only(nanotron_rows) -> None:
    by_name = {r.name: r for r in nanotron_rows}
    # tp 16 spans 2 nodes: its multi-rail ring runs at 8 GPUs' NICs, 8 x 34 = 272 GB/s, below
    # NVLink's 370 (the raw-NIC preset would give min(370, 400) = 370)
    p = plan_input(by_name["nanotron-h100-80b-64n-dp32-tp16-pp1"], "nanotron")
    bw, _, inter = axis_link(p.layout, p.hardware, "tp")
    assert inter and math.isclose(bw, 8 * 34.0e9)
    ib = axis_link(p.layout, hardware_preset("h100-sxm"), "tp")[0]
    assert math.isclose(ib, 370e9)
    # dp 128 under tp 4: 2 ranks per node share their 2 GPUs' NICs, 68 GB/s
    q = plan_input(by_name["nanotron-h100-8.86b-64n-dp128-tp4-pp1"], "nanotron")
    bw, _, inter = axis_link(q.layout, q.hardware, "dp")
    assert inter and math.isclose(bw, 2 * 34.0e9)
    # one node: the same step as on the preset (no collective leaves the node)
    one = by_name["nanotron-h100-1.34b-1n-dp4-tp1-pp2"]
    a = plan_input(one, recipe_of(one))
    b = replace(a, hardware=hardware_preset("h100-sxm"))
    assert math.isclose(estimate(a).time.step_s, estimate(b).time.step_s)
    # across nodes the step only grows
    c = replace(q, hardware=hardware_preset("h100-sxm"))
    assert estimate(q).time.step_s > estimate(c).time.step_s


def test_shipped_p5_description_is_the_rows_hardware(nanotron_rows) -> None:
    """configs/h100-p5-efa.toml plans a p5 node as the Nanotron rows do."""
    from pathlib import Path

    from scaletrain.config import load_config
    from scaletrain.config.loading import read_hardware_file

    root = Path(__file__).resolve().parents[2]
    hw = read_hardware_file(root / "configs" / "h100-p5-efa.toml")
    spec = load_config(None, {"hardware": hw}).hardware_spec()
    assert spec == nanotron_rows[0].hardware()
