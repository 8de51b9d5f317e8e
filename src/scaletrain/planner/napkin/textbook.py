"""Napkin math: the textbook formulas of the domain seeds, each with its source and what it ignores.

These are the back-of-envelope models a learner checks by hand (the seeds in the project
workspace: seed 000 and 003's memory walk-throughs, seed 002's playbook, seed 004's "Napkin
Math" boxes), kept apart from the planner's exact model (`planner.memory`,
`planner.recipes`), which they never change. `scaletrain napkin ...` and `explain --convention`
print them. Torch-free; every function is pure arithmetic.

Units: bytes, seconds, FLOPs; GB = 1e9 bytes (the seeds' GB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaletrain.config import GB, ConfigError, HardwareSpec, compute_bytes, fmt_bytes

from ..types import Estimate

__all__ = [
    "capacity_gb_text",
    "Convention",
    "CONVENTIONS",
    "convention",
    "state_bytes",
    "korthikanti_layer_bytes",
    "checkpoint_memory",
    "sqrt_checkpoints",
    "quantization",
    "gemm_waves",
    "alignment",
    "SM_COUNTS",
    "textbook_lines",
    "verdict_difference",
    "ring_allreduce",
    "layer_gemm_flops",
]


def capacity_gb_text(hardware: HardwareSpec) -> str:
    """A card's capacity in the napkin's unit, decimal GB, beside the binary figure the rest of
    scaletrain prints it in (`config.units`): '34.1 GB = 31.74 GiB' on a V100 32GB."""
    cap = hardware.memory_bytes
    return f"{cap / GB:.1f} GB = {fmt_bytes(cap, digits=2)}"


@dataclass(frozen=True)
class Convention:
    """Bytes per parameter of the model + optimizer state under one textbook convention."""

    bytes_per_param: int
    weights: float
    """16-bit (or fp32) working weights."""
    grads: float
    """Gradient copies that ZeRO-2 shards (16-bit grads, or fp32 main grads)."""
    optimizer: float
    """What ZeRO-1 shards: fp32 master weights, fp32 grad copy kept by the optimizer, Adam m
    and v (fp32)."""
    terms: str
    source: str


_CONVENTIONS: dict[tuple[int, str], Convention] = {
    (12, "mixed"): Convention(
        12,
        2,
        2,
        8,
        "fp16 weights 2 + fp16 grads 2 + Adam m,v fp32 8 (no master copy)",
        "seed 000 (20B: 40 + 40 + 160 = 240 GB), seed 004 Napkin Math 1.3/1.4 "
        "(7B: 14 + 14 + 56 = 84 GB); seed 002's k=12 is the 16 B convention",
    ),
    (16, "mixed"): Convention(
        16,
        2,
        2,
        12,
        "fp16 weights 2 + fp16 grads 2 + fp32 master 4 + Adam m,v 8",
        "seed 003 sec. 20.1 (2P + 2P + 12P = 16P; 7B -> 112 GB), seed 004 Napkin Math 1.6, "
        "ZeRO (Rajbhandari et al. 2020, sec. 3.1: K = 12)",
    ),
    (16, "fp32"): Convention(
        16,
        4,
        4,
        8,
        "fp32 weights 4 + fp32 grads 4 + Adam m,v 8",
        "seed 002 I.A.1 (FP32 baseline 16 psi), seed 004 Napkin Math 1.2 (1.5B: 6 + 6 + 12 "
        "= 24 GB)",
    ),
    (18, "mixed"): Convention(
        18,
        2,
        4,
        12,
        "bf16 weights 2 + fp32 main grads 4 + fp32 master 4 + Adam m,v 8",
        "Megatron-LM docs, distributed optimizer: bf16 params with fp32 grads = 18 B/param, "
        "6 + 12/d with the distributed optimizer (the seeds give no 18 B example)",
    ),
    (20, "mixed"): Convention(
        20,
        2,
        2,
        16,
        "bf16 weights 2 + bf16 grads 2 + fp32 master 4 + fp32 grads 4 + Adam m,v 8",
        "seed 002 I.A.2 (mixed precision with fp32 gradients, 20 psi); ZeRO-1 "
        "shards the fp32 grad copy with the optimizer as Megatron's 4 + 16/d does",
    ),
}
CONVENTIONS = (12, 16, 18, 20)


def convention(bytes_per_param: int, precision: str = "bf16") -> Convention:
    """The convention of `bytes_per_param` bytes; fp32 training picks 16's all-fp32 split."""
    if bytes_per_param not in CONVENTIONS:
        raise ConfigError(
            "--convention",
            bytes_per_param,
            f"use one of {', '.join(map(str, CONVENTIONS))} (bytes per parameter)",
        )
    kind = "fp32" if precision == "fp32" else "mixed"
    if kind == "fp32" and bytes_per_param != 16:
        raise ConfigError(
            "--convention",
            bytes_per_param,
            "fp32 training is the 16 B convention (4 + 4 + 8); use 16 or --precision bf16/fp16",
        )
    return _CONVENTIONS[(bytes_per_param, kind)]


def state_bytes(
    params: float, conv: Convention, *, zero: int = 0, shards: int = 1
) -> dict[str, float]:
    """Weights, gradients and optimizer bytes per GPU (seed 002 sec. III.A table): ZeRO-1
    shards the optimizer terms over `shards` data-parallel ranks, ZeRO-2 the gradients too,
    ZeRO-3 the weights too. Ignores buffers, the allocator, and TP/PP (which divide all three)."""
    n = max(1, shards)
    return {
        "weights": params * conv.weights / (n if zero >= 3 else 1),
        "grads": params * conv.grads / (n if zero >= 2 else 1),
        "optimizer": params * conv.optimizer / (n if zero >= 1 else 1),
    }


def korthikanti_layer_bytes(
    seq: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    *,
    tp: int = 1,
    sp: bool = False,
    ac: str = "none",
    act_bytes: float = 2.0,
) -> float:
    """Activation bytes of one transformer layer, Korthikanti et al. 2022 ("Reducing Activation
    Recomputation in Large Transformer Models", Eq. 1-2 and Table 2): s*b*h*(34 + 5*a*s/h)
    with 16-bit activations and 1-byte dropout masks; tensor parallel
    s*b*h*(10 + 24/t + 5*a*s/(h*t)); with sequence parallel everything /t; selective
    recomputation drops the 5*a*s/h attention-score term; full recomputation keeps the layer
    input 2*s*b*h (/t with SP). fp32 activations (act_bytes=4) double everything (seed 004
    Napkin Math 1.6). Counts a GPT-2-style layer (multi-head attention, 4h MLP, dropout);
    ignores GQA, SwiGLU's third matrix, the embedding and logits, and flash attention (which
    keeps no s x s scores: use ac='selective' for it)."""
    s, b, h, a, t = seq, micro_batch, hidden, heads, max(1, tp)
    sbh = float(s) * b * h
    if ac == "full":
        out = 2 * sbh / (t if sp else 1)
    else:
        scores = 0.0 if ac == "selective" else 5 * a * s / h
        out = sbh * (34 + scores) / t if sp else sbh * (10 + (24 + scores) / t)
    return out * act_bytes / 2


def checkpoint_memory(layers: int, k: int) -> tuple[float, int, float]:
    """Chen et al. 2016 / seed 004 Table 15: k checkpoints over N layers keep k + N/k layers of
    activations (in units of one layer's A), recompute N - k layer forwards, which is
    (N - k) / (3N) of a forward+backward step (backward = 2 x forward). Returns (memory in A,
    layer forwards recomputed, step overhead). Ignores that a checkpoint (the layer input) is
    smaller than A, and uneven segments."""
    if k <= 0:
        return float(layers), 0, 0.0
    return k + layers / k, layers - k, (layers - k) / (3 * layers)


def sqrt_checkpoints(layers: int) -> int:
    """k minimising k + N/k: sqrt(N), rounded (seed 004: sqrt(48) ~ 7)."""
    return max(1, round(math.sqrt(layers)))


def quantization(n: int, quantum: int) -> tuple[int, float]:
    """Work of size n run in units of `quantum` (warps of 32 threads, tiles, waves): units =
    ceil(n / quantum), utilization = n / (units x quantum) (seed 004 Table 6: 33 -> 2 warps,
    51.6%)."""
    units = -(-n // quantum)
    return units, n / (units * quantum)


SM_COUNTS: dict[str, int] = {
    "v100-32gb": 80,  # NVIDIA Tesla V100 whitepaper: 80 SMs
    "a100-40gb": 108,  # NVIDIA A100 whitepaper: 108 SMs
    "a100-80gb": 108,
    "h100-sxm": 132,  # NVIDIA H100 whitepaper: SXM5 132 SMs (seed 004 quotes 132)
    "h100-pcie": 114,  # NVIDIA H100 whitepaper: PCIe 114 SMs
    "h200": 132,  # H200 SXM: the H100 SXM5 die
    "b200": 148,  # NVIDIA Blackwell B200: 148 SMs (2 dies x 74)
    "rtx3090": 82,  # GA102 whitepaper: RTX 3090 82 SMs
    "rtx4090": 128,  # Ada whitepaper: RTX 4090 128 SMs
    "mi300x": 304,  # AMD Instinct MI300X datasheet: 304 compute units
}
"""Streaming multiprocessors (compute units) per GPU, for the wave count."""


def gemm_waves(
    m: int, n: int, sms: int, tile_m: int = 128, tile_n: int = 128
) -> tuple[int, float, float]:
    """Wave quantization of an (m x k) @ (k x n) GEMM (NVIDIA Deep Learning Performance Guide,
    "Matrix Multiplication Background": tile and wave quantization): tiles = ceil(m/tm) x
    ceil(n/tn); waves = tiles / SMs; efficiency = tiles / (ceil(waves) x SMs), the busy
    fraction of the last partial wave averaged in. Assumes one tile per SM at a time and a
    fixed tile (cuBLAS picks its own); ignores split-K and stream-K kernels that fill the tail.
    Returns (tiles, waves, efficiency)."""
    tiles = -(-m // tile_m) * -(-n // tile_n)
    waves = tiles / sms
    return tiles, waves, tiles / (math.ceil(waves) * sms)


def alignment(dim: int) -> str:
    """Tensor-core alignment of a GEMM dimension (NVIDIA Deep Learning Performance Guide:
    16-bit GEMMs need multiples of 8 elements (16 bytes) for tensor cores on older cuBLAS,
    and run best at multiples of 64 (128 bytes, A100) so tiles are full)."""
    for q, verdict in ((128, "ok (x128)"), (64, "ok (x64)"), (8, "x8 only: partial tiles")):
        if dim % q == 0:
            return verdict
    return "NOT a multiple of 8: padded or no tensor cores"


def textbook_lines(
    est: Estimate, bytes_per_param: int, *, params: float | None = None, ckpt_every: int = 1
) -> list[str]:
    """The seeds' textbook memory of `est`'s layout, beside (never instead of) the planner's:
    model + optimizer state = P x the convention's bytes, sharded by ZeRO over dp (seed 002),
    divided by tp x pp; activations = Korthikanti et al. 2022 per layer (with the layout's tp,
    sp and ac) x layers on pipeline rank 0 x micro-batches in flight there
    (time.pipeline.inflight_microbatches), 1 in `ckpt_every` kept (seed 004 Example 1.3). `params`:
    the nominal count the seeds round to (7e9); default the model's exact count. Ignores
    buffers, the allocator, the CUDA context, logits, the embedding's own activations."""
    from ..time.pipeline import inflight_microbatches

    p, L, m_ = est.plan, est.plan.layout, est.plan.model
    conv = convention(bytes_per_param, p.precision)
    P = float(m_.num_params()) if params is None else params
    split = L.tp * L.pp
    zs = state_bytes(P / split, conv, zero=L.zero, shards=L.zero_shards)
    states = sum(zs.values())
    act_bytes = float(compute_bytes(p.precision))
    seq = p.seq_len // max(1, L.cp)
    per_layer = korthikanti_layer_bytes(
        seq, p.micro_batch, m_.dim, m_.num_heads, tp=L.tp, sp=L.sp, ac=p.ac, act_bytes=act_bytes
    )
    layers = m_.num_layers / L.pp
    m = max(1, p.grad_accum)
    inflight = inflight_microbatches(L.pp_schedule, L.pp, m, 0, L.pp_virtual) if L.pp > 1 else 1.0
    acts = per_layer * layers * inflight / max(1, ckpt_every)
    total = states + acts

    def gb(x: float) -> str:
        v = x / GB
        return f"{v:,.1f} GB" if abs(v) >= 10 else f"{v:.2f} GB"

    who = "nominal" if params is not None else f"{m_.name}'s exact count"
    s, b, h, a = seq, p.micro_batch, m_.dim, m_.num_heads
    form = {
        "none": f"s*b*h*(34 + 5*a*s/h) = {s}*{b}*{h}*(34 + 5*{a}*{s}/{h})",
        "selective": f"34*s*b*h = 34*{s}*{b}*{h}",
        "full": f"2*s*b*h = 2*{s}*{b}*{h}",
    }.get(p.ac, p.ac)
    par = "" if L.tp == 1 else f", tp={L.tp}{' sp' if L.sp else ''} (Eq. 2)"
    out = [
        f"-- textbook memory (--convention {bytes_per_param}: the seeds' napkin math, beside "
        "the planner's model above)",
        f"   model + optimizer state: {conv.bytes_per_param} B/param = {conv.terms}",
        f"     source: {conv.source}",
        f"   P = {P:.4g} ({who}) / (tp*pp = {split}); ZeRO-{L.zero} over {L.zero_shards} "
        "ranks (seed 002 sec. III.A)",
    ]
    per = {"weights": (conv.weights, 3), "grads": (conv.grads, 2), "optimizer": (conv.optimizer, 1)}
    for k, v in zs.items():
        nbytes, stage = per[k]
        div = f" / {L.zero_shards}" if L.zero >= stage and L.zero_shards > 1 else ""
        out.append(f"   {k:<9} = P/{split} x {nbytes:g} B{div} = {gb(v)}")
    out.append(f"   states    = {gb(states)}")
    scale = "" if act_bytes == 2 else " x 2 (fp32)"
    out.append(
        f"   activations per layer (Korthikanti et al. 2022, ac={p.ac}{par}) = {form}"
        f"{scale} = {gb(per_layer)}"
    )
    keep = f" / keep 1 in {ckpt_every}" if ckpt_every > 1 else ""
    out.append(
        f"   activations = per layer x {layers:g} layers (rank 0) x {inflight:g} "
        f"micro-batches in flight{keep} = {gb(acts)}"
    )
    out.append(
        f"   textbook total = {gb(states)} + {gb(acts)} = {gb(total)} vs "
        f"{capacity_gb_text(p.hardware)} -> "
        f"{'fits' if total <= p.hardware.memory_bytes else 'DOES NOT FIT'} "
        f"(planner: {gb(est.memory.total)} = {fmt_bytes(est.memory.total, digits=2)} allocated)"
    )
    why = verdict_difference(est, states, acts)
    if why:
        out.append(f"   {why}")
    out.append(
        "   ignores: buffers, allocator, CUDA context, logits and embeddings, GQA/SwiGLU "
        "shapes, flash attention's missing s x s scores (use --ac selective)"
    )
    return out


def verdict_difference(est: Estimate, states: float, acts: float) -> str | None:
    """When the textbook total (`states` + `acts`) and the planner disagree on 'fits', the
    term that makes the difference: the planner's reserved bytes minus the textbook total, split
    into model states (params + grads + optimizer, the planner's in-flight copies included),
    activations, buffers (incl. the CUDA context; the textbook has none), the allocator's
    reserve (reserved - allocated) and the overlap of the planner's terms (its fields are each
    at their own peak, so their sum can exceed the allocated peak: a negative term). The term
    named is the largest one pushing the planner's side of the verdict, with the planner's
    reserved without it. None when both say the same."""
    mem, cap = est.memory, est.plan.hardware.memory_bytes
    book_fits = states + acts <= cap
    if book_fits == mem.fits:
        return None
    planner_states = mem.params + mem.grads + mem.optimizer
    fields = planner_states + mem.activations + mem.buffers
    terms = {
        "model states": planner_states - states,
        "activations": mem.activations - acts,
        "buffers (textbook: none)": mem.buffers,
        "allocator reserve": mem.reserved - mem.total,
        "terms not at their peak together": mem.total - fields,
    }
    sign = 1.0 if book_fits else -1.0  # the planner is the heavier side, or the lighter one
    name, delta = max(terms.items(), key=lambda kv: sign * kv[1])
    split = ", ".join(f"{k} {v / GB:+.1f}" for k, v in terms.items())
    without = mem.reserved - delta
    flips = "fits" if without <= cap else "still does not fit"
    if not book_fits:
        flips = "would not fit" if without > cap else "still fits"
    largest = ""
    if name.startswith("buffers") and mem.buffer_terms:
        k, v = max(mem.buffer_terms.items(), key=lambda kv: kv[1])
        largest = f"; largest {k} {v / GB:.1f} GB"
    return (
        f"why the verdicts differ: the term that makes the difference is {name} "
        f"({delta / GB:+.1f} GB{largest}); planner reserved {mem.reserved / GB:.1f} GB - "
        f"textbook {(states + acts) / GB:.1f} GB = "
        f"{split} GB; without it the planner's {without / GB:.1f} GB {flips}"
    )


def ring_allreduce(nbytes: float, ranks: int, bytes_per_s: float) -> tuple[float, int, float]:
    """Ring all-reduce (seed 003 sec. 19.3, seed 004 Napkin Math 1.10; Patarasuk and Yuan
    2009): each rank sends 2 (N-1)/N x M bytes in 2 (N-1) steps; time = that / link bandwidth.
    Returns (bytes sent per rank, steps, seconds). Ignores per-step latency, overlap with the
    backward, NCCL's tree algorithm and in-network reduction."""
    sent = 2 * (ranks - 1) / ranks * nbytes
    return sent, 2 * (ranks - 1), sent / bytes_per_s


def layer_gemm_flops(
    batch: int, seq: int, hidden: int, heads: int, kv_heads: int, ffn: int, gated: bool
) -> dict[str, float]:
    """Forward FLOPs of one transformer layer's matmuls, 2 per multiply-add (seed 004 Napkin
    Math 1.1): QKV 2*B*S*h*(a + 2g)*d, scores QK^T and probabilities x V 2*B*a*S^2*d each
    (no causal halving: the seed counts the full square), output 2*B*S*h^2, MLP 2*B*S*h*f per
    matrix (2 matrices, 3 with a gate). Ignores norms, softmax, the embedding and LM head."""
    d = hidden // heads
    bs = float(batch) * seq
    qk = 2 * batch * heads * float(seq) ** 2 * d
    return {
        "qkv": 2 * bs * hidden * (heads + 2 * kv_heads) * d,
        "attention": 2 * qk,
        "out proj": 2 * bs * hidden * hidden,
        "mlp": 2 * bs * hidden * ffn * (3 if gated else 2),
    }
