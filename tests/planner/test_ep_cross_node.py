"""The EP all-to-all across nodes (time/comm.py `_ep_term`): NCCL's per-peer sends put every
byte for another node on a NIC; the flex dispatcher (DeepEP / HybridEP) sends a token once per
destination node. Inside one node the ring formula is unchanged."""

from __future__ import annotations

import math

import pytest

from scaletrain.config import Layout, hardware_preset
from scaletrain.planner.time.comm import (
    CommInputs,
    comm_terms,
    expected_remote_nodes,
    gather_time,
)

H100 = hardware_preset("h100-sxm")
TOKENS, HIDDEN, K, E = 4096.0, 2048, 8, 128


def _inputs(layout: Layout, dispatcher: str = "unstated") -> CommInputs:
    return CommInputs(
        layout=layout,
        hardware=H100,
        stage_params=1e9,
        layers=1,
        moe_layers=1,
        tokens=TOKENS,
        hidden=HIDDEN,
        kv_dim=512,
        experts_per_token=K,
        num_experts=E,
        top_k=K,
        moe_dispatcher=dispatcher,
        micro_batches=1,
    )


def _a2a_seconds(layout: Layout, dispatcher: str = "unstated") -> float:
    return comm_terms(_inputs(layout, dispatcher))["ep_all_to_all"][1]


ROUTED = 2 * K * TOKENS * HIDDEN  # bf16 routed rows of one micro-batch


def test_expected_remote_nodes():
    assert expected_remote_nodes(E, K, 1) == 0.0
    # two nodes of 64 experts: the other node misses all 8 picks with C(64,8)/C(128,8)
    miss = math.comb(64, 8) / math.comb(128, 8)
    assert expected_remote_nodes(E, K, 2) == pytest.approx(1 - miss)
    # top-1: the one expert lies on another node with (n-1)/n
    assert expected_remote_nodes(64, 1, 8) == pytest.approx(7 / 8)
    # never more than the other nodes, nor than k
    assert expected_remote_nodes(256, 8, 32) <= 8
    assert expected_remote_nodes(256, 8, 4) <= 3
    # a group-limited router whose groups are not the nodes: capped at its groups
    assert expected_remote_nodes(256, 8, 8, node_cap=4) == pytest.approx(4.0)
    # DeepSeek-V3's node-limited routing (8 groups = 8 nodes, 4 per token): its own node is
    # among the 4 with 4/8, so 4 x 7/8 remote
    assert expected_remote_nodes(256, 8, 8, node_cap=4, groups=8) == pytest.approx(3.5)


def test_within_a_node_the_ring_formula_holds():
    L = Layout(dp=8, ep=8)
    bw = H100.intra_node_group_busbw(8)
    one = gather_time(ROUTED, 8, bw, H100.intra_node_latency_s)
    assert _a2a_seconds(L) == pytest.approx(4 * one)
    assert _a2a_seconds(L, "flex") == pytest.approx(4 * one)


def test_nccl_all_to_all_across_two_nodes_is_nic_bound():
    L = Layout(dp=16, ep=16)
    nic = 8 / 16 * ROUTED / H100.inter_node_bw
    nvlink = 7 / 16 * ROUTED / H100.intra_node_group_busbw(8)
    assert nic > nvlink
    one = nic + 15 * H100.inter_node_latency_s
    assert _a2a_seconds(L) == pytest.approx(4 * one)
    # the bytes counted are the all-to-all's, whatever the tier
    assert comm_terms(_inputs(L))["ep_all_to_all"][0] == pytest.approx(4 * 15 / 16 * ROUTED)


def test_flex_sends_a_token_once_per_remote_node():
    L = Layout(dp=16, ep=16)
    token = 2 * TOKENS * HIDDEN
    nic = token * expected_remote_nodes(E, K, 2) / H100.inter_node_bw
    nvlink = 7 / 8 * ROUTED / H100.intra_node_group_busbw(8)
    one = max(nic, nvlink) + 15 * H100.inter_node_latency_s
    assert _a2a_seconds(L, "flex") == pytest.approx(4 * one)
    # top-8 over two nodes: ~1 copy per token crosses instead of ~4
    assert _a2a_seconds(L, "flex") < _a2a_seconds(L) / 2


def test_ep_strided_by_tp_counts_its_ranks_per_node():
    # tp 2, ep 8: the EP group's ranks stride 2, four per node over two nodes
    L = Layout(tp=2, dp=8, ep=8)
    nic = 4 / 8 * ROUTED / H100.inter_node_bw
    nvlink = 3 / 8 * ROUTED / H100.intra_node_group_busbw(4)
    one = max(nic, nvlink) + 7 * H100.inter_node_latency_s
    assert _a2a_seconds(L) == pytest.approx(4 * one)


def test_explain_names_the_nic_share():
    from scaletrain.planner import estimate
    from scaletrain.planner.output.explain import explain
    from scaletrain.planner.recipes.published import load_runs, plan_input, recipe_of

    runs = {r.name: r for r in load_runs()}
    flex = runs["bridge-h100-qwen3-30b-a3b-16g-ep16-fp8"]
    text = explain(estimate(plan_input(flex, recipe_of(flex))))
    assert "ep_all_to_all spans 2 nodes (8 ranks each)" in text
    assert "a token crosses once per destination node" in text
    nccl = explain(estimate(plan_input(flex)))  # the default recipe: torch's all_to_all
    assert "8/16 of the routed bytes on each rank's NIC" in nccl
    inside = runs["nemo2502-b200-mixtral-8x7b-64g"]
    assert "ep_all_to_all spans" not in explain(estimate(plan_input(inside, recipe_of(inside))))
