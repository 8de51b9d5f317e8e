"""Time-model constants: the matmul efficiency by GPU generation, GEMM shape and precision (the
'generation' time model), the communication latency terms that matter at 1,000+ GPUs, and the
communication families a framework overlaps (COMM_OVERLAP, STATED_OVERLAPS). Torch-free. The
attention core by kernel and GPU generation is attention_core.py's; the elementwise
(memory-bound) kernels' traffic is elementwise.py's.

What every recipe uses (step_time.step_time):
- matmuls at `time.step_time.default_efficiency` (the calibrated fraction of peak);
- NCCL's ring / tree latency model for data-parallel all-reduces (`allreduce_latency`, the
  foreign recipes' buckets); comm.py holds the multi-rail ring bandwidth and the per-unit
  FSDP latency;
- the device's measured achievable matmul rate against the calibration's reference
  (`matmul_peak_factor`, applied by step_time.default_efficiency).

The 'generation' time model (recipes.schema.Recipe.time_model, selectable, no recipe uses it: see
recipes.schema.FOREIGN_TIME_MODEL for the measurement) replaces the matmul efficiency with
efficiency = GENERATION_EFFICIENCY[generation] x gemm_shape_factor x (FP8_EFFICIENCY if fp8)

- GENERATION_EFFICIENCY: the fraction of the dense 16-bit peak that large, GEMM-dominated
  training runs sustain per GPU (hardware FLOPs, recompute included), from published runs.
  These runs include some exposed communication and bubble, so the planner, which adds both
  on top, errs slightly slow at scale.
- gemm_shape_factor: a GEMM of M x K by K x N in e-byte elements does 2MKN FLOPs on
  e(MK + KN + MN) bytes; below the GPU's ridge point (peak FLOP/s / memory bandwidth) it is
  memory bound and runs at intensity / ridge of peak (the roofline model, Williams et al.
  2009). Small hidden sizes and small micro-batches (few tokens per rank) fall below it.
- FP8_EFFICIENCY: float8 linears reach a smaller fraction of their (2x) peak.
Ignores: wave quantization and tile alignment (a few % on odd shapes), clock throttling,
kernel launch gaps of tiny models (which the shape factor only partly captures).
"""

from __future__ import annotations

import math

from scaletrain.config import HardwareSpec, ModelConfig, compute_bytes

__all__ = [
    "GENERATION_EFFICIENCY",
    "FP8_EFFICIENCY",
    "generation_of",
    "gemm_shape_factor",
    "gemm_factor",
    "matmul_efficiency",
    "allreduce_latency",
    "MAMF_REFERENCE",
    "matmul_peak_factor",
    "COMM_OVERLAP",
    "STATED_OVERLAPS",
]

GENERATION_EFFICIENCY: dict[str, float] = {
    # Shoeybi et al. 2019 (Megatron-LM, arXiv 1909.08053): 8.3B GPT-2 on 512 V100s sustains
    # 15.1 PFLOP/s, 39 TFLOP/s per GPU = 30% of the 125 TFLOP/s fp16 tensor-core peak.
    "v100": 0.30,
    # Narayanan et al. 2021 (arXiv 2104.04473) Table 1: 1T GPT on 3072 A100s, 163 TFLOP/s per
    # GPU (recompute included) = 52% of the 312 TFLOP/s bf16 peak.
    "a100": 0.52,
    # NVIDIA/Megatron-LM README (Megatron-Core performance): up to 47% MFU on H100 clusters
    # for GPT models of 2B-462B parameters.
    "h100": 0.47,
    # H200 has H100's SMs, clocks and tensor-core peak (NVIDIA H200 datasheet: 989 TFLOP/s
    # bf16 dense); GEMM-bound training keeps H100's fraction (more HBM bandwidth only helps
    # memory-bound kernels).
    "h200": 0.47,
    # No published large-run MFU for B200 was found: H100's fraction is assumed.
    "b200": 0.47,
}

FP8_EFFICIENCY = 0.64
"""Fraction of the bf16 efficiency that float8 linears keep against the (2x) fp8 peak:
torchtitan docs/performance.md Table 1 (Llama 3.1 8B, 8 H100, FSDP + compile): 6,667 ->
8,532 TPS/GPU with Float8, a 1.28x speedup on a 2x peak, 1.28 / 2 = 0.64."""

_DEFAULT_GENERATION = "h100"


_ARCH_GENERATION = {(7, 0): "v100", (8, 0): "a100", (9, 0): "h100", (10, 0): "b200"}
"""The data-centre parts of each generation by compute capability (NVIDIA's CUDA GPUs table):
what a device described in TOML under another name plans as."""


def generation_of(hardware: HardwareSpec) -> str:
    """The GPU generation a hardware preset belongs to ('h100-sxm' -> 'h100'); a device of
    another name by its compute capability (a described sm90 part plans as an H100: the
    figures that differ are the ones it states); any other accelerator takes H100's."""
    name = hardware.name.lower()
    for gen in GENERATION_EFFICIENCY:
        if name.startswith(gen):
            return gen
    cap = hardware.arch.capability
    if cap is not None and tuple(cap) in _ARCH_GENERATION:
        return _ARCH_GENERATION[(cap[0], cap[1])]
    return _DEFAULT_GENERATION


def gemm_factor(M: float, K: float, N: float, e: float, ridge: float) -> float:
    """The roofline's fraction of peak for one M x K by K x N GEMM of e-byte elements:
    min(1, intensity / ridge) (the module docstring's gemm_shape_factor, one GEMM)."""
    intensity = 2.0 * M * K * N / (e * (M * K + K * N + M * N))
    return min(1.0, intensity / ridge)


def gemm_shape_factor(
    model: ModelConfig, tokens: float, tp: int, precision: str, hardware: HardwareSpec
) -> float:
    """FLOP-weighted roofline factor of one block's GEMMs (q/k/v, out, MLP in, MLP out) for
    `tokens` rows per rank: sum(flops) / sum(flops / min(1, intensity / ridge))."""
    e = 1.0 if precision == "fp8" else (float(compute_bytes(precision)))
    ridge = hardware.flops(precision) / hardware.memory_bw
    h, kv, f = model.dim, model.kv_dim, model.ffn_dim
    f_in = 2 * f if model.gated_mlp else f
    M = max(1.0, tokens)
    gemms = ((h, (h + 2 * kv) / tp), (h / tp, h), (h, f_in / tp), (f / tp, h))
    flops = slow = 0.0
    for K, N in gemms:
        fl = 2.0 * M * K * N
        flops += fl
        slow += fl / gemm_factor(M, K, N, e, ridge)
    return flops / slow if slow else 1.0


def matmul_efficiency(
    model: ModelConfig, hardware: HardwareSpec, precision: str, tokens: float, tp: int
) -> tuple[float, float]:
    """(efficiency of the plan's precision, efficiency of its 16-bit matmuls) against the
    respective peaks; tokens = rows per rank of one micro-batch (s*b/cp)."""
    base = GENERATION_EFFICIENCY[generation_of(hardware)]
    bf16 = base * gemm_shape_factor(model, tokens, tp, "bf16", hardware)
    if precision != "fp8":
        return (base * gemm_shape_factor(model, tokens, tp, precision, hardware), bf16)
    return base * FP8_EFFICIENCY * gemm_shape_factor(model, tokens, tp, "fp8", hardware), bf16


def allreduce_latency(n: int, intra: float, inter: float, ranks_per_node: int) -> float:
    """Latency term of one all-reduce over n ranks, `ranks_per_node` of them in each node (the
    rest of the group in other nodes), as NCCL's cost model prices it (NVIDIA/nccl
    src/graph/tuning.cc, ncclTopoTuneModel, at 5067397):
    - ring: 2(n-1) steps, of which the 2(nodes-1) that leave a node pay the network latency
      (`inter`) and the others the intra-node latency (`intra`): NCCL's
      (nsteps - nInterSteps) x intraLat + nInterSteps x interLat;
    - double binary tree: 2 ((ppn-1) intra + floor(log2 nodes) inter) (NCCL's tree term; on one
      node it is a chain of ppn ranks);
    the smaller is charged (NCCL picks the algorithm its model finds fastest; trees win from a
    few nodes on, rings inside a node). The per-hop latencies are the preset's (NCCL's own
    hwLatencies are its constants for NVLink/PCIe/network: the preset's stand in for them on
    every device). Ignores: NCCL's base latency per collective (baseLat, 6.6-14 us by protocol),
    the protocol choice (LL / LL128 / Simple), the ring's large-message latency plateau (x1.4
    on sm80+ across nodes, ncclTopoGetAlgoTime), the tree's bandwidth correction for mid-size
    messages (treeCorrectionFactor), CollNet (SHARP) and NVLS-tree across nodes (NVLS inside
    a node: comm.allreduce_seconds)."""
    if n <= 1:
        return 0.0
    ppn = max(1, min(n, ranks_per_node))
    nodes = -(-n // ppn)
    inter_steps = 2 * (nodes - 1)
    ring = (2 * (n - 1) - inter_steps) * intra + inter_steps * inter
    tree = 2.0 * ((ppn - 1) * intra + int(math.log2(nodes)) * inter)
    return min(ring, tree)


# ---- the achievable matmul rate of a device against the calibration's reference ------------

MAMF_REFERENCE = 794.5e12 / 989e12
"""The bf16 maximum achievable matmul FLOP/s (MAMF) of an H100 SXM over its datasheet peak:
794.5 of 989 TFLOP/s = 80.3% (stas00/ml-engineering compute/accelerator/README.md, 'Maximum
Achievable Matmul FLOPS comparison table', BF16, torch 2.7.0+cu126, measured with its
benchmarks/mamf-finder.py; read at 744d01e). The same table's current ("v2": mean of 100
iterations, cache reset) measurement as every preset's `mamf_bf16` (A100, B200, MI300X); its
removed "v1" table read the H100 at 792.1 (80.1%). The default efficiency
(`step_time.default_efficiency`) was read off NVIDIA A100/H100 runs, whose MAMF fractions sit
at 80-87% in the same table: it stands for a device whose largest GEMMs reach this fraction
of peak."""


def matmul_peak_factor(hardware: HardwareSpec) -> float:
    """The share of the reference's achievable matmul rate a device keeps, per unit of its own
    peak: (its measured bf16 MAMF / its bf16 peak) / MAMF_REFERENCE, or 1 for a device with no
    measured MAMF (`HardwareSpec.mamf_bf16` = 0: the reference class). Counts: the gap between
    the datasheet peak (boost clock x units) and what the device's best GEMM library sustains
    (clocks under load, kernel efficiency), measured the same way on every device. Ignores:
    that the gap may differ for the smaller GEMMs of a real model, and by dtype (one bf16
    figure scales every precision)."""
    if hardware.mamf_bf16 <= 0 or "bf16" not in hardware.peak_flops:
        return 1.0
    return hardware.mamf_bf16 / hardware.peak_flops["bf16"] / MAMF_REFERENCE


COMM_OVERLAP: dict[str, tuple[str, ...]] = {
    # NeMo's performance configurations (NVIDIA/NeMo-Framework-Launcher
    # launcher_scripts/conf/training/gpt3/175b_fp8_performance.yaml): ub_tp_comm_overlap: True
    # (Transformer Engine userbuffers split each TP GEMM and pipeline its all-gather /
    # reduce-scatter), overlap_p2p_comm: True (interleaved pipeline sends beside compute),
    # optim.overlap_grad_sync / overlap_param_sync: true ("exposes only one DP communication
    # chunk", NeMo docs features/optimizations/communication_overlap.rst). The gradient
    # reduce-scatter's overlap is every recipe's default already (exposure.exposed_by_family).
    "nemo": ("tp", "pp_p2p", "dp_param_gather"),
    # Megatron-LM's documented training configuration (recipes/defaults.py): the example
    # scripts (examples/llama/train_llama3_8b_h100_fp8.sh DDP_ARGS) pass --overlap-grad-reduce
    # and --overlap-param-gather; megatron/training/arguments.py's --no-overlap-p2p-
    # communication is store_false, so the interleaved schedule overlaps its sends by default
    # (validate_args turns it off for the non-interleaved schedule: 'pp_p2p_interleaved');
    # --tp-comm-overlap is off (store_true, not in the scripts).
    "megatron": ("pp_p2p_interleaved", "dp_param_gather"),
}
"""Communication families a recipe's framework overlaps with compute, by recipe name (a recipe
of that name picks them up; 'pp_p2p_interleaved': pipeline sends only under the interleaved
schedule). The SMs the overlapped NCCL collectives hold are charged on the compute by
overlap_sm.overlap_sm_seconds; Transformer Engine's userbuffers ('tp') are not."""

STATED_OVERLAPS: dict[str, str] = {
    "tp": "tensor-parallel collectives hidden behind the GEMMs they feed (Transformer Engine "
    "userbuffers: Megatron-LM --tp-comm-overlap, store_true, off by default; NeMo "
    "MegatronCommOverlapCallback tp_comm_overlap with a tp_overlap_configs.userbuffers config)",
    "pp_p2p": "pipeline sends beside compute under any schedule (Megatron-LM overlap_p2p_comm)",
    "dp_param_gather": "the distributed optimizer's weight all-gather behind the next step's "
    "forwards (Megatron-LM --overlap-param-gather)",
}
"""Families a run may state it overlaps beyond its recipe's COMM_OVERLAP (`PlanInput.
comm_overlap`; a published row's `layout.comm_overlap`): each is charged as
exposure.exposed_by_family charges that family when a framework overlaps it by default."""
