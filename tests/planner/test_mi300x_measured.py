"""The MI300X preset's measured figures beside its datasheet: its own fp8 / bf16 GEMM share
(AMD's hipBLASLt max-achievable-FLOPs table, not the H100's) and the all-reduce bus bandwidth
RCCL reaches on 8 GPUs (rccl-tests in AMD's RCCL / xGMI blog). Each is pinned against the
published figures and a hand computation; a described device states its own share."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import ConfigError, hardware_preset
from scaletrain.config.hardware_toml import describe_hardware
from scaletrain.planner.time.attention_core import kernel_ceilings
from scaletrain.planner.time.comm import allreduce_time
from scaletrain.planner.time.fp8_casts import FP8_MAMF_SHARE, fp8_gemm_share
from scaletrain.planner.time.step_time import default_efficiency

MI300X = hardware_preset("mi300x")

# rccl-tests all_reduce_perf, 8 x MI300X, RCCL 2.22.3 / ROCm 6.3, out-of-place time (us) by
# message size: ROCm/rocm-blogs blogs/software-tools-optimization/mi300x-rccl-xgmi/README.md
RCCL_ALLREDUCE_US = {
    2**24: 148.8,
    2**25: 244.1,
    2**26: 429.1,
    2**27: 797.4,
    2**28: 1537.1,
    2**30: 5970.6,
    2**34: 94254.0,
}


def test_mi300x_fp8_gemm_share_is_its_own_measurement() -> None:
    """AMD's MAF table: fp8 1273 of 2614.9, bf16 708 of 1307.4 TFLOP/s, one hipBLASLt build:
    a share of 0.899 against the H100's 0.882 (ml-engineering's MAMF tables)."""
    share = (1273.0 / 2614.9) / (708.0 / 1307.4)
    assert fp8_gemm_share(MI300X) == pytest.approx(share, rel=1e-12)
    assert 0.89 < share < 0.91
    assert FP8_MAMF_SHARE["h100"] == pytest.approx((1402.6 / 1979) / (794.5 / 989))
    bf16 = default_efficiency("bf16", 8192, MI300X)
    assert default_efficiency("fp8", 8192, MI300X) == pytest.approx(bf16 * share, rel=1e-12)
    # explain's GEMM ceiling line says whose share it is
    assert "fp8 GEMMs keep 0.899" in kernel_ceilings(MI300X)[0]
    assert "own fp8 / bf16 measurement" in kernel_ceilings(MI300X)[0]
    assert "generation's MAMF tables" in kernel_ceilings(hardware_preset("h100-sxm"))[0]


def test_a_device_without_its_own_share_keeps_its_generations() -> None:
    """0 = not measured: an H100 keeps the H100's, an MI300X stripped of its figure the H100's
    too (no AMD generation in the table), and a part without an fp8 peak runs bf16 (1)."""
    assert fp8_gemm_share(hardware_preset("h100-sxm")) == FP8_MAMF_SHARE["h100"]
    bare = dataclasses.replace(MI300X, fp8_mamf_share=0.0)
    assert fp8_gemm_share(bare) == FP8_MAMF_SHARE["h100"]
    assert fp8_gemm_share(hardware_preset("a100-80gb")) == 1.0


def test_a_described_device_states_its_own_share() -> None:
    """`[hardware] fp8_mamf_share` replaces the preset's; a non-positive one is refused."""
    spec = describe_hardware("h100-sxm", {"fp8_mamf_share": 0.8})
    assert fp8_gemm_share(spec) == 0.8
    with pytest.raises(ConfigError) as err:
        describe_hardware("h100-sxm", {"fp8_mamf_share": -1})
    assert "fp8_mamf_share" in str(err.value)


def test_mi300x_ring_all_reduce_prices_the_published_rccl_curve() -> None:
    """The ring model (2(n-1)/n x M / busbw + 2(n-1) x 5 us) at the preset's 318.98 GB/s
    prices every published 16 MiB-16 GiB all-reduce within 10% (within 1.5% from 128 MiB)."""
    bw = MI300X.intra_node_group_busbw(8)
    assert bw == pytest.approx(318.98e9)
    for size, us in RCCL_ALLREDUCE_US.items():
        t = allreduce_time(size, 8, bw, MI300X.intra_node_latency_s) * 1e6
        assert abs(t / us - 1) < (0.015 if size >= 2**27 else 0.10), (size, t, us)
