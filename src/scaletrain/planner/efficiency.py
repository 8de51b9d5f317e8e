"""Time-model constants for the framework recipes: achievable matmul efficiency by GPU
generation, GEMM shape and precision, and the communication terms that matter at 1,000+ GPUs.

Used by the foreign recipes (recipes.Recipe.time_model == 'generation'); the default
`scaletrain` recipe keeps `estimate.default_efficiency` and its calibration unchanged.
Torch-free.

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

from scaletrain.config import HardwareSpec, ModelConfig

__all__ = ["GENERATION_EFFICIENCY", "FP8_EFFICIENCY", "generation_of", "gemm_shape_factor",
           "matmul_efficiency", "allreduce_latency", "TREE_ALLREDUCE_MIN_RANKS"]

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


def generation_of(hardware: HardwareSpec) -> str:
    """The GPU generation a hardware preset belongs to ('h100-sxm' -> 'h100'); an unknown
    accelerator takes H100's figures."""
    name = hardware.name.lower()
    for gen in GENERATION_EFFICIENCY:
        if name.startswith(gen):
            return gen
    return _DEFAULT_GENERATION


def _gemm_factor(M: float, K: float, N: float, e: float, ridge: float) -> float:
    intensity = 2.0 * M * K * N / (e * (M * K + K * N + M * N))
    return min(1.0, intensity / ridge)


def gemm_shape_factor(model: ModelConfig, tokens: float, tp: int, precision: str,
                      hardware: HardwareSpec) -> float:
    """FLOP-weighted roofline factor of one block's GEMMs (q/k/v, out, MLP in, MLP out) for
    `tokens` rows per rank: sum(flops) / sum(flops / min(1, intensity / ridge))."""
    e = 1.0 if precision == "fp8" else (4.0 if precision == "fp32" else 2.0)
    ridge = hardware.flops(precision) / hardware.memory_bw
    h, kv, f = model.dim, model.kv_dim, model.ffn_dim
    f_in = 2 * f if model.activation == "swiglu" else f
    M = max(1.0, tokens)
    gemms = ((h, (h + 2 * kv) / tp), (h / tp, h), (h, f_in / tp), (f / tp, h))
    flops = slow = 0.0
    for K, N in gemms:
        fl = 2.0 * M * K * N
        flops += fl
        slow += fl / _gemm_factor(M, K, N, e, ridge)
    return flops / slow if slow else 1.0


def matmul_efficiency(model: ModelConfig, hardware: HardwareSpec, precision: str,
                      tokens: float, tp: int) -> tuple[float, float]:
    """(efficiency of the plan's precision, efficiency of its 16-bit matmuls) against the
    respective peaks; tokens = rows per rank of one micro-batch (s*b/cp)."""
    base = GENERATION_EFFICIENCY[generation_of(hardware)]
    bf16 = base * gemm_shape_factor(model, tokens, tp, "bf16", hardware)
    if precision != "fp8":
        return (base * gemm_shape_factor(model, tokens, tp, precision, hardware), bf16)
    return base * FP8_EFFICIENCY * gemm_shape_factor(model, tokens, tp, "fp8", hardware), bf16


TREE_ALLREDUCE_MIN_RANKS = 16
"""NCCL switches small and mid-size all-reduces to its double binary tree as rank counts grow
(NVIDIA blog 'Massively Scale Your Deep Learning Training with NCCL 2.4', 2019: trees give
logarithmic latency where rings are linear); below about two nodes the ring is kept."""


def allreduce_latency(n: int, alpha: float) -> float:
    """Latency term of an all-reduce over n ranks: ring 2(n-1)alpha, double binary tree
    2 log2(n) alpha (Sanders et al. 2009); NCCL picks the tree at scale."""
    if n <= 1:
        return 0.0
    ring = 2.0 * (n - 1) * alpha
    if n < TREE_ALLREDUCE_MIN_RANKS:
        return ring
    return min(ring, 2.0 * math.ceil(math.log2(n)) * alpha)
