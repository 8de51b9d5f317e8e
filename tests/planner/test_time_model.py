"""The time model's communication and efficiency terms (planner/comm.py, efficiency.py): each
rule against its arithmetic, on layouts where the answer follows from the placement alone."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset
from scaletrain.planner.comm import axis_link

A100 = hardware_preset("a100-80gb")


@pytest.mark.parametrize("layout,per_node", [
    (Layout(dp=64, zero=3), 8),            # FSDP over 8 nodes: 8 of the group's ranks per node
    (Layout(dp=32, tp=2), 4),              # tp=2 inside: 4 dp ranks per node
    (Layout(dp=8, tp=8, sp=True), 1),      # one dp rank per node: the plain NIC figure
    (Layout(dp=16, tp=4), 2),
])
def test_multi_rail_ring_bandwidth(layout: Layout, per_node: int) -> None:
    """A ring crossing nodes leaves each node once per channel, channels spread over the
    group's NICs: g ranks per node run at min(NVLink, g x NIC) (comm.py docstring)."""
    bw, lat, inter = axis_link(layout, A100, "dp")
    assert inter and lat == A100.inter_node_latency_s
    assert bw == pytest.approx(min(A100.intra_node_bw, per_node * A100.inter_node_bw))


def test_multi_rail_capped_by_nvlink() -> None:
    """Eight 50 GB/s NICs (400) stay below the H100's NVLink (450); with a 200 GB/s NIC the
    ring is NVLink-bound."""
    h100 = hardware_preset("h100-sxm")
    assert axis_link(Layout(dp=16), h100, "dp")[0] == pytest.approx(8 * h100.inter_node_bw)
    fat = dataclasses.replace(h100, inter_node_bw=200e9)
    assert axis_link(Layout(dp=16), fat, "dp")[0] == pytest.approx(fat.intra_node_bw)
    # inside one node nothing changes
    assert axis_link(Layout(dp=8), h100, "dp")[:2] == (h100.intra_node_bw,
                                                        h100.intra_node_latency_s)
