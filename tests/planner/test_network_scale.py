"""Issue 39's misses at scale and on other hardware, the mechanisms the planner now carries:
NCCL's ring / tree latency model (nvidia/nccl src/graph/tuning.cc) for the data-parallel
all-reduce, and a device's measured achievable matmul rate (MAMF) against the H100 the default
efficiency was read on. Each is pinned against a hand computation of its formula."""

from __future__ import annotations

import dataclasses
import math

import pytest

from scaletrain.config import Layout, ModelConfig, hardware_preset
from scaletrain.config.hardware_rules import nvidia_arch
from scaletrain.planner import estimate
from scaletrain.planner.time.comm import axis_link, dp_allreduce_latency
from scaletrain.planner.time.efficiency import (
    MAMF_REFERENCE,
    allreduce_latency,
    matmul_peak_factor,
)
from scaletrain.planner.time.step_time import default_efficiency
from scaletrain.planner.types import PlanInput

INTRA, INTER = 1.0, 10.0


def test_ring_inside_one_node_pays_intra_node_hops_only() -> None:
    """One node of 8: NCCL's ring has no network step, 2(n-1) NVLink hops; its tree is a chain
    of the same length, so either prices 14 hops."""
    assert allreduce_latency(8, INTRA, INTER, 8) == 14 * INTRA
    assert allreduce_latency(1, INTRA, INTER, 8) == 0.0


def test_ring_across_nodes_pays_the_network_only_where_it_leaves_a_node() -> None:
    """2 nodes of 4: ring 2(n-1) = 14 steps of which 2(nodes-1) = 2 cross the network
    (tuning.cc nInterSteps): 12 intra + 2 inter = 32; the tree 2((4-1) intra + log2(2) inter)
    = 26 is the smaller."""
    ring = 12 * INTRA + 2 * INTER
    tree = 2 * (3 * INTRA + 1 * INTER)
    assert allreduce_latency(8, INTRA, INTER, 4) == min(ring, tree) == tree
    # one rank per node: both are 2(nodes-1) network steps at two nodes
    assert allreduce_latency(2, INTRA, INTER, 1) == 2 * INTER


def test_tree_at_64_nodes_uses_floor_log2_of_the_nodes() -> None:
    """dp 128 with 2 ranks per node (tp 4 on 8-GPU nodes): the ring's 126 network steps lose to
    the tree's 2 (1 intra + 6 inter); 96 ranks on 48 nodes take floor(log2 48) = 5 (NCCL's
    log2i)."""
    ring = (254 - 126) * INTRA + 126 * INTER
    tree = 2 * (1 * INTRA + 6 * INTER)
    assert tree < ring
    assert allreduce_latency(128, INTRA, INTER, 2) == tree
    assert allreduce_latency(96, INTRA, INTER, 2) == 2 * (INTRA + 5 * INTER)


def test_dp_latency_reads_the_ranks_per_node_off_the_placement() -> None:
    """dp 128 x tp 4 on H100 nodes of 8: the dp group's stride is 4, so 2 of its ranks share a
    node; its bandwidth is the multi-rail 2 x NIC (comm.axis_link) and its latency the tree's."""
    hw = hardware_preset("h100-sxm")
    lay = Layout(dp=128, zero=1, tp=4, sp=True)
    got = dp_allreduce_latency(lay, hw, None, 128)
    want = 2 * (hw.intra_node_latency_s + int(math.log2(64)) * hw.inter_node_latency_s)
    assert got == pytest.approx(want, rel=1e-12)
    bw, _, crosses = axis_link(lay, hw, "dp")
    assert crosses and bw == min(hw.intra_node_bw, 2 * hw.inter_node_bw)


def test_mamf_factor_is_one_for_the_reference_class() -> None:
    """A preset without a measured MAMF plans as the NVIDIA parts the default efficiency was
    read on; a device measured at the reference's fraction of its own peak too."""
    h100 = hardware_preset("h100-sxm")
    assert h100.mamf_bf16 == 0.0 and matmul_peak_factor(h100) == 1.0
    same = dataclasses.replace(h100, mamf_bf16=MAMF_REFERENCE * h100.peak_flops["bf16"])
    assert matmul_peak_factor(same) == pytest.approx(1.0, rel=1e-12)
    assert default_efficiency("bf16", 8192, h100) == 0.55


def test_mi300x_keeps_its_mamf_share_of_the_default_efficiency() -> None:
    """MI300X: 668.4 of 1307.4 TFLOP/s bf16 measured against the H100's 794.5 of 989
    (ml-engineering's MAMF table, its 'v2' measurement for both): 0.636 of the default
    efficiency, in every precision."""
    mi = hardware_preset("mi300x")
    factor = (668.4e12 / mi.peak_flops["bf16"]) / (794.5 / 989)
    assert matmul_peak_factor(mi) == pytest.approx(factor, rel=1e-12)
    assert 0.63 < factor < 0.64
    assert default_efficiency("bf16", 8192, mi) == pytest.approx(0.55 * factor, rel=1e-12)
    # fp8: bf16's 0.55 x the fp8 / bf16 share of the MI300X's own (AMD's hipBLASLt MAF
    # table, 1273 and 708 TFLOPs: time.fp8_casts.fp8_gemm_share)
    share = (1273.0 / 2614.9) / (708.0 / 1307.4)
    assert default_efficiency("fp8", 2048, mi) == pytest.approx(
        0.55 * share * factor * (2048 / 4096) ** 0.25, rel=1e-12
    )


def test_a_measured_device_computes_at_the_scaled_rate() -> None:
    """The default recipe's compute on a device with MI300X's figures and measured MAMF takes
    1/factor of the time it takes with none: matmuls and the attention core both run at the
    bf16 rate. (Described as an sm80 part with no attention figure of its own so the attention
    keeps the matmul rate: a measured figure (the MI300X preset's) or an sm90 part's H100
    ceiling caps it, which the factor does not move: attention_core.attention_seconds_per_token.)"""
    mi = dataclasses.replace(
        hardware_preset("mi300x"), name="described", arch=nvidia_arch((8, 0)), attention_bf16=0.0
    )
    model = ModelConfig(
        name="tiny-llama",
        vocab_size=1024,
        dim=1024,
        num_layers=4,
        num_heads=8,
        ffn_dim=2048,
        max_seq_len=1024,
        norm="rmsnorm",
        activation="swiglu",
        position="rope",
        bias=False,
    )
    plan = PlanInput(model, mi, 8, Layout(dp=8), 1024, 16, 2, "bf16", "none")
    unmeasured = dataclasses.replace(plan, hardware=dataclasses.replace(mi, mamf_bf16=0.0))
    got, ref = estimate(plan).time.compute_s, estimate(unmeasured).time.compute_s
    assert got == pytest.approx(ref / matmul_peak_factor(mi), rel=1e-9)


def test_a100_takes_its_measured_mamf_share() -> None:
    """Both A100 SXM presets carry ml-engineering's measured bf16 MAMF (271.2 of 312 TFLOP/s,
    86.9%): their large GEMMs reach 1.082x the reference H100's share of peak."""
    for name in ("a100-40gb", "a100-80gb"):
        hw = hardware_preset(name)
        assert hw.mamf_bf16 == 271.2e12
        factor = (271.2 / 312) / MAMF_REFERENCE
        assert matmul_peak_factor(hw) == pytest.approx(factor, rel=1e-12)
        assert factor == pytest.approx(1.082, abs=1e-3)


def test_point_to_point_node_gives_a_small_group_its_peers_links_only() -> None:
    """A 4-GPU node wired pairwise (2 x 25 GB/s per pair, 6 links per GPU): a pair reaches
    its own 2 links, 3 GPUs 4 links, the whole node all 6; a switched node (no pair figure)
    gives every group the full figure; the achieved share applies either way."""
    hw = dataclasses.replace(hardware_preset("v100-32gb"), gpus_per_node=4, intra_node_pair_bw=50e9)
    eff = hw.intra_node_bw_efficiency
    assert math.isclose(hw.intra_node_group_busbw(2), 50e9 * eff)
    assert math.isclose(hw.intra_node_group_busbw(3), 100e9 * eff)
    assert hw.intra_node_group_busbw(4) == hw.intra_node_busbw
    switched = dataclasses.replace(hw, intra_node_pair_bw=0.0)
    assert switched.intra_node_group_busbw(2) == switched.intra_node_busbw
    tp2 = Layout(dp=2, tp=2)
    assert math.isclose(axis_link(tp2, hw, "tp")[0], 50e9 * eff)
    assert axis_link(tp2, switched, "tp")[0] == switched.intra_node_busbw
    # the node size passed in (plan's gpus_per_node) decides what "the whole node" is
    assert axis_link(Layout(dp=1, tp=4), hw, "tp", gpus_per_node=8)[0] == 150e9 * eff
