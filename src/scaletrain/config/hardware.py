"""Accelerator presets: peak dense FLOP/s per dtype, memory, bandwidths, power, price.

Every figure is the vendor's datasheet number for dense math (no 2:4 sparsity), cited per preset,
except the memory: there the preset holds what CUDA reports (see `HardwareSpec.memory_bytes`;
the vendor's nominal "80GB" stays in the preset's name and comment).
Link bandwidths are *per GPU, per direction* (what one rank can push while all ranks push, the
number a ring collective sees). Latencies are the alpha of the alpha-beta cost model. Prices are
rough on-demand cloud rates (USD per GPU-hour, late 2025) meant to be overridden.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ._errors import ConfigError
from .hardware_rules import CPU_ARCH, GpuArch, amd_arch, nvidia_arch, runs_tf32
from .units import GB, GiB, MiB, fmt_bytes

__all__ = ["HardwareSpec", "HARDWARE_PRESETS", "hardware_preset", "GiB", "GB", "TFLOPS"]

TFLOPS = 1e12


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    peak_flops: dict[str, float]
    """Peak dense FLOP/s by compute dtype: 'fp32' (non-tensor-core), 'tf32', 'bf16', 'fp16', 'fp8'.
    A missing key means the dtype has no fast path (e.g. bf16 on V100)."""
    memory_bytes: float
    """Device memory a process can use, in bytes: the total CUDA reports
    (`torch.cuda.get_device_properties(i).total_memory`, the "total capacity" of PyTorch's OOM
    message), cited per preset from public OOM messages and logs, not the vendor's decimal GB:
    an H100 "80GB" holds 79.10 GiB = 84.9e9 B here (80e9 B is 5.8% short of it). nvidia-smi
    (NVML) shows a little more (81,559 MiB = 79.65 GiB); where the two differ the CUDA total
    is kept, the most the allocator can get. The CUDA context lives inside this total: the
    planner counts it once, in the rank's `total`
    (`planner.memory.buffers.RUNTIME_CONTEXT_BYTES`, or a published row's measured
    `cuda_context_mib`), and never takes it off the capacity."""
    memory_bw: float
    """Device memory bandwidth, bytes/s."""
    intra_node_bw: float
    """Per-GPU, per-direction bandwidth to peers inside a node (NVLink/xGMI/PCIe), bytes/s."""
    inter_node_bw: float
    """Per-GPU, per-direction bandwidth across nodes (one NIC per GPU), bytes/s."""
    power_w: float
    """Board power (TDP) in watts."""
    gpus_per_node: int = 8
    intra_node_latency_s: float = 5e-6
    inter_node_latency_s: float = 10e-6
    usd_per_hour: float = 2.0
    host_to_device_bw: float = 25 * GB
    """PCIe host link per direction (CPU offload traffic)."""
    storage_bw: float = 4 * GB
    """Read bandwidth from the training data's storage, per node, bytes/s (the input rate's
    margin, `planner.time.input_rate`). 4 GB/s: the single-node read rate of the "good" tier
    in the storage guidance of NVIDIA's DGX SuperPOD reference architecture (Storage
    Architecture: single-node read 4 / 8 / 40 GB/s for good / better / best), a typical shared
    parallel file system; set yours in `[hardware] storage_gb_per_s`."""
    notes: str = field(default="", compare=False)
    arch: GpuArch = CPU_ARCH
    """The generation, for the precision rules of `config.hardware_rules` (compute capability
    from NVIDIA's CUDA GPUs table, gfx target from AMD's ROCm hardware table)."""
    tf32: bool = True
    """Whether the run lets fp32 matmuls use TF32 tensor cores (`precision.tf32`, applied by
    `JobConfig.hardware_spec`); only counts where the arch has them."""
    host_memory_bytes: float = 0.0
    """Host RAM per node, bytes (what `memory.offload` fills: `hardware.host_memory_gib`
    overrides it); 0 = unknown (the planner shows the host term but cannot check it). Set
    where a reference system publishes it, cited per preset."""
    mamf_bf16: float = 0.0
    """Maximum achievable matmul FLOP/s in bf16 measured on this device (the best of a sweep of
    large GEMM shapes, e.g. stas00/ml-engineering's mamf-finder.py), cited per preset; the
    planner's default efficiency scales by its fraction of `peak_flops['bf16']` against the
    H100's (`planner.time.efficiency.matmul_peak_factor`). 0 = not measured: the device plans
    like the NVIDIA parts the default efficiency was read on."""
    fp8_mamf_share: float = 0.0
    """(achievable fp8 matmul FLOP/s / `peak_flops['fp8']`) / (achievable bf16 matmul FLOP/s /
    `peak_flops['bf16']`), both rates read from one measurement (one tool, one library
    version), cited per preset: the fraction of the bf16 matmul efficiency its float8 GEMMs
    keep against the fp8 peak (`planner.time.fp8_casts.fp8_gemm_share`). 0 = not measured on
    this device: its GPU generation's figure (the H100's for a part of no known generation)."""
    attention_bf16: float = 0.0
    """FlashAttention (forward + backward, bf16, causal) FLOP/s measured on this device, cited
    per preset: the ceiling of the flash attention core (`planner.time.efficiency.
    attention_ceiling`). 0 = no measurement of this device: an sm90 part takes the H100's
    published FlashAttention-2 figure (35% of peak), any other device the matmul rate; `explain`
    says which."""
    fused_attention_bf16: tuple[tuple[int, float, float], ...] = ()
    """cuDNN fused attention (Transformer Engine's FusedAttention, which Megatron-Core and NeMo
    run; torch SDPA's cuDNN backend) measured on this device, bf16, causal, head dim 128:
    ((sequence length, forward FLOP/s, backward FLOP/s), ...), ascending in sequence length,
    FLOPs counted causal-halved, the backward as 2.5 x the forward (flops.
    FLASH_BACKWARD_FACTOR). Cited per preset: the ceiling of the 'fused' attention core
    (`planner.time.attention_core.fused_attention_rates`). Empty = no published figure for this
    device: its fused core keeps the matmul rate (Hopper: cuDNN runs above it)."""
    intra_node_bw_efficiency: float = 1.0
    """Achieved share of `intra_node_bw` a collective's bus bandwidth reaches (the link figure
    is the raw datasheet one), cited per preset; the planner's intra-node collectives run at
    `intra_node_busbw`. 1 = no published achieved figure for this device: the raw link figure
    (PCIe and GeForce parts today); `explain` says which."""

    nvls_allreduce_busbw: float = 0.0
    """Bus bandwidth (all-reduce convention: 2(n-1)/n x bytes / seconds) an all-reduce inside
    one node reaches with NVLink SHARP, bytes/s: NCCL's NVLS algorithm, where the NVSwitch
    (third generation on, HGX H100 / H200) reduces and multicasts in the switch and each GPU
    sends its data once (`planner.time.comm.allreduce_seconds`). NCCL turns it on by itself
    where the device reports multicast support (NVIDIA/nccl src/transport/nvls.cc
    ncclNvlsInit: NCCL_NVLS_ENABLE defaults to 2, auto). Cited per preset; 0 = no NVLink SHARP
    figure for this device (no NVSwitch-3, or none published): its all-reduces run as rings at
    `intra_node_busbw`. Reduce-scatters and all-gathers keep `intra_node_busbw`."""
    sm_count: int = 0
    """Streaming multiprocessors (AMD: compute units) of one GPU, cited per preset: the share of
    them an overlapped NCCL collective's CTAs hold (`planner.time.overlap_sm`). 0 = not
    stated: no such charge."""
    intra_node_pair_bw: float = 0.0
    """Per-direction bandwidth between one pair of GPUs of a node wired point to point, with no
    switch between them (a fully connected NVLink mesh: every pair joined by the same number of
    links), bytes/s, raw. A group of g of the node's GPUs then reaches only the links to its
    own g - 1 peers: min(`intra_node_bw`, (g - 1) x this) x `intra_node_bw_efficiency`
    (`intra_node_group_busbw`); NCCL's rings hop GPU to GPU over direct links and do not route
    through a GPU outside the group (on sm70, NVLink2 has no forwarding). 0 = switched
    (NVSwitch, or one link figure for the whole node): every intra-node group reaches
    `intra_node_busbw`. Set per system, not per chip: a 4-GPU V100 SXM2 node has 2 NVLink2
    links (2 x 25 GB/s) between every pair of its GPUs (6 links per GPU, 3 peers), an 8-GPU
    DGX-1 a hybrid cube mesh this figure does not describe."""

    @property
    def intra_node_busbw(self) -> float:
        """Bus bandwidth an intra-node collective achieves per GPU, per direction, bytes/s: the
        raw link figure x its published achieved share (`intra_node_bw_efficiency`)."""
        return self.intra_node_bw * self.intra_node_bw_efficiency

    def intra_node_group_busbw(self, group: int) -> float:
        """Bus bandwidth per GPU, per direction, of a collective among `group` GPUs of one node:
        `intra_node_busbw`, or on a point-to-point mesh (`intra_node_pair_bw` > 0) a group
        smaller than the node its peers' links only, min(intra_node_bw, (group - 1) x
        intra_node_pair_bw) x intra_node_bw_efficiency."""
        if self.intra_node_pair_bw <= 0 or group < 2 or group >= self.gpus_per_node:
            return self.intra_node_busbw
        links = min(self.intra_node_bw, (group - 1) * self.intra_node_pair_bw)
        return links * self.intra_node_bw_efficiency

    @property
    def is_cpu(self) -> bool:
        """The device is a CPU (its arch says so, whatever its name): no CUDA context, a
        nominal time model, every precision runs."""
        return self.arch.vendor == "cpu"

    @property
    def device_type(self) -> str:
        """The torch device type a run on this hardware uses: 'cpu', else 'cuda' (ROCm's
        GPUs too). What the dry-run targets and fp8's backend is chosen for."""
        return "cpu" if self.is_cpu else "cuda"

    def capacity_text(self) -> str:
        """The capacity as plan, explain, dryrun and verify print it: binary units
        (`config.units`), as CUDA and nvidia-smi speak ('79.10 GiB' on an H100 80GB)."""
        return fmt_bytes(self.memory_bytes, digits=2)

    def flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for matmuls in `dtype`, falling back to the nearest slower path.

        fp32 matmuls run at the TF32 rate where the trainer turns TF32 on
        (`trainer.precision.set_tf32`): `tf32` set on a GPU that has it
        (`hardware_rules.runs_tf32`); otherwise at the plain fp32 rate."""
        fast32 = ("tf32",) if self.tf32 and runs_tf32(self.arch) else ()
        faster = _FASTER_PATHS.get(dtype)
        for key in (dtype,) if faster is None else (*faster, *fast32, "fp32"):
            if key in self.peak_flops:
                return self.peak_flops[key]
        raise KeyError(dtype)


_FASTER_PATHS = {
    "fp8": ("fp8", "bf16", "fp16"),
    "bf16": ("bf16", "fp16"),
    "fp16": ("fp16", "bf16"),
    "fp32": (),
}
"""`HardwareSpec.flops`' fallbacks of a dtype before (tf32 and) fp32, in order."""


def _tf(**kw: float) -> dict[str, float]:
    return {k: v * TFLOPS for k, v in kw.items()}


HARDWARE_PRESETS: dict[str, Callable[[], HardwareSpec]] = {
    # NVIDIA V100 SXM2 32GB datasheet: 15.7 TF fp32, 125 TF fp16 tensor, 900 GB/s HBM2,
    # NVLink2 300 GB/s total (150 GB/s per direction), 300 W. No bf16 tensor cores.
    # Memory (CUDA total): 31.74 GiB in PyTorch OOM messages on V100 32GB cards,
    # https://github.com/liucongg/ChatGLM-Finetuning/issues/73 and
    # https://github.com/haotian-liu/LLaVA/issues/812 (datasheet: 32 GB).
    "v100-32gb": lambda: HardwareSpec(
        "v100-32gb",
        _tf(fp32=15.7, fp16=125),
        31.74 * GiB,
        900 * GB,
        150 * GB,
        12.5 * GB,
        300,
        usd_per_hour=1.0,
        host_to_device_bw=16 * GB,
        arch=nvidia_arch((7, 0)),
        # NCCL's own model of an NVLink's app-level bandwidth: 20.0 GB/s per link
        # (NVIDIA/nccl src/graph/topo.h SM70_NVLINK_BW) of its 25 GB/s per direction; "roughly, the
        # app-level bandwidth is 80% of the peak bandwidth" (NCCL maintainer S. Jeaugey,
        # https://github.com/NVIDIA/nccl/issues/1054, 2023-11-06). No 8-GPU nccl-tests busBw
        # from NVIDIA was found for this part.
        intra_node_bw_efficiency=20.0 / 25,
        # SMs: 80 (NVIDIA Tesla V100 whitepaper)
        sm_count=80,
    ),
    # The 16 GB V100 (SXM2 16GB; same datasheet otherwise). Memory (CUDA total): 15.75 GiB on a
    # "Tesla V100 16GB", https://github.com/XuyangBai/TransFusion/issues/49 (15.78 GiB on
    # another driver, https://github.com/kchengiva/Shift-GCN/issues/34: the lower one is kept).
    "v100-16gb": lambda: HardwareSpec(
        "v100-16gb",
        _tf(fp32=15.7, fp16=125),
        15.75 * GiB,
        900 * GB,
        150 * GB,
        12.5 * GB,
        300,
        usd_per_hour=0.8,
        host_to_device_bw=16 * GB,
        arch=nvidia_arch((7, 0)),
        # NCCL's own model of an NVLink's app-level bandwidth: 20.0 GB/s per link
        # (NVIDIA/nccl src/graph/topo.h SM70_NVLINK_BW) of its 25 GB/s per direction; "roughly, the
        # app-level bandwidth is 80% of the peak bandwidth" (NCCL maintainer S. Jeaugey,
        # https://github.com/NVIDIA/nccl/issues/1054, 2023-11-06). No 8-GPU nccl-tests busBw
        # from NVIDIA was found for this part.
        intra_node_bw_efficiency=20.0 / 25,
        # SMs: 80 (NVIDIA Tesla V100 whitepaper)
        sm_count=80,
    ),
    # NVIDIA A100 SXM4 datasheet: 19.5 TF fp32, 156 TF tf32, 312 TF bf16/fp16 dense,
    # 40GB HBM2 1555 GB/s | 80GB HBM2e 2039 GB/s, NVLink3 600 GB/s total, 400 W.
    # Inter-node: HDR InfiniBand 200 Gb/s per GPU = 25 GB/s.
    # Memory (CUDA total; nvidia-smi shows 40,960 MiB on the 40GB and 81,920 MiB on the 80GB,
    # https://github.com/modal-labs/modal-client/pull/2797): 40GB 39.50 GiB,
    # https://github.com/TianheWu/CoSeR/issues/10 (39.59 GiB on another driver,
    # https://github.com/raoyongming/DenseCLIP/issues/52); 80GB 79.25 GiB,
    # https://github.com/HiDream-ai/VAREdit/issues/6 and
    # https://github.com/levihsu/OOTDiffusion/issues/235. The lower reading is kept.
    "a100-40gb": lambda: HardwareSpec(
        "a100-40gb",
        _tf(fp32=19.5, tf32=156, bf16=312, fp16=312),
        39.50 * GiB,
        1555 * GB,
        300 * GB,
        25 * GB,
        400,
        usd_per_hour=1.5,
        arch=nvidia_arch((8, 0)),
        # NCCL's own model of an NVLink's app-level bandwidth: 20.0 GB/s per link
        # (NVIDIA/nccl src/graph/topo.h SM80_NVLINK_BW) of its 25 GB/s per direction; "roughly, the
        # app-level bandwidth is 80% of the peak bandwidth" (NCCL maintainer S. Jeaugey,
        # https://github.com/NVIDIA/nccl/issues/1054, 2023-11-06). No 8-GPU nccl-tests busBw
        # from NVIDIA was found for this part.
        intra_node_bw_efficiency=20.0 / 25,
        # bf16 MAMF 271.2 TFLOP/s, 86.9% of peak (best shape 1024x10240x5120, torch 2.6.0+cu126):
        # stas00/ml-engineering compute/accelerator/README.md at 744d01e, 'Maximum Achievable
        # Matmul FLOPS comparison table' row 'NVIDIA A100 SXM' (the same table's H100 SXM:
        # 80.3%); the row names no memory size: both A100 SXM parts have the same SMs and clocks.
        mamf_bf16=271.2e12,
        # SMs: 108 (NVIDIA A100 whitepaper)
        sm_count=108,
    ),
    "a100-80gb": lambda: HardwareSpec(
        "a100-80gb",
        _tf(fp32=19.5, tf32=156, bf16=312, fp16=312),
        79.25 * GiB,
        2039 * GB,
        300 * GB,
        25 * GB,
        400,
        usd_per_hour=1.8,
        arch=nvidia_arch((8, 0)),
        # NCCL's own model of an NVLink's app-level bandwidth: 20.0 GB/s per link
        # (NVIDIA/nccl src/graph/topo.h SM80_NVLINK_BW) of its 25 GB/s per direction; "roughly, the
        # app-level bandwidth is 80% of the peak bandwidth" (NCCL maintainer S. Jeaugey,
        # https://github.com/NVIDIA/nccl/issues/1054, 2023-11-06). No 8-GPU nccl-tests busBw
        # from NVIDIA was found for this part.
        intra_node_bw_efficiency=20.0 / 25,
        # bf16 MAMF 271.2 TFLOP/s, 86.9% of peak (best shape 1024x10240x5120, torch 2.6.0+cu126):
        # stas00/ml-engineering compute/accelerator/README.md at 744d01e, 'Maximum Achievable
        # Matmul FLOPS comparison table' row 'NVIDIA A100 SXM' (the same table's H100 SXM:
        # 80.3%); the row names no memory size: both A100 SXM parts have the same SMs and clocks.
        mamf_bf16=271.2e12,
        # SMs: 108 (NVIDIA A100 whitepaper)
        sm_count=108,
    ),
    # NVIDIA H100 SXM5 datasheet: 67 TF fp32, 494.7 tf32, 989.4 bf16/fp16, 1978.9 fp8 (dense),
    # 80GB HBM3 3.35 TB/s, NVLink4 900 GB/s total (450 per direction), 700 W.
    # Inter-node: NDR InfiniBand 400 Gb/s per GPU = 50 GB/s.
    # Memory (CUDA total): 79.10 GiB, vLLM's total_gpu_memory on 8xH100,
    # https://github.com/huggingface/trl/issues/2688; 79.11 GiB in an OOM message on an H100,
    # https://github.com/vllm-project/vllm/issues/27508; torchtitan's log on "H100 80GB HBM3"
    # (its % is max_reserved / total_memory) gives 73.32 GiB / 92.70% = 79.09 GiB,
    # https://github.com/pytorch/torchtitan/issues/1789. nvidia-smi: 81,559 MiB (79.65 GiB),
    # https://github.com/NVIDIA/nccl/issues/1264.
    "h100-sxm": lambda: HardwareSpec(
        "h100-sxm",
        _tf(fp32=67, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9),
        79.10 * GiB,
        3350 * GB,
        450 * GB,
        50 * GB,
        700,
        usd_per_hour=2.5,
        host_to_device_bw=64 * GB,
        arch=nvidia_arch((9, 0)),
        # NVLink 4: 450 GB/s line rate per direction, "with the protocol overhead (~20%) NCCL
        # can get an effective NVLink bandwidth of 370GB/s" (busBw of non-all-reduce
        # collectives, or all-reduce with NCCL_ALGO=RING) on 8 H100: NCCL maintainer S. Jeaugey,
        # https://github.com/NVIDIA/nccl-tests/issues/212 (2024-05-06). 370 / 450. NCCL's model
        # agrees: 20.6 of 25 GB/s per link (src/graph/topo.h SM90_NVLINK_BW), 0.824.
        intra_node_bw_efficiency=370 / 450,
        # NVLink SHARP: "allreduce uses NVLink SHARP by default ... On 8 GPUs, you should reach
        # a peak busBw of ~480GB/s (algbw ~275GB/s)" (same comment, nccl-tests issue #212).
        nvls_allreduce_busbw=480 * GB,
        # host: 2 TB per 8-GPU node, MLCommons inference v3.1 system description of Dell's
        # XE9680 8 x H100 SXM 80GB ("host_memory_capacity": "2 TB"), github.com/mlcommons/
        # inference_results_v3.1 closed/Dell/systems/XE9680_H100_SXM_80GBx8_TRT.json
        host_memory_bytes=2048 * GiB,
        # SMs: 132 (NVIDIA H100 whitepaper, SXM5)
        sm_count=132,
    ),
    # Meta's Grand Teton H100 (torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Hardware):
    # SXM H100 with 96GB HBM2e at 2.4 TB/s, run at its default 500 W limit, NVLink within the
    # host, 400 Gb/s RDMA per GPU (50 GB/s). Its peak FLOP/s is "between SXM and NVL, and we
    # don't know its exact value" (same page, footnote 2): the midpoint of the H100 SXM
    # datasheet (989.4 TF bf16, 1978.9 fp8, 494.7 tf32, 67 fp32, dense) and the H100 NVL
    # datasheet (1671 / 3341 / 835 TF with sparsity -> 835.5 bf16, 1670.5 fp8, 417.5 tf32
    # dense; 60 fp32) is taken: +-8% either way.
    # Memory (CUDA total): 94.99 GiB, from torchtitan logs of Meta's own H100s (reserved GiB /
    # its % of total_memory; the MFU's peak reads 989 TF, an H100): 49.66 / 52.28% = 94.99,
    # https://github.com/pytorch/torchtitan/pull/1287; 44.84 / 47.19% = 95.02,
    # https://github.com/pytorch/torchtitan/pull/1884. Only the 96 GB card reads ~95 GiB (the
    # 80 GB reads 79.1 above, the 94 GB H100 NVL 93.00, https://github.com/ali-vilab/VACE/issues/56).
    "h100-hbm2e-500w": lambda: HardwareSpec(
        "h100-hbm2e-500w",
        _tf(fp32=63.5, tf32=456.1, bf16=912.45, fp16=912.45, fp8=1824.7),
        94.99 * GiB,
        2400 * GB,
        450 * GB,
        50 * GB,
        500,
        usd_per_hour=2.5,
        host_to_device_bw=64 * GB,
        arch=nvidia_arch((9, 0)),
        # NVLink 4 between H100s: the H100 SXM's NCCL figure (see h100-sxm), 370 / 450.
        intra_node_bw_efficiency=370 / 450,
        # SMs: not published for this SXM H100; the SXM5's 132 is assumed
        sm_count=132,
    ),
    # NVIDIA H800 SXM5: the H100 SXM5 for export markets, same SM, tensor cores and 80GB HBM3
    # (3.35 TB/s, 700 W; NVIDIA's H800 datasheet), NVLink cut to 400 GB/s total (200 per
    # direction; DeepSeek-V3 report arXiv:2412.19437 sec. 3.2.2 measures 160 GB/s of it
    # achieved). DeepSeek-V3's cluster (same report, sec. 3.1): 8 GPUs per node on NVLink +
    # NVSwitch, InfiniBand across nodes at 50 GB/s per GPU (sec. 3.2.2); its cost table
    # (Table 1) prices an H800 at $2 per GPU hour. Memory (CUDA total): the H100 SXM 80GB's.
    "h800": lambda: HardwareSpec(
        "h800",
        _tf(fp32=67, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9),
        79.10 * GiB,
        3350 * GB,
        200 * GB,
        50 * GB,
        700,
        usd_per_hour=2.0,
        host_to_device_bw=64 * GB,
        arch=nvidia_arch((9, 0)),
        # its own published figure: the DeepSeek-V3 report (arXiv:2412.19437 sec. 3.2.2) gives
        # its H800 NVLink 160 GB/s (against IB's 50), of the 200 GB/s per direction: 160 / 200.
        intra_node_bw_efficiency=160 / 200,
        # SMs: the H100 SXM5's 132 (same SM count, see above)
        sm_count=132,
    ),
    # NVIDIA H100 PCIe datasheet: 51 TF fp32, 378 tf32, 756 bf16, 1513 fp8; 80GB HBM2e 2 TB/s,
    # 350 W; peers over PCIe Gen5 x16 (64 GB/s per direction).
    # Memory: no CUDA total for the PCIe card was found; the SXM 80GB's 79.10 GiB is assumed.
    "h100-pcie": lambda: HardwareSpec(
        "h100-pcie",
        _tf(fp32=51, tf32=378, bf16=756, fp16=756, fp8=1513),
        79.10 * GiB,
        2000 * GB,
        64 * GB,
        50 * GB,
        350,
        usd_per_hour=2.0,
        host_to_device_bw=64 * GB,
        arch=nvidia_arch((9, 0)),
        # SMs: 114 (NVIDIA H100 whitepaper, PCIe)
        sm_count=114,
    ),
    # NVIDIA H200 SXM datasheet: H100 compute; 141GB HBM3e at 4.8 TB/s, NVLink 900 GB/s, 700 W.
    # Memory: no CUDA total for the H200 was found. Estimate: nvidia-smi's 143,771 MiB
    # (https://thundergolfer.com/blog/nvidia-gpu-memory-capacity) less the H100's gap between
    # nvidia-smi and CUDA (81,559 MiB - 79.10 GiB = 561 MiB): 143,210 MiB = 139.85 GiB.
    "h200": lambda: HardwareSpec(
        "h200",
        _tf(fp32=67, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9),
        (143771 - 561) * MiB,
        4800 * GB,
        450 * GB,
        50 * GB,
        700,
        usd_per_hour=3.5,
        host_to_device_bw=64 * GB,
        arch=nvidia_arch((9, 0)),
        # NVLink 4 and NVSwitch as on the H100 SXM: its NCCL figure (see h100-sxm), 370 / 450.
        intra_node_bw_efficiency=370 / 450,
        # NVLink SHARP: its own measurement, all_reduce_perf on 8 x H200 (NCCL 2.20.3) peaks at
        # 475 GB/s busBw, https://github.com/NVIDIA/nccl-tests/issues/272 (2024-11-27).
        nvls_allreduce_busbw=475 * GB,
        # host: 2 TB (32 x 64 GB DIMMs) per 8-GPU node, MLCommons inference v4.1 system
        # description of NVIDIA's H200-SXM-141GBx8 (DGX H200), github.com/mlcommons/
        # inference_results_v4.1 closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json
        host_memory_bytes=2048 * GiB,
        # SMs: the H100 SXM5 die's 132
        sm_count=132,
    ),
    # NVIDIA HGX B200 datasheet (per GPU, dense): 2.25 PF bf16/fp16, 4.5 PF fp8, 1.1 PF tf32,
    # 75 TF fp32; 180GB HBM3e 7.7 TB/s; NVLink5 1.8 TB/s total (900 per direction); 1000 W.
    # Memory (CUDA total): 178.35 GiB, cudaDeviceProp's total global memory on a B200,
    # https://github.com/pytorch/ao/pull/4002; torchtitan's log 66.91 GiB / 37.51% = 178.38 GiB
    # (its MFU's peak reads 2250 TF, a B200), https://github.com/pytorch/torchtitan/pull/2389.
    # nvidia-smi: 183,359 MiB, https://github.com/NVIDIA/TensorRT-LLM/issues/10278.
    "b200": lambda: HardwareSpec(
        "b200",
        _tf(fp32=75, tf32=1100, bf16=2250, fp16=2250, fp8=4500),
        178.35 * GiB,
        7700 * GB,
        900 * GB,
        50 * GB,
        1000,
        usd_per_hour=6.0,
        host_to_device_bw=64 * GB,
        arch=nvidia_arch((10, 0)),
        # NCCL's own model of an NVLink's app-level bandwidth: 40.1 GB/s per link
        # (NVIDIA/nccl src/graph/topo.h SM100_NVLINK_BW) of its 50 GB/s per direction; "roughly, the
        # app-level bandwidth is 80% of the peak bandwidth" (NCCL maintainer S. Jeaugey,
        # https://github.com/NVIDIA/nccl/issues/1054, 2023-11-06). No 8-GPU nccl-tests busBw
        # from NVIDIA was found for this part.
        intra_node_bw_efficiency=40.1 / 50,
        # NVLink SHARP: 8 x B200 in one machine reach "830+" GB/s all_reduce_perf busBw (NCCL
        # 2.27.1; its user's figure, above the 720 of NCCL's per-link model), https://github.com/
        # NVIDIA/nccl/issues/1807 (2025-08-13); the lower bound is taken. The same NVLink 5 /
        # NVSwitch on 8 x B300 (NCCL 2.30.4): busBw 695 GB/s with NVLS off, 845 with it on,
        # https://github.com/NVIDIA/nccl/issues/2140 (2026-04-28): the ring figure above agrees.
        nvls_allreduce_busbw=830 * GB,
        # bf16 MAMF 1745.0 TFLOP/s, 77.6% of peak (best shape 1792x16128x3072, torch
        # 2.7.1+cu128): stas00/ml-engineering compute/accelerator/README.md, 'Maximum Achievable
        # Matmul FLOPS comparison table' row 'NVIDIA B200 SXM' (the same table's H100 SXM: 80.3%).
        mamf_bf16=1745.0e12,
        # cuDNN 9.13 SDPA (torch 2.9.0a0 nv25.09, CUDA 13.0, torch SDPA's cuDNN backend) on a
        # B200, bf16, causal, batch 1, 128 query / 8 KV heads, head dim 128: NVIDIA's own
        # benchmark, NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/artifacts/
        # sdpa_bf16_benchmark_results_NVIDIA_B200.csv (rows 'pyt_cudnn', columns
        # fwd_tflops_per_sec, bwd_tflops_per_sec; sample_b200_bf16_run.txt gives the versions).
        # Its fwd TFLOP/s x time is 4 b h s^2 d / 2 (causal-halved) and its bwd 2.5x that, the
        # planner's count. Below the bf16 matmul rate at every length (8192: 1171 / 943 TFLOP/s
        # against MAMF 1745): Blackwell doubled the tensor cores but not the exp units or the
        # shared-memory bandwidth attention also needs (FlashAttention-4 paper, arXiv:2603.05451,
        # abstract). The same file's flash-attn 2.7.4 reaches 400 / 318 at 8192 (torch SDPA's
        # flash backend 373 / 299): not set as `attention_bf16`, which backend torch SDPA picks
        # on sm100 not being established here.
        fused_attention_bf16=(
            (512, 83.991e12, 134.164e12),
            (1024, 254.501e12, 308.529e12),
            (2048, 478.921e12, 371.486e12),
            (4096, 855.678e12, 701.265e12),
            (8192, 1171.278e12, 942.509e12),
            (16384, 1332.415e12, 1074.776e12),
            (32768, 1419.000e12, 1108.688e12),
            (65536, 1382.330e12, 1073.059e12),
            (131072, 1355.418e12, 1047.843e12),
        ),
        # SMs: 148 (NVIDIA Blackwell B200, 2 dies x 74)
        sm_count=148,
    ),
    # GeForce RTX 3090 (Ampere GA102 whitepaper): 35.6 TF fp32, 71 TF fp16/bf16 tensor with fp32
    # accumulate; 24GB GDDR6X 936 GB/s; PCIe Gen4 x16 (32 GB/s per direction); 350 W.
    # Memory (CUDA total): 23.70 GiB on a 3090, https://github.com/GaoLii/DSP/issues/10.
    "rtx3090": lambda: HardwareSpec(
        "rtx3090",
        _tf(fp32=35.6, bf16=71, fp16=71),
        23.70 * GiB,
        936 * GB,
        32 * GB,
        3.125 * GB,
        350,
        gpus_per_node=4,
        usd_per_hour=0.3,
        host_to_device_bw=32 * GB,
        arch=nvidia_arch((8, 6)),
        # SMs: 82 (GA102 whitepaper)
        sm_count=82,
    ),
    # GeForce RTX 4090 (Ada whitepaper): 82.6 TF fp32, 165.2 TF fp16/bf16 and 330.3 TF fp8 tensor
    # with fp32 accumulate; 24GB GDDR6X 1008 GB/s; PCIe Gen4 x16; 450 W.
    # Memory (CUDA total): 23.64 GiB on a 4090, https://github.com/3DTopia/Phidias-Diffusion/issues/8
    # (23.68 GiB on another driver, https://github.com/zai-org/CogVideo/issues/36).
    "rtx4090": lambda: HardwareSpec(
        "rtx4090",
        _tf(fp32=82.6, bf16=165.2, fp16=165.2, fp8=330.3),
        23.64 * GiB,
        1008 * GB,
        32 * GB,
        3.125 * GB,
        450,
        gpus_per_node=4,
        usd_per_hour=0.5,
        host_to_device_bw=32 * GB,
        arch=nvidia_arch((8, 9)),
        # SMs: 128 (Ada whitepaper)
        sm_count=128,
    ),
    # AMD Instinct MI300X datasheet: 163.4 TF fp32 matrix, 1307.4 TF bf16/fp16 dense, 2614.9 fp8;
    # 192GB HBM3 5.3 TB/s; 7 Infinity Fabric links x 64 GB/s per direction = 448 GB/s; 750 W.
    # Memory: no HIP total for the MI300X was found. ROCm reports its "GB" as GiB less 0.02:
    # 287.98 GiB on the 288 GB MI355X and 255.98 on the 256 GB MI325X in PyTorch OOM messages,
    # https://github.com/ROCm/TheRock/issues/2118; 191.98 GiB is assumed for the 192 GB.
    "mi300x": lambda: HardwareSpec(
        "mi300x",
        _tf(fp32=163.4, bf16=1307.4, fp16=1307.4, fp8=2614.9),
        191.98 * GiB,
        5300 * GB,
        448 * GB,
        50 * GB,
        750,
        usd_per_hour=2.5,
        host_to_device_bw=64 * GB,
        arch=amd_arch("gfx942"),
        # bf16 MAMF 668.4 TFLOP/s (best shape 10240x15360x8192, torch 2.5.1+rocm6.3.42131,
        # PYTORCH_TUNABLEOP_ENABLED=1): stas00/ml-engineering compute/accelerator/README.md,
        # "Maximum Achievable Matmul FLOPS comparison table", BF16 (51.4% of its 1300 TF
        # theory; the table's H100 SXM: 80.3%, measured by the same tool: the reference of
        # planner.time.efficiency.MAMF_REFERENCE). Read at 744d01e (2026-08-22); the figure
        # entered at faa7ddf (2025-01-06). That is the table's "v2" measurement (mean of 100
        # iterations with the cache reset between them); its older "v1" table (MI300X 781.9,
        # ROCm 6.2, 60.1%) "didn't reset the cache during the benchmark and in theory should
        # have given higher scores", and was removed at e695968 (2025-09-02) once v2 covered
        # its rows. AMD explains the gap to peak by clocks under sustained GEMM load below the
        # boost clock the peak assumes (ROCm blogs "Understanding Peak, Max-Achievable &
        # Delivered FLOPs", 2025).
        mamf_bf16=668.4e12,
        # fp8 against bf16: AMD's own max-achievable FLOPs (MAF) table measures both with
        # hipblaslt-bench on one hipBLASLt build (ROCm/hipBLASLt db8e93b, "a target for the ROCm
        # 6.5 GA"), cold caches, trig-float data: MI300X bf16 708 TFLOPs (1207 MHz median),
        # fp8 (f8_fnuz) 1273 TFLOPs (1230 MHz) (AMD ROCm blogs, "Measuring Max-Achievable FLOPs
        # - Part 2", 2025-02-28, Table 1; ROCm/rocm-blogs blogs/software-tools-optimization/
        # measuring-max-achievable-flops-part2/README.md). (1273 / 2614.9) / (708 / 1307.4) =
        # 0.899, the H100's 0.882 (ml-engineering's MAMF tables, whose MI300X fp8 row is
        # blank): float8 GEMMs keep about the same share of their doubled peak on both parts.
        fp8_mamf_share=(1273.0 / 2614.9) / (708.0 / 1307.4),
        # xGMI: 64 GB/s raw per link, "approximately 48 GB/s per link" usable after CRC and
        # protocol overhead, "about 75% of the theoretical peak" (AMD ROCm blogs, "Understanding
        # RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X", 2025-03-02, section
        # 'Theoretical Performance Claims vs. Achievable', https://rocm.blogs.amd.com/
        # software-tools-optimization/mi300x-rccl-xgmi/README.html). The same blog measures
        # what a collective reaches (its 'Why Does RCCL Bandwidth shuffle between 310-330 GB/s'):
        # the slowest of a GPU's 7 links paces it (TransferBench all-to-all, 45.1-47.2 GB/s per
        # link), and rccl-tests all_reduce_perf on 8 x MI300X (RCCL 2.22.3, ROCm 6.3) reaches a
        # bus bandwidth of 318.98 GB/s at 16 GiB (out-of-place; 305.6 at 256 MiB, 273.7 at 64
        # MiB): 318.98 / 448 = 0.712, the achieved bus bandwidth the H100 presets take the same
        # way (nccl-tests all_reduce busbw, 370 of 450). The planner's ring model with it and
        # the 5 us hop latency prices that run's 16 MiB-16 GiB all-reduces within +9% / -0.2%.
        intra_node_bw_efficiency=318.98 / 448,
        # the same blog, 'What is xGMI?': each GPU "is connected to its seven peer GPUs via xGMI
        # links, forming a fully connected mesh", one 64 GB/s link per pair (no switch): a group
        # of g < 8 GPUs reaches its g - 1 peers' links only (a pair: 64 x 0.712 = 45.6 GB/s,
        # within the blog's TransferBench 45.1-47.2 GB/s per link). RCCL's own topology says
        # the same: on a 4 x MI300X node it logs "maxBw 48.0 totalBw 144.0" (3 links x 48;
        # ncclTopoXGMISpeed in rccl/src/graph/topo.h, 48 GB/s for gfx94x, "after protocol and
        # error correction overheads", AMD's G. Lee in ROCm/rccl issue #1210, 2024-07-02);
        # ROCm/rccl PR #1270 (README): "When using less than 8 GPUs, one can only achieve a
        # fraction of the potential bandwidth on the system".
        intra_node_pair_bw=64 * GB,
        # FlashAttention-2 forward + backward, 231.6 TFLOP/s (17.7% of peak): ROCm/flash-attention
        # (the CK backend of flash-attn 2) issue #142 (2025-05-18, ROCm 6.3.2, "AMD Instinct
        # MI300X"), its benchmarks/benchmark_flash_attention.py at headdim 128, seqlen 16384,
        # batch 1 / 2 / 4 / 8: "Flash2 ... fwd + bwd: 223.08 / 230.54 / 231.57 / 228.36 TFLOPs/s"
        # (forward 310-356, backward 194-207); the best is kept, a ceiling. The script counts
        # fwd + bwd as 3.5 x the forward's 4 b s^2 h d FLOPs, the planner's 1 +
        # flops.FLASH_BACKWARD_FACTOR. Its rows are causal=False and its 16-bit dtype the
        # script's (fp16 and bf16 share the 1307.4 TF peak); no causal fwd + bwd row was found.
        # torch SDPA on ROCm runs AOTriton's kernel, not CK's: its backward measured 9.6-19.9
        # TFLOP/s on MI300X in 2024 (pytorch/pytorch issue #135431); no later fwd + bwd figure
        # for it was found, so this flash-attn figure stands for both.
        attention_bf16=231.57e12,
        # memory_bw: the datasheet figure. An achieved ~81% of it (BabelStream) is attributed to
        # arXiv 2510.27583 (Ambati et al. 2025) by summaries read here (arxivlens,
        # emergentmind), not the paper itself; and no preset holds an achieved HBM share.
        # compute units: 304 (AMD Instinct MI300X datasheet)
        sm_count=304,
    ),
    # This project's 2-core AVX-512 host (AMD EPYC, 2.6 GHz): 2 cores x 2.6 GHz x 2 FMA pipes x
    # 16 fp32 lanes x 2 FLOP = 333 GFLOP/s nominal peak (a 2048^3 sgemm measures ~190 GFLOP/s,
    # 57%); ~20 GB/s DRAM; gloo over loopback ~5 GB/s. Calibrate with benchmarks on other hosts.
    "cpu": lambda: HardwareSpec(
        "cpu",
        {"fp32": 333e9},
        24 * GiB,
        20 * GB,
        5 * GB,
        1.25 * GB,
        65,
        gpus_per_node=2,
        intra_node_latency_s=20e-6,
        inter_node_latency_s=50e-6,
        usd_per_hour=0.05,
        host_to_device_bw=20 * GB,
        arch=CPU_ARCH,
    ),
}


def hardware_preset(name: str) -> HardwareSpec:
    """A hardware preset by name; unknown names list the valid ones."""
    if name not in HARDWARE_PRESETS:
        raise ConfigError("hardware.gpu", name, f"use one of {', '.join(HARDWARE_PRESETS)}")
    return HARDWARE_PRESETS[name]()
