"""Time-model constants: the attention core by kernel and GPU generation (every recipe), the
matmul efficiency by GPU generation, GEMM shape and precision (the 'generation' time model),
and the communication latency terms that matter at 1,000+ GPUs. Torch-free.

What every recipe uses (step_time.step_time):
- matmuls at `time.step_time.default_efficiency` (the calibrated fraction of peak);
- the attention core as its kernel runs it (`attention_seconds_per_token`): FlashAttention-2
  (torch SDPA, flash-attn 2) at most at the device's attention ceiling (`attention_ceiling`:
  its own measured figure, or FLASH2_HOPPER_EFFICIENCY of peak on Hopper), cuDNN fused
  attention (Megatron-Core, NeMo) at the device's measured cuDNN table where it has one
  (`fused_attention_rates`), a materialized
  core (Megatron-DeepSpeed) at the matmul rate on its full s x s block plus its softmax /
  dropout score traffic over memory bandwidth (NAIVE_SCORE_BYTES);
- NCCL's ring / tree latency model for data-parallel all-reduces (`allreduce_latency`, the
  foreign recipes' buckets); comm.py holds the multi-rail ring bandwidth and the per-unit
  FSDP latency;
- the device's measured achievable matmul rate against the calibration's reference
  (`matmul_peak_factor`, applied by step_time.default_efficiency);
- a recipe that runs its block's elementwise ops as eager kernels (torchtitan without
  torch.compile): their bytes over memory bandwidth (`eager_elementwise_bytes`); under
  torch.compile the bytes Inductor's fused kernels still move (`compiled_elementwise_bytes`);
  Megatron-Core's decoder layer on Transformer Engine (megatron, nemo): the bytes its fused
  norm, bias-dropout-add, activation and RoPE kernels move (`mcore_elementwise_bytes`).

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
from dataclasses import dataclass

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
    "FLASH2_HOPPER_EFFICIENCY",
    "NAIVE_SCORE_BYTES",
    "attention_kernel",
    "attention_ceiling",
    "fused_attention_rates",
    "attention_backward_ceiling",
    "FLASH2_HOPPER_BACKWARD_EFFICIENCY",
    "kernel_ceilings",
    "AttentionCore",
    "attention_seconds_per_token",
    "COMM_OVERLAP",
    "STATED_OVERLAPS",
    "eager_elementwise_bytes",
    "MPT_EAGER_FWD",
    "MPT_EAGER_BWD",
    "mpt_eager_elementwise_bytes",
    "COMPILED_FWD",
    "MCORE_NORM",
    "mcore_elementwise_bytes",
    "COMPILED_BWD",
    "COMPILED_RECOMPUTE",
    "COMPILED_V_REPEAT",
    "compiled_elementwise_bytes",
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

MAMF_REFERENCE = 792.1e12 / 989e12
"""The bf16 maximum achievable matmul FLOP/s (MAMF) of an H100 SXM over its datasheet peak:
792.1 of 989 TFLOP/s = 80.1% (stas00/ml-engineering compute/accelerator/README.md, 'Maximum
Achievable Matmul FLOPS comparison table', measured with its benchmarks/mamf-finder.py, CUDA
12.1). The default efficiency (`step_time.default_efficiency`) was read off NVIDIA A100/H100
runs, whose MAMF fractions sit at 80-86% in the same table: it stands for a device whose
largest GEMMs reach this fraction of peak."""


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


# ---- the attention core: which kernel runs it, at what fraction of peak ---------------------

FLASH2_HOPPER_EFFICIENCY = 0.35
"""Fraction of the bf16 peak FlashAttention-2 reaches on H100/H200: Shah et al. 2024
(FlashAttention-3, arXiv 2407.08608), abstract: "FlashAttention-2 achieving only 35%
utilization on H100 GPUs" (FA2 is written for Ampere's mma.sync and uses neither Hopper's
wgmma nor TMA). torch's SDPA flash backend is FlashAttention-2 (torch docs,
torch.nn.functional.scaled_dot_product_attention), so torch-native frameworks (scaletrain,
torchtitan) and flash-attn 2 users (Nanotron) run it; llm-foundry's MPT benchmarks ran its
Triton flash attention (attn_impl 'triton'), for which no H100 figure was found: it takes this
one. On A100, FA2 reaches
50-73% of peak forward and up to 63% backward (Dao 2023, arXiv 2307.08691, abstract and §4.1),
no lower than the planner's matmul efficiency: there the attention keeps the matmul rate.
The forward's rate: the FA2 bars of the same paper's two forward-pass figures at head dim 128
on an H100 80GB SXM5 (989.4 TFLOP/s bf16 peak) plateau at 335 and 370 TFLOP/s (34% and 37%)
from 8k tokens on (a transcription of the charts' bar labels); the backward's is
FLASH2_HOPPER_BACKWARD_EFFICIENCY."""

FLASH2_HOPPER_BACKWARD_EFFICIENCY = 322.0 / 989.4
"""Fraction of the bf16 peak FlashAttention-2's backward reaches on H100/H200: the
FlashAttention-3 paper (Shah et al. 2024, arXiv 2407.08608, sec. 4.1), its figure "Attention
backward speed, head dim 128 (H100 80GB SXM5)": FA2 at 214, 260, 291, 310, 318, 322 TFLOP/s
for 512 ... 16k tokens (16k tokens per batch, 2048 hidden; the figure's FLOP count is the
forward's x 2.5, as flops.FLASH_BACKWARD_FACTOR), over the H100 SXM5's 989.4 TFLOP/s bf16
dense peak: the 16k plateau, 32.5%, below the forward's FLASH2_HOPPER_EFFICIENCY. The
numbers were read from a transcription of the chart's bar labels (two transcriptions agree on
the FA2 bars), not from a table in the paper's text, and the transcription does not state the
figure's mask (causal or not). Ignores: sequence lengths below the plateau (the planner's
flash core takes one rate), head dims other than 128, the 500 W power cap of some H100s."""

NAIVE_SCORE_BYTES: dict[str, tuple[float, float, float]] = {
    # Megatron(-DeepSpeed) CoreAttention, 16-bit scores: forward the fused scale + causal mask +
    # softmax kernel reads the scores and writes the probabilities (2e; megatron/model/
    # fused_softmax.py ScaledUpperTriangMaskedSoftmax, one kernel each way), the attention
    # dropout reads them and writes its output and a 1-byte mask (2e + 1); backward dropout
    # reads the gradient and the mask and writes the gradient (2e + 1), the fused softmax
    # backward reads the probabilities and the gradient and writes the gradient (3e).
    # (forward, backward, dropout's share of each)
    "megatron": (9.0, 11.0, 5.0),
    # scaletrain's NaiveAttentionCore (models/attention.py), e = 2: forward scale (2e),
    # .float() (e + 4), masked_fill (4 + 4 + 1-byte mask), softmax (4 + 4), .to(e) (4 + e) =
    # 33 B; backward the same ops' gradients: to (e + 4), softmax (4 + 4 + 4), masked_fill
    # (4 + 1 + 4), float (4 + e), scale (2e) = 37 B; no dropout.
    "scaletrain": (33.0, 37.0, 0.0),
}
"""Bytes moved per element of the (b, a, s, s) score tensor by the elementwise kernels of a
naive (materialized) attention core, forward and backward (16-bit scores). These kernels are
memory bound (about 1 FLOP per byte, far below every GPU's ridge point), so they cost bytes /
memory bandwidth on top of the core's matmuls."""


def attention_kernel(recipe: str, recipe_attention: str, model_attention: str) -> str:
    """The kernel family that runs the attention core: 'naive' (materialized s x s scores:
    Megatron-DeepSpeed's default core attention, recipe.attention == 'naive', or a model
    configured naive), 'fused' (Megatron-Core's Transformer Engine DotProductAttention, which
    NeMo runs too; cuDNN fused attention on Hopper: no published shortfall against the matmul
    rate, kept at it; on a device with a measured cuDNN table, the B200, at that table's rates:
    `fused_attention_rates`) or
    'flash2' (torch SDPA's flash backend / flash-attn 2: every other recipe)."""
    if recipe_attention == "naive" or model_attention == "naive":
        return "naive"
    return "fused" if recipe in ("megatron", "nemo") else "flash2"


def attention_ceiling(hardware: HardwareSpec) -> tuple[float, str]:
    """(FLOP/s, where it comes from) of the flash attention core's ceiling on `hardware`
    (0 = none: the core runs at the matmul rate):
    - the device's own measured figure (`HardwareSpec.attention_bf16`, a preset's citation or
      `[hardware] attention_bf16_tflops`);
    - else on an sm90 (Hopper) part FLASH2_HOPPER_EFFICIENCY of its bf16 peak, the H100
      figure of the FlashAttention-3 paper: its cause (FA2 uses neither wgmma nor TMA) holds on
      every sm90 part, so an H200 / H800 / described sm90 device takes the H100's figure;
    - else none: no published figure for the device, the attention keeps its matmul rate (an
      A100's FA2 reaches 50-73% of peak, above it). A non-sm90 part never takes the H100's
      figure, whose cause is Hopper's instructions: the MI300X holds its own (config/
      hardware.py, flash-attn's CK backend, 17.7% of its peak).
    Ignores: the figure's dependence on head dim, sequence length and masking."""
    if hardware.attention_bf16 > 0:
        return hardware.attention_bf16, f"{hardware.name}'s own measured figure"
    cap = hardware.arch.capability
    if cap is not None and cap[0] == 9 and "bf16" in hardware.peak_flops:
        rate = hardware.flops("bf16") * FLASH2_HOPPER_EFFICIENCY
        return rate, (
            "the H100 SXM's published FlashAttention-2 figure, 35% of peak (FlashAttention-3 "
            "paper; its backward 32.5%), taken by every sm90 part"
        )
    return 0.0, "no published figure for this device: the matmul rate"


def attention_backward_ceiling(hardware: HardwareSpec) -> float:
    """FLOP/s ceiling of the flash attention core's backward on `hardware` (0 = none: the
    matmul rate): the device's own measured figure where it has one (`HardwareSpec.
    attention_bf16`, one figure for both passes), else on an sm90 part
    FLASH2_HOPPER_BACKWARD_EFFICIENCY of its bf16 peak (the H100's published FA2 backward,
    taken by every sm90 part as `attention_ceiling` takes its forward), else none."""
    if hardware.attention_bf16 > 0:
        return hardware.attention_bf16
    cap = hardware.arch.capability
    if cap is not None and cap[0] == 9 and "bf16" in hardware.peak_flops:
        return hardware.flops("bf16") * FLASH2_HOPPER_BACKWARD_EFFICIENCY
    return 0.0


def fused_attention_rates(hardware: HardwareSpec, seq_len: int) -> tuple[float, float]:
    """(forward, backward) FLOP/s ceiling of the cuDNN fused attention core on `hardware` at
    `seq_len` (one kernel call's sequence length): the device's measured table
    (`HardwareSpec.fused_attention_bf16`, cited per preset) read linearly in log2(seq_len)
    between its points, the end points held outside them; (0, 0) = no table (the matmul rate).
    Ignores: the batch x heads a call runs (the table's: one sequence, 128 query heads; fewer
    heads fill fewer SMs at short lengths), head dims other than 128, the cuDNN version."""
    table = hardware.fused_attention_bf16
    if not table:
        return 0.0, 0.0
    x = math.log2(max(1, seq_len))
    if x <= math.log2(table[0][0]):
        return table[0][1], table[0][2]
    for (s0, f0, b0), (s1, f1, b1) in zip(table, table[1:]):
        x0, x1 = math.log2(s0), math.log2(s1)
        if x <= x1:
            w = (x - x0) / (x1 - x0)
            return f0 + w * (f1 - f0), b0 + w * (b1 - b0)
    return table[-1][1], table[-1][2]


def kernel_ceilings(hardware: HardwareSpec) -> list[str]:
    """One line per per-device kernel ceiling the time model uses on `hardware`, with where
    its figure comes from (the device's own measurement or another device's): what `explain`
    prints."""
    peak = hardware.peak_flops.get("bf16", 0.0)
    if hardware.mamf_bf16 > 0 and peak > 0:
        gemm = (
            f"GEMM: {hardware.name}'s own measured MAMF {hardware.mamf_bf16 / 1e12:.1f} TFLOP/s "
            f"({hardware.mamf_bf16 / peak:.0%} of peak) -> x{matmul_peak_factor(hardware):.2f} "
            "of the default efficiency"
        )
    else:
        gemm = (
            "GEMM: no MAMF measured for this device: the H100's share of peak (80.1%, "
            "efficiency.MAMF_REFERENCE; the default efficiency was read on A100 / H100 runs)"
        )
    rate, src = attention_ceiling(hardware)
    bwd = attention_backward_ceiling(hardware)
    attn = (
        f"attention (flash): {rate / 1e12:.0f} TFLOP/s"
        + (f" forward, {bwd / 1e12:.0f} backward" if 0 < bwd != rate else "")
        + f", {src}"
        if rate > 0
        else (f"attention (flash): {src}")
    )
    if hardware.fused_attention_bf16:
        f8k, b8k = fused_attention_rates(hardware, 8192)
        attn += (
            f"; attention (cuDNN fused, Megatron / NeMo): {hardware.name}'s own measured "
            f"table by sequence length ({f8k / 1e12:.0f} / {b8k / 1e12:.0f} TFLOP/s forward / "
            "backward at 8192; config/hardware.py cites it)"
        )
    eff = hardware.intra_node_bw_efficiency
    link = (
        f"intra-node collectives: {hardware.intra_node_busbw / 1e9:.0f} GB/s bus bandwidth = "
        f"link {hardware.intra_node_bw / 1e9:.0f} GB/s x {eff:.2f} "
        + (
            "(a published achieved share: config/hardware.py cites it per preset)"
            if eff < 1
            else "(no published achieved share for this device: the raw link figure)"
        )
    )
    if hardware.nvls_allreduce_busbw > 0:
        link += (
            f"; all-reduces inside a node with NVLink SHARP (NCCL's NVLS): "
            f"{hardware.nvls_allreduce_busbw / 1e9:.0f} GB/s bus bandwidth where faster "
            "(time.comm.allreduce_seconds; config/hardware.py cites it)"
        )
    if hardware.intra_node_pair_bw > 0:
        pair = hardware.intra_node_group_busbw(2)
        link += (
            f"; GPUs wired point to point ({hardware.intra_node_pair_bw / 1e9:.0f} GB/s per "
            f"pair, no switch): a group of g < {hardware.gpus_per_node} GPUs reaches its g - 1 "
            f"peers' links only, {pair / 1e9:.0f} GB/s for a pair (HardwareSpec."
            "intra_node_group_busbw, time.comm.axis_link)"
        )
    return [
        gemm,
        attn,
        link,
        "inter-node collectives: the raw NIC figure (no per-device achieved share)",
        "memory-bound kernels: the datasheet HBM bandwidth (no per-device achieved share)",
    ]


@dataclass(kw_only=True, slots=True)
class AttentionCore:
    """One block's attention core as its kernel runs it (`attention_seconds_per_token`).
    Built per timed plan: not frozen (see `comm.CommInputs`), never mutated."""

    kernel: str
    """`attention_kernel`'s answer: 'naive', 'flash2', 'fused', ..."""
    core_flops: float
    """The causal-halved forward FLOPs per token (flops.attention_core_flops_per_token)."""
    heads: int
    seq_len: int
    recompute: bool
    """A forward recompute in backward (activation checkpointing)."""
    dropout: bool
    """The recipe keeps attention dropout (its share of the naive core's score bytes)."""
    kernel_seq_len: int = 0
    """The sequence length one kernel call sees (seq_len / cp: a context-parallel ring runs
    each rank's chunk against one chunk of keys per step); 0 = seq_len. Read only by the
    fused core's measured table (`fused_attention_rates`)."""


def attention_seconds_per_token(
    core: AttentionCore,
    *,
    recipe: str,
    bf16_rate: float,
    hardware: HardwareSpec,
    kernel_efficiency: bool = True,
) -> float:
    """Seconds of one block's attention core per token (all heads; the caller divides by
    tp x cp), forward + backward + a forward recompute when `core.recompute`.

    bf16_rate: the 16-bit matmul rate (peak x matmul efficiency) the attention runs at;
    kernel_efficiency=False (a user-set efficiency) keeps that rate for flash kernels too.
    - flash kernels skip the masked half; their backward recomputes S = QK^T: 5 matmuls against
      the forward's 2 (flops.FLASH_BACKWARD_FACTOR = 2.5). FlashAttention-2 runs its forward
      at most at the device's attention ceiling (`attention_ceiling`: its own measured figure,
      or on Hopper FLASH2_HOPPER_EFFICIENCY of peak), its backward at most at
      `attention_backward_ceiling` (on Hopper FLASH2_HOPPER_BACKWARD_EFFICIENCY), each at most
      at the matmul rate. cuDNN fused
      attention ('fused') runs its forward and backward at the device's measured cuDNN rates
      for the call's sequence length where the preset has them (`fused_attention_rates`: the
      B200's), at most at the matmul rate; else at the matmul rate.
    - naive cores compute the whole s x s block and mask it (2 x the halved count) with a
      backward of 4 matmuls (2 x forward), at the matmul rate, plus NAIVE_SCORE_BYTES per score
      element (a x s per token) over the memory bandwidth; dropout's share only when the
      recipe keeps attention dropout (GPT-2-family models under Megatron's defaults).
    Ignores: kernel launch gaps, the softmax's exp throughput inside flash kernels, GQA's
    smaller K/V reads, the document masks' skipped blocks."""
    from .flops import FLASH_BACKWARD_FACTOR

    kernel, core_flops = core.kernel, core.core_flops
    rc = 1.0 if core.recompute else 0.0
    if kernel != "naive":
        # the forward (and its recompute) and the backward, each at its own rate, each at
        # most the matmul rate
        fwd = bwd = bf16_rate
        if kernel == "fused" and kernel_efficiency and hardware.fused_attention_bf16:
            # the device's measured cuDNN rates for this call's length
            fwd, bwd = fused_attention_rates(hardware, core.kernel_seq_len or core.seq_len)
        elif kernel == "flash2" and kernel_efficiency:
            ceiling, _ = attention_ceiling(hardware)
            fwd = ceiling if ceiling > 0 else fwd
            bwd = attention_backward_ceiling(hardware) or bwd
        fwd, bwd = min(fwd, bf16_rate), min(bwd, bf16_rate)
        return core_flops * ((1.0 + rc) / fwd + FLASH_BACKWARD_FACTOR / bwd)
    fwd_b, bwd_b, drop_b = NAIVE_SCORE_BYTES["scaletrain" if recipe == "scaletrain" else "megatron"]
    if not core.dropout:
        fwd_b, bwd_b = fwd_b - drop_b, bwd_b - drop_b
    score_bytes = (fwd_b * (1.0 + rc) + bwd_b) * core.heads * core.seq_len
    matmul = 2.0 * core_flops * (3.0 + rc) / bf16_rate
    return matmul + score_bytes / hardware.memory_bw


COMM_OVERLAP: dict[str, tuple[str, ...]] = {
    # NeMo's performance configurations (NVIDIA/NeMo-Framework-Launcher
    # launcher_scripts/conf/training/gpt3/175b_fp8_performance.yaml): ub_tp_comm_overlap: True
    # (Transformer Engine userbuffers split each TP GEMM and pipeline its all-gather /
    # reduce-scatter), overlap_p2p_comm: True (interleaved pipeline sends beside compute),
    # optim.overlap_grad_sync / overlap_param_sync: true ("exposes only one DP communication
    # chunk", NeMo docs features/optimizations/communication_overlap.rst). The gradient
    # reduce-scatter's overlap is every recipe's default already (step_time._exposed).
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
comm_overlap`; a published row's `layout.comm_overlap`): each is charged as step_time._exposed
charges that family when a framework overlaps it by default."""


# ---- eager elementwise kernels (torchtitan without torch.compile) ---------------------------

EAGER_BYTES_PER_TOKEN: dict[str, tuple[float, float]] = {
    # bytes per h element: (forward, forward + backward)
    "norms": (72.0, 264.0),  # two unfused RMSNorms on x.float() (fp32 pow/mean/rsqrt/mul)
    "fused_norms": (8.0, 20.0),  # two fused RMSNorm kernels: read x, write y; bwd x, dy -> dx
}
EAGER_REST_FWD = (40.25, 20.0, 10.0)
EAGER_REST_TOTAL = (95.5, 44.0, 28.0)
"""Bytes an eager torchtitan Llama block moves per token in its non-matmul, non-attention aten
kernels (bf16, under FSDP2 mixed precision): RoPE (view_as_complex on q.float() / k.float(), a
complex multiply, .type_as), SiLU and the gate product, the residual adds, their backward, plus
the two RMSNorms (torchtitan/models/llama3/model.py RMSNorm._norm on x.float(); the
fused_rmsnorm option of the April 2024 configs runs one Triton kernel each way instead).
Measured, not assumed: every aten op of such a block (written after torchtitan's model.py)
dispatched under fake tensors, bytes = inputs + outputs of each op that is not a matmul, SDPA
or a view, at 4 shapes (h 512/1024, kv 128/256, f 1024/2048, 2,048 tokens): the counts are
linear in h, kv and f with these coefficients (the per-token constants under 0.1%; Llama 3.1
8B: 1.92 MB per token per block unfused, 0.92 MB with fused norms). Each op is memory bound
(about 1 FLOP per byte, far below every GPU's ridge), so it costs bytes / memory bandwidth.
torch.compile (Inductor) fuses these chains: under compile the fused kernels' own traffic is
charged instead (COMPILED_*, `compiled_elementwise_bytes`)."""


def eager_elementwise_bytes(model: ModelConfig, *, fused_norm: bool, recompute: bool) -> float:
    """Bytes per token per block of the eager elementwise kernels (EAGER_REST_*, norms), forward
    + backward, plus one more forward when the block's elementwise ops are recomputed (full AC;
    torchtitan's op-level SAC saves matmul and SDPA outputs only, so it recomputes them too)."""
    h, kv, f = model.dim, model.kv_dim, model.ffn_dim
    norm_fwd, norm_tot = EAGER_BYTES_PER_TOKEN["fused_norms" if fused_norm else "norms"]
    fwd = EAGER_REST_FWD[0] * h + EAGER_REST_FWD[1] * kv + EAGER_REST_FWD[2] * f + norm_fwd * h
    tot = (
        EAGER_REST_TOTAL[0] * h + EAGER_REST_TOTAL[1] * kv + EAGER_REST_TOTAL[2] * f + norm_tot * h
    )
    return tot + (fwd if recompute else 0.0)


# ---- the fused kernels of a compiled torchtitan Llama block ---------------------------------

COMPILED_FWD = (26.0, 4.0, 6.0)
COMPILED_BWD = (38.0, 4.0, 10.0)
COMPILED_RECOMPUTE = (20.0, 4.0, 2.0)
COMPILED_V_REPEAT = (2.0, 2.0, 0.0)
"""Bytes per token per block, as (per h, per kv, per f element), that Inductor's fused kernels
still move in a torchtitan Llama block compiled per block (torchtitan parallelize_llama.py
`apply_compile` at 9dec370: torch.compile(transformer_block, fullgraph=True), after AC and
before FSDP), 16-bit activations (e = 2 B: 2 per element read, 2 per element written).
Kernel boundaries: a fused kernel cannot fuse through a matmul (aten.mm, cuBLAS) or SDPA (the
flash kernel), so each fused region between them reads from HBM every matmul / SDPA output it
consumes and writes every matmul / SDPA input it produces; counted as a lower bound, one read
of each input and one write of each output per region (per-token reductions in registers).
Regions, from torchtitan/models/llama/model.py at 9dec370 (TransformerBlock.forward,
Attention.forward, apply_rotary_emb, repeat_kv, FeedForward.forward; models/norms.py RMSNorm:
_norm(x.float()).type_as(x) * weight, the fp32 upcast kept in registers):
- forward: attention_norm, read x write xn (4h); RoPE on q and k with repeat_kv of k and v
  (SDPA gets n_heads keys and values: the expand + reshape copy), read q (2h), k, v (2kv + 2kv)
  and write q, k, v at n_heads (6h): 8h + 4kv; the residual add and ffn_norm, read x and wo's
  output, write h1 and hn (8h); SiLU x gate, read w1's and w3's outputs, write the product
  (6f); the block's residual add, read h1 and w2's output, write out (6h). 26h + 4kv + 6f.
- backward: SiLU x gate backward, read dg, w1 and w3 outputs, write both gradients (10f);
  each RMSNorm backward fused with its residual gradient, read the matmul gradients that sum
  into dy (2 after the MLP, 3 after q/k/v), the norm's input and the residual gradient, write
  dx (ffn_norm 10h, attention_norm 12h), and the weight gradient, a reduction over tokens
  (another loop, its own kernel), read dy and the input (2 x 4h); the RoPE backward with
  repeat_kv's sum over the repeated heads, read dq, dk, dv at n_heads (6h), write them at
  q / kv width (2h + 4kv). 38h + 4kv + 10f.
- recompute: under torchtitan's op-level SAC (`_save_list`: mm outputs but every second one,
  SDPA) and full AC, the partitioner recomputes every elementwise op in the backward graph
  (torch/_functorch/partitioners.py must_recompute: PREFER_RECOMPUTE and MUST_RECOMPUTE):
  attention_norm again (4h: wk's recompute and the q/k/v weight gradients read xn), RoPE /
  repeat_kv again (SDPA backward reads q, k, v: 8h + 4kv), the residual add and ffn_norm again
  (h1, hn: 8h), and the SiLU x gate product for w2's weight gradient, fused into the SiLU
  backward kernel that reads the same inputs (its write only: 2f). 20h + 4kv + 2f. Without
  AC the forward's writes are saved instead (the lower bound: the partitioner saves no more).
- COMPILED_V_REPEAT: with as many kv heads as query heads (kv = h) repeat_kv returns v itself
  (no copy): its read and write (2h + 2kv) are not made, in each of forward, recompute and
  backward (the sum of dv).
Ignores: the RoPE table (a per-position read, 8 B per head-dim pair), the norms' fp32 rstd
(a scalar per token), the norm weights, kernels Inductor might split further than this (a
looped reduction reading its row twice at large h, a dy sum materialized for two
consumers: the lower bound assumes not), the fp8 casts of the matmul inputs (charged apart:
fp8_casts, torchao's `fuse_with_prev False` roofline, so the regions still write 16-bit
outputs), the embedding, final norm and loss. Llama 3.1 8B under SAC: 614,400 B per token per
block, against 2.54 MB eager (`eager_elementwise_bytes`, with its recompute). Each kernel is
memory bound (a few FLOPs per byte): bytes / memory bandwidth."""


def compiled_elementwise_bytes(model: ModelConfig, *, recompute: bool) -> float:
    """Bytes per token per block of the fused elementwise kernels of a compiled torchtitan
    Llama block (COMPILED_*), forward + backward, plus the recomputed regions under AC
    (selective per-op or full: both recompute every elementwise op in the backward graph).
    Source: torchtitan/models/llama/model.py and parallelisms/parallelize_llama.py (_save_list,
    apply_compile) at 9dec370; torch/_functorch/partitioners.py must_recompute."""
    h, kv, f = model.dim, model.kv_dim, model.ffn_dim
    passes = 3.0 if recompute else 2.0  # forward, backward, and the recompute
    parts = [COMPILED_FWD, COMPILED_BWD] + ([COMPILED_RECOMPUTE] if recompute else [])
    total = sum(c[0] * h + c[1] * kv + c[2] * f for c in parts)
    if kv >= h:  # no GQA: repeat_kv(v) is v itself
        total -= passes * (COMPILED_V_REPEAT[0] * h + COMPILED_V_REPEAT[1] * kv)
    return total


# ---- eager elementwise kernels of llm-foundry's MPT block ------------------------------------

MPT_EAGER_FWD = (20.0, 4.0)
MPT_EAGER_BWD = (50.0, 6.0)
"""Bytes per token an MPT block (llm-foundry, 16-bit stream under amp_bf16 with FSDP's bf16
parameters) moves in its non-matmul, non-attention kernels, as (per h element, per ffn
element), forward and backward. Counted from the source, one kernel per op, e = 2 B
(mosaicml/llm-foundry at 061f2c7, the benchmark README's commit):
- forward (llmfoundry/models/layers/blocks.py MPTBlock.forward): norm_1 and norm_2 are
  LPLayerNorm (norm.py; submit_benchmarks.py mod_parameters sets norm_type
  'low_precision_layernorm'): F.layer_norm on the 16-bit input, read x and write y, 2 x 4h;
  the two residual adds x + b, read 2 x 2h and write 2h, 2 x 6h; MPTMLP's nn.GELU
  (ffn.py, approximate='none') reads and writes f elements, 4f. resid_pdrop 0.0
  (configuration_mpt.py) makes both nn.Dropout calls return their input. 20h + 4f.
- backward: GELU backward reads dy and x and writes dx, 6f; each F.layer_norm backward reads
  dy and x and writes dx (6h) and its weight/bias gradient kernel reads dy and x again (4h),
  2 x 10h; each residual branch's dx is added to the skip path's gradient, read 4h and write
  2h, 2 x 6h; attention.py splits the Wqkv output with qkv.split, whose backward concatenates
  dq, dk, dv into one (b, s, 3h) gradient, read 6h and write 6h, 12h; the Triton flash
  attention backward (layers/flash_attn_triton.py _flash_attn_backward) accumulates dq in an
  fp32 buffer (dq_accum) and copies it into dq, read 4h and write 2h, 6h. 50h + 6f.
Ignores: the per-token fp32 mean / rstd of the norms, the embedding and the final norm, the
loss (flash-attn's fused cross-entropy, one kernel each way over the 16-bit logits), and the
gradient-clipping and optimizer passes. Each kernel is memory bound (about 1 FLOP per byte), so
it costs bytes / memory bandwidth: per FLOP it costs an H100 (3.35 TB/s for 989 TFLOP/s bf16)
about 1.9 times what it costs an A100 (2.04 TB/s for 312 TFLOP/s)."""


def mpt_eager_elementwise_bytes(model: ModelConfig, *, recompute: bool) -> float:
    """Bytes per token per block of an MPT block's eager elementwise kernels (MPT_EAGER_*),
    forward + backward, plus the forward again when the block is recomputed (llm-foundry's
    activation checkpointing wraps whole MPTBlocks: modeling_mpt.py
    activation_checkpointing_fn)."""
    h, f = model.dim, model.ffn_dim
    fwd = MPT_EAGER_FWD[0] * h + MPT_EAGER_FWD[1] * f
    bwd = MPT_EAGER_BWD[0] * h + MPT_EAGER_BWD[1] * f
    return fwd * (2.0 if recompute else 1.0) + bwd


# ---- the fused kernels of a Megatron-Core block on Transformer Engine ------------------------

MCORE_NORM = (4.0, 12.0)
MCORE_RESIDUAL = (6.0, 0.0)
MCORE_DROPOUT = (1.0, 5.0)
MCORE_BIAS_GRAD = (0.0, 2.0)
MCORE_ROPE = (4.0, 4.0)
MCORE_Q_COPY = (4.0, 0.0)
MCORE_V_COPY = (4.0, 0.0)
MCORE_QKV_CAT = (0.0, 4.0)
MCORE_GATED_ACT = (6.0, 10.0)
MCORE_ACT = (4.0, 6.0)
MCORE_FP8_NORM_OUT = 1.0
"""Bytes per token per block, as (forward, backward) per element, that the non-GEMM,
non-attention kernels of a Megatron-Core decoder layer built with Transformer Engine's spec
move (megatron/core/models/gpt/gpt_layer_specs.py: TELayerNormColumnParallelLinear for QKV and
fc1, TERowParallelLinear for proj and fc2, TEDotProductAttention), 16-bit activations (e = 2 B).
Read at NVIDIA/Megatron-LM d98e8a6 and NVIDIA/TransformerEngine d0067d0; the fusion flags are
Megatron-LM's defaults (megatron/training/arguments.py --no-bias-swiglu-fusion,
--no-bias-gelu-fusion, --no-bias-dropout-fusion, --no-rope-fusion are store_false) and NeMo's
(nemo/collections/llm/gpt/model/llama.py LlamaConfig / Llama3Config: bias_activation_fusion,
bias_dropout_fusion, apply_rope_fusion True, hidden_dropout 0.0; the 2024 NeMo-Framework-
Launcher configs of the NeMo H100 rows, launcher_scripts/conf/training/llama/llama3_8b.yaml:
mcore_gpt, apply_rope_fusion and bias_activation_fusion true, hidden_dropout 0.0,
bias_dropout_add_fusion false, whose unfused path, fused_bias_dropout.py
bias_dropout_add_unfused, is with dropout 0 one eager add moving the same bytes; gpt3/
175b_fp8_performance.yaml: hidden_dropout 0.1, bias_dropout_add_fusion True). Per element of
the width named:
- MCORE_NORM (per h, each of the two norms): the norm runs inside the next GEMM's module
  (transformer_engine/pytorch/module/layernorm_linear.py _LayerNormLinear.forward:
  apply_normalization reads the input and writes ln_out, which it saves for the wgrad GEMM
  with the input, mu and rsigma): read 2, write 2. Backward (_LayerNormLinear.backward:
  tex.rmsnorm_bwd / tex.layernorm_bwd) reads the dgrad GEMM's output and the saved input and
  writes dx (6; gamma's gradient from per-block partial sums), and autograd sums dx into the
  residual stream's gradient (the layer input feeds the norm and the bias-dropout-add's
  residual: read 2 + 2, write 2): 12.
- MCORE_FP8_NORM_OUT (per h, each norm): under fp8 the norm writes its output quantized
  (`with_quantized_norm`: 1 B, not 2); the fp8 transpose of that output is charged in
  fp8_casts.CAST_BYTES['transformer_engine'].normed_input, not here.
- MCORE_RESIDUAL (per h, each of the two bias-dropout-adds): megatron/core/fusions/
  fused_bias_dropout.py bias_dropout_add_fused_train (`jit_fuser`: torch.compile from torch
  2.2, megatron/core/jit.py) reads the branch output and the residual and writes the sum, one
  kernel (the bias broadcast is a per-channel read): 6. Its backward hands the output gradient
  to both inputs (no kernel).
- MCORE_DROPOUT (per h, each bias-dropout-add, hidden dropout > 0: the GPT-family recipes,
  Recipe.dropout_masks): the 1-byte mask written (1); backward reads the gradient and the mask
  and writes the branch's gradient (5).
- MCORE_BIAS_GRAD (per h for each bias-dropout-add, per f for a GELU MLP's fc1, when the
  linears have biases): the bias gradient is a reduction over tokens reading the 16-bit
  gradient once (2).
- MCORE_ROPE (per q and per kv element): megatron/core/models/common/embeddings/rope_utils.py
  apply_rotary_pos_emb with apply_rope_fusion calls TE's FusedRoPEFunc
  (transformer_engine/pytorch/attention/rope.py: tex.fused_rope_forward reads t, writes a new
  tensor; tex.fused_rope_backward reads the gradient, writes a new one): 4 each way.
- MCORE_Q_COPY (per q element, GQA only): megatron/core/transformer/attention.py
  SelfAttention.get_query_key_value_tensors splits the fused QKV output per query group
  (SplitAlongDim: views) and `query.reshape(s, b, -1, d)` cannot view a group's heads merged
  across groups when a group holds more than one query head (the group stride is (q/g + 2)
  heads): a copy, 4. Its backward is a view.
- MCORE_V_COPY (per kv element, RoPE models): q and k come out of the RoPE kernel as new
  tensors while v stays a strided slice of the QKV output; TE's get_qkv_layout
  (transformer_engine/pytorch/attention/dot_product_attention/utils.py) finds k's and v's
  strides unequal ('not_supported') and makes q, k, v contiguous: v is copied, 4.
- MCORE_QKV_CAT (per q + 2 kv elements, RoPE models): the backward of SplitAlongDim
  (transformer_engine/pytorch/utils.py SplitAlongDim.backward) concatenates dq, dk, dv into the
  fused QKV gradient unless they already sit at their offsets of one buffer, which the RoPE
  backward's new tensors do not: torch.cat, read 2, write 2. Without RoPE (GPT) q, k, v reach
  the attention as the packed 'sbh3d' layout and come back as views of one gradient: neither
  copy is made.
- MCORE_GATED_ACT (per f): megatron/core/fusions/fused_bias_swiglu.py BiasSwiGLUFunction:
  bias_swiglu reads the 2f-wide fc1 output and writes f (6); swiglu_back reads the gradient
  (f) and the saved input (2f) and writes the 2f-wide gradient (10).
- MCORE_ACT (per f): fused_bias_gelu.py GeLUFunction: bias_gelu reads y (the bias is a
  per-channel read) and writes the output (4); bias_gelu_back reads g and y and writes the
  gradient (6), which autograd also reduces into the bias gradient (MCORE_BIAS_GRAD).
Recompute: full AC (megatron/core/transformer/transformer_block.py _checkpointed_forward)
runs the forward again: the forward's bytes again. Selective AC ('core_attn') recomputes the
attention core only: nothing here.
Ignores: the RoPE frequency table and norm weights (per channel or per position), a gated
MLP's fc1 bias gradient (BiasSwiGLUFunction's bias path, not read: Llama-style blocks have no
biases), mu and
rsigma (a scalar per token), the norm's gamma-gradient finalisation (per channel), the fp8
casts of GEMM inputs and output gradients (fp8_casts), the sequence-parallel all-gather and
reduce-scatter of the norm input and proj / fc2 output (communication terms), context
parallelism's K/V exchange buffers, the embedding, final norm and loss, and any TE kernel
fusing more than these (e.g. TE's fused QKV RoPE, `FusedQKVRoPEFunc`, newer than the
published runs): a lower bound, one read per input and one write per output per kernel.
Not the block it counts: NeMo 2's GPTConfig175B (nemo/collections/llm/gpt/model/base.py:
use_transformer_engine_full_layer_spec, hidden_dropout 0.0) runs TE's own TransformerLayer,
whose LayerNormMLP fuses the GELU with its fp8 cast; NeMo's Nemotron runs an unfused squared
ReLU (nemo/collections/llm/gpt/model/nemotron.py); both are charged as this block.
Llama 3 8B under fp8: 58h + 20kv + 16f = 487,424 B per token per block; Llama 2 7B (MHA)
74h + 16f = 479,232 B. Each kernel is memory bound (a few FLOPs per byte): bytes / memory
bandwidth."""


def mcore_elementwise_bytes(
    model: ModelConfig, *, fp8_norm_out: bool, dropout: bool, recompute: bool
) -> float:
    """Bytes per token per block of a Megatron-Core / Transformer Engine decoder layer's fused
    non-GEMM, non-attention kernels (MCORE_*), forward + backward, plus the forward again
    under full AC (`recompute`). fp8_norm_out: the norms write their output in fp8
    (Transformer Engine's fp8 LayerNormLinear); dropout: hidden dropout is on (1-byte masks).
    Source: megatron/core/transformer (transformer_layer.py, attention.py, mlp.py),
    megatron/core/fusions (fused_bias_dropout.py, fused_bias_swiglu.py, fused_bias_gelu.py),
    TransformerEngine module/layernorm_linear.py, attention/rope.py, utils.py SplitAlongDim."""
    h, q, kv, f = model.dim, model.q_dim, model.kv_dim, model.ffn_dim
    parts: list[tuple[tuple[float, float], float]] = [
        (MCORE_NORM, 2.0 * h),
        (MCORE_RESIDUAL, 2.0 * h),
        (MCORE_GATED_ACT if model.gated_mlp else MCORE_ACT, float(f)),
    ]
    if dropout:
        parts.append((MCORE_DROPOUT, 2.0 * h))
    if model.bias:
        parts.append((MCORE_BIAS_GRAD, 2.0 * h + (0.0 if model.gated_mlp else f)))
    if model.position == "rope":
        parts += [
            (MCORE_ROPE, float(q + kv)),
            (MCORE_V_COPY, float(kv)),
            (MCORE_QKV_CAT, float(q + 2 * kv)),
        ]
        if kv < q:
            parts.append((MCORE_Q_COPY, float(q)))
    fwd = sum(c[0] * n for c, n in parts)
    bwd = sum(c[1] * n for c, n in parts)
    if fp8_norm_out:
        fwd -= MCORE_FP8_NORM_OUT * 2.0 * h
    return bwd + fwd * (2.0 if recompute else 1.0)
