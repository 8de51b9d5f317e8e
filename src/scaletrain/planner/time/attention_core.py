"""The attention core as its kernel runs it: which kernel runs it, at what fraction of peak, by
GPU generation and device, and the per-device kernel ceilings `explain` prints. Torch-free.

What every recipe uses (step_time.step_time): the attention core as its kernel runs it
(`attention_seconds_per_token`): FlashAttention-2 (torch SDPA, flash-attn 2) at most at the
device's attention ceiling (`attention_ceiling`: its own measured figure, or
FLASH2_HOPPER_EFFICIENCY of peak on Hopper), cuDNN fused attention (Megatron-Core, NeMo) at the
device's measured cuDNN table where it has one (`fused_attention_rates`), llm-foundry's Triton
flash attention at FlashAttention-1's published rate (`triton_flash1_rates`), a materialized
core (Megatron-DeepSpeed) at the matmul rate on its full s x s block plus its softmax /
dropout score traffic over memory bandwidth (NAIVE_SCORE_BYTES).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaletrain.config import HardwareSpec

from .efficiency import matmul_peak_factor
from .fp8_casts import fp8_gemm_share

__all__ = [
    "FLASH2_HOPPER_EFFICIENCY",
    "NAIVE_SCORE_BYTES",
    "attention_kernel",
    "attention_ceiling",
    "fused_attention_rates",
    "attention_backward_ceiling",
    "FLASH2_HOPPER_BACKWARD_EFFICIENCY",
    "FLASH1_AMPERE_EFFICIENCY",
    "FLASH2_OVER_FLASH1",
    "triton_flash1_rates",
    "kernel_ceilings",
    "AttentionCore",
    "attention_seconds_per_token",
]

FLASH2_HOPPER_EFFICIENCY = 0.35
"""Fraction of the bf16 peak FlashAttention-2 reaches on H100/H200: Shah et al. 2024
(FlashAttention-3, arXiv 2407.08608), abstract: "FlashAttention-2 achieving only 35%
utilization on H100 GPUs" (FA2 is written for Ampere's mma.sync and uses neither Hopper's
wgmma nor TMA). torch's SDPA flash backend is FlashAttention-2 (torch docs,
torch.nn.functional.scaled_dot_product_attention), so torch-native frameworks (scaletrain,
torchtitan) and flash-attn 2 users (Nanotron) run it; llm-foundry's MPT benchmarks ran their
Triton flash attention (attn_impl 'triton'), a FlashAttention-1-class kernel
(`triton_flash1_rates`). On A100, FA2 reaches
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
    # Hugging Face transformers GPT2Attention._attn (models/gpt2/modeling_gpt2.py, read at
    # 0010f602), every op its own eager kernel on 16-bit scores (DeepSpeed's fp16 engine halves
    # the module): forward the scale division (2e), torch.where with the causal-mask slice of
    # the bool `bias` buffer (e + 1 + e), the additive padding mask run_clm's collator passes
    # (2e; the (b, 1, 1, s) mask itself is negligible), softmax (2e), attn_dropout (2e + 1) =
    # 22 B; backward dropout (reads the gradient and the mask, writes the gradient: 2e + 1),
    # softmax backward (3e), where backward (e + 1 + e), the division's (2e) = 20 B; the mask
    # add passes its gradient on (no kernel). Dropout's share 2e + 1 each way.
    "hf_gpt2": (22.0, 20.0, 5.0),
}
"""Bytes moved per element of the (b, a, s, s) score tensor by the elementwise kernels of a
naive (materialized) attention core, forward and backward (16-bit scores). These kernels are
memory bound (about 1 FLOP per byte, far below every GPU's ridge point), so they cost bytes /
memory bandwidth on top of the core's matmuls."""


FLASH1_AMPERE_EFFICIENCY = 124.0 / 312.0
"""Fraction of the bf16 peak FlashAttention-1 reaches on an A100 (sm80): "up to 124 TFLOPs/s on
A100 GPU", the top of its "25-40% of the theoretical maximum FLOPs/s" (Tri Dao's FlashAttention-2
release post, 2023-07-17, read through a mirror of its blog/2023-07-17-flash2 page; the
FlashAttention-2 paper's abstract, arXiv 2307.08691, gives the same 25-40%), over the A100's
312 TFLOP/s dense bf16 peak: 39.7%. The kernel it stands for is llm-foundry's Triton flash
attention (`triton_flash1_rates`), whose own header (mosaicml/llm-foundry at 061f2c7, the MPT
benchmark README's commit, llmfoundry/models/layers/flash_attn_triton.py, copied from
HazyResearch/flash-attention eff9fe6 flash_attn/flash_attn_triton.py onto triton_pre_mlir) says:
its forward is generally faster and its backward generally slower than the CUDA FlashAttention
(1), forward + backward "slightly slower"; tested only on A100. So the figure is an upper bound
on that kernel's rate. One figure for both passes: the source does not split them."""

FLASH2_OVER_FLASH1 = 230.0 / 124.0
"""FlashAttention-2's speed over FlashAttention-1's on the same A100: the release post's two
maxima, "up to 230 TFLOPs/s" against "up to 124 TFLOPs/s" (1.85; the paper's abstract: "around
2x speedup compared to FlashAttention"). Used to carry a device's FA2 figure to the
FlashAttention-1-class Triton kernel where no FA1 figure was published for the device (H100):
an assumption that the two keep their A100 ratio there (neither FA1 nor this kernel has a
published H100 figure that was found; FA2 itself uses none of Hopper's new instructions, see
FLASH2_HOPPER_EFFICIENCY)."""


def triton_flash1_rates(hardware: HardwareSpec) -> tuple[float, float, str]:
    """(forward FLOP/s, backward FLOP/s, where from) of llm-foundry's Triton flash attention
    (`attention_kernel` 'triton_flash1'; 0 = no figure, the matmul rate), taken as rates of the
    FLOPs the planner counts (causal half, backward 2.5 x forward: flops.FLASH_BACKWARD_FACTOR,
    the convention of flash-attn's benchmarks/benchmark_flash_attention.py `flops`; the post
    does not state its figure's mask or pass):
    - an sm80 part (A100): FLASH1_AMPERE_EFFICIENCY of its bf16 peak, both passes;
    - a part with an FA2 figure (`attention_ceiling` / `attention_backward_ceiling`: Hopper's
      FLASH2_HOPPER_*, a device's own `attention_bf16`): that figure / FLASH2_OVER_FLASH1;
    - else none.
    Ignores: head dims other than 64 / 128 (the kernel's tested ones), sequence length (the
    published figures are maxima), the Triton compiler version (triton_pre_mlir)."""
    cap = hardware.arch.capability
    if cap is not None and tuple(cap) == (8, 0) and "bf16" in hardware.peak_flops:
        rate = hardware.flops("bf16") * FLASH1_AMPERE_EFFICIENCY
        return (
            rate,
            rate,
            (
                "FlashAttention-1's published A100 figure, up to 124 TFLOP/s (FlashAttention-2 "
                "release post), an upper bound for the Triton kernel"
            ),
        )
    fwd, _ = attention_ceiling(hardware)
    bwd = attention_backward_ceiling(hardware)
    if fwd > 0:
        return (
            fwd / FLASH2_OVER_FLASH1,
            (bwd or fwd) / FLASH2_OVER_FLASH1,
            (
                "this device's FlashAttention-2 figure / 1.85 (FA2 over FA1 on A100, "
                "FlashAttention-2 release post)"
            ),
        )
    return 0.0, 0.0, "no published figure for this device: the matmul rate"


def attention_kernel(recipe: str, recipe_attention: str, model_attention: str) -> str:
    """The kernel family that runs the attention core: 'naive' (materialized s x s scores:
    Megatron-DeepSpeed's default core attention, recipe.attention == 'naive', or a model
    configured naive), 'fused' (Megatron-Core's Transformer Engine DotProductAttention, which
    NeMo runs too; cuDNN fused attention on Hopper: no published shortfall against the matmul
    rate, kept at it; on a device with a measured cuDNN table, the B200, at that table's rates:
    `fused_attention_rates`) or
    'triton_flash1' (llm-foundry: the MPT benchmarks' attn_impl 'triton', scripts/train/
    benchmarking/submit_benchmarks.py --attn_impl default at 061f2c7, layers/attention.py
    triton_flash_attn_fn over flash_attn_triton.py, a FlashAttention-1-class kernel:
    `triton_flash1_rates`) or 'flash2' (torch SDPA's flash backend / flash-attn 2: every other
    recipe)."""
    if recipe_attention == "naive" or model_attention == "naive":
        return "naive"
    if recipe == "llm-foundry":
        return "triton_flash1"
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
            "GEMM: no MAMF measured for this device: the H100's share of peak (80.3%, "
            "efficiency.MAMF_REFERENCE; the default efficiency was read on A100 / H100 runs)"
        )
    if "fp8" in hardware.peak_flops:
        own = hardware.fp8_mamf_share > 0
        gemm += (
            f"; fp8 GEMMs keep {fp8_gemm_share(hardware):.3f} of it against the fp8 peak ("
            + (
                f"{hardware.name}'s own fp8 / bf16 measurement"
                if own
                else "its generation's MAMF tables, fp8_casts.FP8_MAMF_SHARE"
            )
            + ")"
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
    scores: str = ""
    """The NAIVE_SCORE_BYTES key of a naive core's score kernels (Recipe.naive_scores); empty:
    scaletrain's own core under its recipe, Megatron's fused softmax under the others."""
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
      at the matmul rate; llm-foundry's Triton kernel ('triton_flash1') at
      `triton_flash1_rates`, at most at the matmul rate. cuDNN fused
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
        elif kernel == "triton_flash1" and kernel_efficiency:
            # llm-foundry's Triton kernel at FlashAttention-1's published rate
            f1, b1, _ = triton_flash1_rates(hardware)
            fwd, bwd = f1 or fwd, b1 or bwd
        fwd, bwd = min(fwd, bf16_rate), min(bwd, bf16_rate)
        return core_flops * ((1.0 + rc) / fwd + FLASH_BACKWARD_FACTOR / bwd)
    key = core.scores or ("scaletrain" if recipe == "scaletrain" else "megatron")
    fwd_b, bwd_b, drop_b = NAIVE_SCORE_BYTES[key]
    if not core.dropout:
        fwd_b, bwd_b = fwd_b - drop_b, bwd_b - drop_b
    score_bytes = (fwd_b * (1.0 + rc) + bwd_b) * core.heads * core.seq_len
    matmul = 2.0 * core_flops * (3.0 + rc) / bf16_rate
    return matmul + score_bytes / hardware.memory_bw
