"""The compute an overlapped NCCL collective takes from the GEMMs beside it: while a collective
runs on its own stream next to the compute stream, its kernel holds one CTA per channel on as
many SMs for its whole duration, and the GEMMs launched beside it get the other SMs only.
Torch-free.

Facts read (NVIDIA/nccl at 5067397, the newest snapshot):
- A collective's kernel is launched with one CTA per channel (src/enqueue.cc
  `ncclLaunchKernel`: grid = the channels of the plan's channel mask); the channel count starts
  at `comm->nChannels` (`comm->nvlsChannels` for NVLink SHARP) and is lowered only while the
  message is smaller than nc x threads x threadThreshold (`topoGetAlgoInfo`'s channel loop),
  never for the hundreds of MB of a layer's gather; the cap `maxCTAs` defaults to MAXCHANNELS
  (src/init.cc NCCL_CONFIG_DEFAULT, NCCL_MAX_CTAS unset).
- Ring channels on an 8-GPU NVSwitch node of sm90 GPUs: NCCL's topology search
  (src/graph/search.cc `ncclTopoCompute`) gives each GPU NVLink bandwidth 18 links x 20.6 GB/s
  (src/graph/topo.h SM90_NVLINK_BW) and picks its speed from `sm90SpeedArrayIntra` (60, 50, 40,
  30, 24, ... GB/s per channel): 6 channels of 60 GB/s (360 of 370.8 GB/s); pass 1's
  `ncclTopoDupChannels` doubles them to 12 (bwIntra 60 >= 50), and `ncclTopoPostset`
  (src/graph/connect.cc: "Duplication should be complete now", nChannels * 2) doubles again:
  24 CTAs, under MAXCHANNELS (src/include/device.h, 64) and the default maxCTAs.
- NVLink SHARP (all-reduce): `NVLS_NCHANNELS_SM90` = 16 (src/transport/nvls.cc).
- Both figures as run: NCCL's init log on 8 H100 of one p5.48xlarge node prints "24 coll
  channels, 24 collnet channels, 16 nvls channels, 32 p2p channels" (a public benchmark log
  found by find_string "24 coll channels, 24 collnet channels, 16 nvls"); an Nsight Systems
  trace of a GEMM overlapped with an all-gather on an H100 (132 SMs) shows "the concurrent
  ncclAllGather kernel launches 24 blocks", leaving the 132-block GEMM fewer SMs for its first
  wave (NVIDIA developer forum, "Compute-Communication Overlap Causes Severe GEMM Performance
  Degradation because of Tail Effect", https://forums.developer.nvidia.com/t/337991).
- The collectives also compete for HBM bandwidth: NCCL's maintainer on a GEMM / attention
  kernel slowed beside an all-gather on A100: "Very likely, they're competing for memory
  bandwidth", the NVLink bandwidth "needs to be multiplied by at least 2x for memory
  bandwidth, as we need to store to memory, then read back from it. If you add reading from or
  writing to user data, it can be 3x" (S. Jeaugey, https://github.com/NVIDIA/nccl/issues/1428,
  2024-09-05/06).

Counts (`overlap_sm_seconds`): the overlapped seconds of each NCCL family (its time less what
`exposure.exposed_by_family` leaves exposed) x its CTAs / the GPU's SMs: the compute those SMs would
have done in that time, added to the step. Every recipe: the SMs are NCCL's whatever framework
launches it (Megatron-LM's CUDA_DEVICE_MAX_CONNECTIONS=1 orders kernel launches, it does not
change the CTAs).
Ignores: the HBM traffic share (it slows memory-bound kernels, not the compute-bound GEMMs
this charges; the maintainer's 2-3x is a bound, not a measured slowdown); wave quantization
(the forum trace's near-2x GEMM is a 132-tile GEMM pushed into a second wave: shape-dependent);
the collective's own slowdown beside compute; channel counts other than sm90's 18-link NVSwitch
node (A100, B200, H800, PCIe parts, AMD's RCCL: not read, charged 0) and groups that cross nodes
(the search then runs over the NICs, connect.cc adds channels per NIC: not read, charged 0,
`node_local_families`); Transformer Engine userbuffers' TP overlap ('tp', its own SM count),
pipeline and context-parallel sends (point-to-point channels), activation offload (copy
engines)."""

from __future__ import annotations

from scaletrain.config import GB, HardwareSpec, Layout

__all__ = [
    "NCCL_RING_CTAS_SM90",
    "NCCL_NVLS_CTAS_SM90",
    "SM_FAMILIES",
    "nccl_ctas",
    "nccl_sm_share",
    "node_local_families",
    "overlap_sm_seconds",
]

NCCL_RING_CTAS_SM90 = 24
"""CTAs of a ring collective on an 8-GPU NVSwitch node of H100 / H200 SXM (module docstring)."""
NCCL_NVLS_CTAS_SM90 = 16
"""CTAs of an NVLink SHARP all-reduce on sm90 (NVIDIA/nccl src/transport/nvls.cc)."""

SM_FAMILIES: tuple[str, ...] = (
    "fsdp_all_gather",
    "fsdp_reduce_scatter",
    "dp_allreduce",
    "hsdp_allreduce",
    "zero_reduce_scatter",
    "zero_all_gather",
)
"""Communication families run as NCCL collectives (ring CTAs); the all-reduces may run as
NVLink SHARP (`nccl_ctas`)."""

_NVLINK4_NODE_BW = 450 * GB
"""Per-direction NVLink of an 18-link NVLink4 GPU (H100 / H200 SXM datasheets: 900 GB/s
total): the topology NCCL's search was read for."""


def nccl_ctas(hardware: HardwareSpec, *, nvls: bool = False) -> int:
    """CTAs (= channels) one NCCL collective's kernel occupies on `hardware`: 24 for a ring, 16
    for an NVLink SHARP all-reduce (`nvls`), on an sm90 GPU with 18 NVLink4 links to NVSwitch
    (module docstring: NCCL's search and its logs); 0 elsewhere (not read)."""
    arch = hardware.arch
    if arch.vendor != "nvidia" or arch.capability is None or arch.capability[0] != 9:
        return 0
    if hardware.intra_node_bw < _NVLINK4_NODE_BW:
        return 0
    return NCCL_NVLS_CTAS_SM90 if nvls else NCCL_RING_CTAS_SM90


def nccl_sm_share(hardware: HardwareSpec, *, nvls: bool = False) -> float:
    """The share of `hardware`'s SMs one NCCL collective holds: `nccl_ctas` /
    `HardwareSpec.sm_count`; 0 where either is unknown."""
    sms = hardware.sm_count
    ctas = nccl_ctas(hardware, nvls=nvls)
    return min(1.0, ctas / sms) if sms > 0 and ctas > 0 else 0.0


def node_local_families(layout: Layout, gpus_per_node: int) -> tuple[str, ...]:
    """The `SM_FAMILIES` whose process group stays inside one node (the mesh is (pp,
    dp_replicate, dp_shard, cp, tp), tp innermost): the sharded families over dp_shard x cp at
    stride tp; the plain all-reduce over dp at stride tp x cp; HSDP's replica all-reduce over
    dp_replicate at stride tp x shards. Only these run the NVSwitch node's channel count read
    in the module docstring."""
    L = layout
    shards = L.zero_shards
    out: list[str] = []
    if L.tp * shards <= gpus_per_node:
        out += ["fsdp_all_gather", "fsdp_reduce_scatter", "zero_reduce_scatter", "zero_all_gather"]
    if L.tp * L.cp * L.dp <= gpus_per_node:
        out.append("dp_allreduce")
    if L.tp * shards * max(1, L.dp_replicate) <= gpus_per_node:
        out.append("hsdp_allreduce")
    return tuple(out)


def overlap_sm_seconds(
    comm: dict[str, tuple[float, float]],
    exposed: dict[str, float],
    hardware: HardwareSpec,
    *,
    families: tuple[str, ...] = SM_FAMILIES,
    nvls_allreduce: bool = False,
) -> float:
    """Compute seconds a step loses to the SMs its overlapped NCCL collectives hold (module
    docstring): sum over `families` (of `SM_FAMILIES`; `node_local_families` for a plan) in
    `comm` ((bytes, seconds) per family) of (seconds - `exposed` seconds of that family,
    floored at 0) x `nccl_sm_share`. `exposed` may charge a pair of families under one key
    (exposure.exposed_by_family charges FSDP's reduce-scatter with the backward all-gather):
    the two are summed before the exposed part is taken off.
    nvls_allreduce: the all-reduces run as NVLink SHARP (16 CTAs on sm90)."""
    ring = nccl_sm_share(hardware)
    if ring <= 0:
        return 0.0
    chosen = [f for f in SM_FAMILIES if f in families and f in comm]
    out = 0.0
    fsdp = [f for f in ("fsdp_all_gather", "fsdp_reduce_scatter") if f in chosen]
    if fsdp:
        busy = sum(comm[k][1] for k in fsdp)
        out += max(0.0, busy - sum(exposed.get(k, 0.0) for k in fsdp)) * ring
    for name in chosen:
        if name in fsdp:
            continue
        share = ring
        if name in ("dp_allreduce", "hsdp_allreduce") and nvls_allreduce:
            share = nccl_sm_share(hardware, nvls=True)
        out += max(0.0, comm[name][1] - exposed.get(name, 0.0)) * share
    return out
