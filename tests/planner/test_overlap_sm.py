"""The SMs an overlapped NCCL collective holds beside the GEMMs (`planner.time.overlap_sm`):
24 ring CTAs / 16 NVLink SHARP CTAs on an 18-link NVSwitch sm90 node (NCCL's search and logs),
charged as overlapped seconds x CTAs / SMs, node-local groups only."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset
from scaletrain.planner import estimate
from scaletrain.planner.recipes.published import load_runs, plan_input, recipe_of
from scaletrain.planner.time.overlap_sm import (
    NCCL_NVLS_CTAS_SM90,
    NCCL_RING_CTAS_SM90,
    SM_FAMILIES,
    nccl_ctas,
    nccl_sm_share,
    node_local_families,
    overlap_sm_seconds,
)

H100 = hardware_preset("h100-sxm")


def test_ctas_are_read_for_the_nvswitch_sm90_node_only() -> None:
    assert (NCCL_RING_CTAS_SM90, NCCL_NVLS_CTAS_SM90) == (24, 16)
    for name in ("h100-sxm", "h100-hbm2e-500w", "h200"):
        hw = hardware_preset(name)
        assert nccl_ctas(hw) == 24, name
        assert nccl_ctas(hw, nvls=True) == 16, name
    # not read: other generations, the 8-link H800, the PCIe part, AMD's RCCL
    for name in ("a100-80gb", "b200", "h800", "h100-pcie", "mi300x", "cpu"):
        assert nccl_ctas(hardware_preset(name)) == 0, name
        assert nccl_sm_share(hardware_preset(name)) == 0.0, name


def test_share_is_ctas_over_the_sm_count() -> None:
    assert nccl_sm_share(H100) == pytest.approx(24 / 132)
    assert nccl_sm_share(H100, nvls=True) == pytest.approx(16 / 132)
    # a device whose SM count is not stated: no charge
    assert nccl_sm_share(dataclasses.replace(H100, sm_count=0)) == 0.0
    # described under another name, same figures: same share
    assert nccl_sm_share(dataclasses.replace(H100, name="my-h100")) == pytest.approx(24 / 132)


def test_charges_the_overlapped_seconds_only() -> None:
    comm = {
        "fsdp_all_gather": (0.0, 10.0),
        "fsdp_reduce_scatter": (0.0, 6.0),
        "tp": (0.0, 5.0),
        "cp_ring": (0.0, 3.0),
    }
    # FSDP's reduce-scatter is charged under the all-gather's key; tp / cp_ring are not NCCL
    # collectives with the ring's CTAs here (userbuffers, point-to-point)
    exposed = {"fsdp_all_gather": 4.0, "tp": 0.0, "cp_ring": 0.0}
    got = overlap_sm_seconds(comm, exposed, H100)
    assert got == pytest.approx((16.0 - 4.0) * 24 / 132)
    # fully exposed: nothing ran beside compute
    assert overlap_sm_seconds(comm, {"fsdp_all_gather": 16.0}, H100) == 0.0
    # over-exposed (a bucket floor above the time) floors at 0
    assert overlap_sm_seconds({"dp_allreduce": (0.0, 1.0)}, {"dp_allreduce": 2.0}, H100) == 0.0
    # a family left out (its group crosses nodes) is not charged
    assert overlap_sm_seconds(comm, exposed, H100, families=("dp_allreduce",)) == 0.0
    # a device whose channels were not read
    assert overlap_sm_seconds(comm, exposed, hardware_preset("a100-80gb")) == 0.0


def test_all_reduce_under_nvls_takes_sixteen_ctas() -> None:
    comm = {"dp_allreduce": (0.0, 2.0)}
    exposed = {"dp_allreduce": 0.5}
    ring = overlap_sm_seconds(comm, exposed, H100)
    nvls = overlap_sm_seconds(comm, exposed, H100, nvls_allreduce=True)
    assert ring == pytest.approx(1.5 * 24 / 132)
    assert nvls == pytest.approx(1.5 * 16 / 132)
    # the sharded families stay rings under NVLS
    z = {"zero_reduce_scatter": (0.0, 2.0)}
    assert overlap_sm_seconds(z, {}, H100, nvls_allreduce=True) == pytest.approx(2 * 24 / 132)


def test_node_local_families_follow_the_mesh() -> None:
    assert set(node_local_families(Layout(dp=8, zero=3), 8)) == set(SM_FAMILIES)
    # 16-way sharding crosses nodes: the sharded families and the all-reduce over dp are out
    assert node_local_families(Layout(dp=16, zero=3), 8) == ()
    # tp 8 fills the node: any dp group crosses it
    assert node_local_families(Layout(dp=2, tp=8, zero=1), 8) == ()
    # HSDP: shards of 8 inside the node, the replica all-reduce across nodes
    fam = node_local_families(Layout(dp=16, dp_replicate=2, zero=3), 8)
    assert "fsdp_all_gather" in fam and "hsdp_allreduce" not in fam


def test_estimate_adds_it_to_the_step() -> None:
    """An 8-GPU FSDP row of the corpus (OLMo-core 13B): step = compute + bubble + exposed +
    overlap_sm + optimizer + overhead, the SM term = its overlapped FSDP seconds x 24 / 132."""
    run = next(r for r in load_runs() if r.name == "olmoc-h100-olmo2-13b-fsdp8-compile")
    plan = plan_input(run, recipe_of(run))
    t = estimate(plan).time
    assert t.overlap_sm_s > 0
    total = t.compute_s + t.bubble_s + t.comm_exposed_s + t.overlap_sm_s + t.optimizer_s
    assert t.step_s == pytest.approx(total + t.overhead_s)
    fsdp = t.comm_terms["fsdp_all_gather"] + t.comm_terms["fsdp_reduce_scatter"]
    assert t.comm_exposed_s < fsdp
    assert t.overlap_sm_s == pytest.approx((fsdp - t.comm_exposed_s) * 24 / 132)
    # the same plan on an A100 node: channels not read, no charge
    a100 = dataclasses.replace(plan, hardware=hardware_preset("a100-80gb"))
    assert estimate(a100).time.overlap_sm_s == 0.0
