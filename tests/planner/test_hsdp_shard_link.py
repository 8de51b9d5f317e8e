"""HSDP's shard group and its link (time/comm.py `_axis_group` 'dp_shard'): under
HYBRID_SHARD the all-gathers and reduce-scatters run over the shard group only (torch FSDP1
shards over `dist.new_subgroups(devices per node)`, torch/distributed/fsdp/_init_utils.py
_init_intra_node_process_group), so a shard group that fits in a node is priced on NVLink
whatever the NICs carry; only the replicas' all-reduce of the shard (`hsdp_allreduce`) crosses
nodes. And the fms-fsdp rows carry their clusters' stated inter-node figures."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset
from scaletrain.planner.time.comm import CommInputs, axis_link, comm_terms

A100 = hardware_preset("a100-80gb")


def _terms(layout: Layout, hw) -> dict[str, tuple[float, float]]:
    return comm_terms(
        CommInputs(
            layout=layout,
            hardware=hw,
            stage_params=13e9,
            layers=40,
            moe_layers=0,
            tokens=4096.0,
            hidden=5120,
            kv_dim=5120,
            experts_per_token=0.0,
            micro_batches=1,
        )
    )


def test_shard_group_inside_a_node_is_priced_on_nvlink() -> None:
    hsdp = Layout(dp=128, dp_replicate=16, zero=3)  # 16 replicas of an 8-GPU shard group
    bw, _, inter = axis_link(hsdp, A100, "dp_shard")
    assert not inter and bw == pytest.approx(A100.intra_node_group_busbw(8))
    # a 16-GPU shard group spans two 8-GPU nodes
    assert axis_link(Layout(dp=128, dp_replicate=8, zero=3), A100, "dp_shard")[2]
    slow = dataclasses.replace(A100, inter_node_bw=A100.inter_node_bw / 4)
    fast_t, slow_t = _terms(hsdp, A100), _terms(hsdp, slow)
    # the gathers and reduce-scatters do not touch the NICs; the replicas' all-reduce does
    for fam in ("fsdp_all_gather", "fsdp_reduce_scatter"):
        assert slow_t[fam][1] == pytest.approx(fast_t[fam][1])
    assert slow_t["hsdp_allreduce"][1] > 3.5 * fast_t["hsdp_allreduce"][1]
    # the same 8-way shard as plain FSDP over 8 GPUs (one node)
    plain = _terms(Layout(dp=8, zero=3), A100)
    assert fast_t["fsdp_all_gather"][1] == pytest.approx(plain["fsdp_all_gather"][1])


def test_full_shard_keeps_the_whole_dp_group() -> None:
    # FULL_SHARD over 128 GPUs crosses nodes: the NIC figure still prices it (a quarter of
    # the bandwidth: ~3x the seconds, the ring's 127 latency steps per unit unchanged)
    fsdp = Layout(dp=128, zero=3)
    slow = dataclasses.replace(A100, inter_node_bw=A100.inter_node_bw / 4)
    fast_s = _terms(fsdp, A100)["fsdp_all_gather"][1]
    assert _terms(fsdp, slow)["fsdp_all_gather"][1] > 2.5 * fast_s
