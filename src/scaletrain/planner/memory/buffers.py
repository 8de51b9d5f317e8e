"""Buffers per GPU: communication buckets, pipeline receive buffers, the runtime context
and the allocator's fragmentation (torch-free).

Units: bytes; `GB` in docstrings means 1e9 bytes. Every function answers for ONE rank.

The model-state terms live in `states.py`, the activation terms in `activations.py` and
`head.py`.
"""

from __future__ import annotations

from scaletrain.config import compute_bytes, ddp_reducer

from ..time.pipeline_comms import boundary_tensors
from ..types import PlanInput
from .torchao_fp8 import torchao_cast_bytes

__all__ = [
    "buffer_terms",
    "pp_boundary_bytes",
    "RUNTIME_CONTEXT_BYTES",
    "FRAGMENTATION",
    "FP8_CAST_BYTES",
    "fp8_quantize_bytes",
]

RUNTIME_CONTEXT_BYTES = 0.75e9
"""CUDA context + cuBLAS workspaces + NCCL communicator buffers, outside the caching allocator
(measured 0.5-1 GB on A100/H100 with torch 2.x; 0 on 'cpu'). Counted in `total` so `fits` is
honest; subtract `buffer_terms['runtime_context']` to compare with max_memory_allocated()."""

FRAGMENTATION = 0.05
"""Caching-allocator reserve: reserved = allocated x (1 + FRAGMENTATION) (+ runtime context).
5% is the typical reserved/allocated excess of expandable-segment-free runs; tune with measure."""


def buffer_terms(
    plan: PlanInput,
    *,
    unit_params: float,
    zero_shards: int,
    device: str = "gpu",
    reduce_bytes: int = 4,
    bucket_params: float = 0.0,
    unit_gather_bytes: float | None = None,
    unit_grad_params: float | None = None,
) -> dict[str, float]:
    """Named transient buffers on one rank (bytes) of `plan` (its layout, model dims and
    precision). tokens = s_l * b of one micro-batch (s_l = seq_len / cp); h = model.dim,
    f = model.ffn_dim, k = model.experts_per_token.

    ddp_buckets: DDP (zero 0, and zero 1 which runs over DDP): the reducer's flat bucket copy of
      every gradient, reduce_bytes x bucket_params (the rank's replicated parameters), kept for
      the run: the trainer's `replicate` keeps torch's default gradient_as_bucket_view=False
      (the dry-run adds the same term). Without bucket_params: 2 x 25 MB in flight (bucket_cap_mb).
      zero 2 is FSDP2 (no DDP buckets; its collectives are as zero 3's). Without DDP's
      reducer (`config.layout.ddp_reducer` false: tp, ep or pp > 1) the gradients are averaged
      after backward through flat buckets of <= 25 MiB each
      (parallel/data_parallel.py BUCKET_BYTES), freed one by one when the activations are
      already gone: not counted (dry-run, tiny-moe dp4 ep2 z0: the bucket term was +17% of
      the transient peak).
    fsdp_reduce_scatter: ZeRO-3 fp32 copy of one unit's grads fed to the reduce-scatter
      (reduce_bytes x unit) plus its output shard; fsdp_all_gather: the all-gather input shard.
      (the all-gathered output is the in-flight param copy counted under params).
    tp_all_gather: SP's gathered (s x b x h) activation; tp all-reduce is in place (0).
    pp_p2p: send + receive activation buffers (2 x e*s*b*h, /t with SP); the per-rank planner
      replaces it with `pp_boundary_bytes` (what the rank's sends and receives hold at most).
    cp_ring: K/V blocks in flight in the ring (2 blocks x K and V).
    ep_all_to_all: dispatch send + receive of k routed copies per token (2 x e*k*s*b*h); with
      an expert capacity, of its R rows (k -> `ModelConfig.expert_rows_per_token`).
    fp8_quantize: fp8's quantization temporary at the peak (`fp8_quantize_bytes`; torchao's
      Linears: `torchao_fp8.torchao_cast_bytes`).
    runtime_context: RUNTIME_CONTEXT_BYTES on a GPU, 0 on 'cpu'.
    unit_gather_bytes / unit_grad_params (LoRA, `lora.LoraStage`): the unit's bytes as
      gathered and its parameters with gradients, when they are not unit_params x e and
      unit_params (a frozen base gathers in its stored form and has no gradient).
    Ignores: NCCL's internal channel buffers beyond the context term, cuDNN workspaces.
    """
    L, model, precision = plan.layout, plan.model, plan.precision
    tokens = plan.seq_len / L.cp * plan.micro_batch
    hidden = model.dim
    e = compute_bytes(precision)
    out: dict[str, float] = {}
    if L.dp > 1 or zero_shards > 1:
        if L.zero >= 2:
            grads = unit_params if unit_grad_params is None else unit_grad_params
            gather = e * unit_params if unit_gather_bytes is None else unit_gather_bytes
            out["fsdp_reduce_scatter"] = reduce_bytes * grads * (1 + 1 / max(1, zero_shards))
            out["fsdp_all_gather"] = gather / max(1, zero_shards)
        elif ddp_reducer(L):
            out["ddp_buckets"] = reduce_bytes * bucket_params if bucket_params else 2 * 25 * 2**20
    if L.tp > 1 and L.sp:
        out["tp_all_gather"] = e * tokens * hidden
    if L.pp > 1:
        out["pp_p2p"] = 2 * e * tokens * hidden / (L.tp if L.sp else 1)
    if L.cp > 1:
        out["cp_ring"] = 2 * 2 * e * tokens * model.kv_dim / L.tp
    if L.ep > 1:
        out["ep_all_to_all"] = 2 * e * model.expert_rows_per_token(tokens) * tokens * hidden
    if precision == "fp8":
        out["fp8_quantize"] = (
            torchao_cast_bytes(plan)
            if plan.saved_precision != precision  # torchao's Linears (`PlanInput.saved_precision`)
            else fp8_quantize_bytes(plan)
        )
    out["runtime_context"] = 0.0 if device == "cpu" else RUNTIME_CONTEXT_BYTES
    return out


FP8_CAST_BYTES = {False: 5.0, True: 2.0}
"""Bytes per element that quantizing one gradient to fp8 holds at once beyond the gradient,
by `compile` (`fp8_quantize_bytes`): eager, the fp32 quotient and the fp8 result; compiled,
the fp8 result and the transposed fp8 copy the weight-gradient GEMM reads."""


def fp8_quantize_bytes(plan: PlanInput) -> float:
    """fp8's temporaries inside a block's backward (bytes, one rank), beyond the saved set the
    activation terms count (precision/fp8.py `_Fp8Matmul`, tensorwise; tok = s_l*b, t = tp).

    The operands: in forward each linear's input, in backward its output gradient. Under tp
    the column-parallel linears (q/k/v, w1/w3) read the whole (tok, h) input (all-gathered
    under SP) and the row-parallel ones (wo, w2) get the whole (tok, h) output gradient
    (all-gathered under SP for w2's backward); only w2's input p and w1/w3's gradients,
    (tok, f/t), and wo's input, (tok, q/t), are split. The largest, (tok, W) with
    W = max(h, q/t, f/t), is not /t: at Llama-3-70B widths with tp8, h is 2.3x f/t.

    Eager (`compile` off: the dry-run, and a run with `train.compile = false`), the larger of
    - the cast of the largest gradient, 5 x tok*W: `scaling.cast_to_fp8`'s fp32 quotient
      (4 B) and its fp8 result (1 B), neither saved (an input's fp8 result is, and is counted
      with the activations);
    - under full AC, the end of the block's recompute in the MLP: its input X (e*tok*h,
      gathered under SP; under bf16 X and p are saved tensors, under fp8 only their fp8
      copies are), w2's 16-bit input p (e*tok*f/t: SwiGLU's product, GELU's output), and
      either w2's input cast (its quotient, 4*tok*f/t) or w2's output (e*tok*h, the
      row-parallel partial sum of the whole width: an autograd Function packs its saved
      tensors after its forward, so checkpoint's early stop comes after w2's matmul, where
      a plain matmul saves its inputs first and stops before it).
    Measured (dry-run, Llama-3-70B TP8+SP fp8 full AC, dp32 ZeRO-3, 16 x 8,192 tokens, 2
    blocks; GiB): the recompute's end, at w2's output, 18.47; w2's input cast 18.20; w2's
    backward casting its 131,072 x 8,192 gradient 18.10 (13.10 before it, + 2 for |dy|, + 2
    for the quotient replacing it, + 1 for the fp8); planned 18.31 (-0.9%). At small widths
    (h 256, f/t 224, tp4) w2's input cast in the recompute is the peak, and the recompute's
    end the larger term (planner_accuracy's llama-256-L2 rows). The term replaces
    4 x tok*max(h, f)/t, the quotient of a split operand (calibrated at tp = 1 on gpt-mini
    and tiny-llama dp2, where the operand is the same and only the gradient's 1-B fp8 is new:
    planner_accuracy's tp-1 fp8 rows moved by 0.1% at most): 2.3x under at the 70B layout, whose
    dry-run also held |dy| as an fp32 copy and its |.| (8 B per element) until
    `scaling.abs_max` kept DTensors in their own dtype (-14.9% at 80 blocks before both).

    Compiled (`compile` on: `torch.compile` per block, parallel/parallelize.py): inductor
    fuses the amax and the division into kernels that read 16 bits and write fp8, so no fp32
    copy exists: the gradient's fp8 and the transposed fp8 copy the weight gradient's GEMM
    reads (`scaling.scaled_mm`'s contiguous copy; torchao casts the gradient once per GEMM
    layout: float8_linear.py `matmul_with_hp_or_float8_args.backward`), 2 x tok*W. From the
    code, not measured (no GPU run of a compiled fp8 step yet).

    Ignores: tilewise scaling's padded fp32 tiles, MoE experts' per-expert token groups (the
    dense widths are used), the weights' casts (h*f/t elements, small beside tok*h), the
    16-bit |.| the amax reads (2 B, below the quotient).
    """
    L, model = plan.layout, plan.model
    tok = plan.seq_len / L.cp * plan.micro_batch  # s_l * b of one micro-batch
    h, f = model.dim, model.ffn_dim / L.tp
    width = max(h, model.q_dim / L.tp, f)
    cast = FP8_CAST_BYTES[plan.compile] * tok * width
    if plan.compile or plan.ac != "full":
        return cast
    e = plan.compute_bytes
    tail = e * tok * h + e * tok * f + max(4.0 * tok * f, e * tok * h)
    return max(cast, tail)


def pp_boundary_bytes(plan: PlanInput, *, rank: int) -> float:
    """Pipeline communication buffers of pipeline rank `rank` (bytes) under `plan`'s layout:
    the most stage-boundary tensors the rank holds at once for its sends and receives
    (`time.pipeline_comms.boundary_tensors`, walking the step as the trainer runs it), times
    one (b, s_l, h) residual-stream tensor (/t with SP).

    Counts: receive buffers from the post of their receive until their stage consumed them (the
    trainer allocates them then, `parallel/pipeline_stage.py`), stage outputs torch keeps for
    backward (`fwd_cache`, and until W after a split backward) or until their send is let go,
    received gradients until the backward that reads them, input gradients until their send is
    let go. A received activation is the first block's stored input once its stage ran: the
    activation model counts it. The count follows the schedule's micro-batches in flight, not
    their number (1F1B: min(m, p - r) + 1 on a rank r < p - 1; GPipe holds every forward's
    output, so m + 1). The stream's dtype: the FSDP2 policy's compute dtype under ZeRO-2/3
    with 16-bit precision, else fp32 (the fp32 embedding output keeps the residual sum in fp32
    under autocast). Source: torch 2.13 `stage.py` (what a stage keeps) and the dry-run, which
    drives the stages through the same events (tests/unit/test_dryrun_pipeline_buffers.py: the
    same peak at 8 and 64 micro-batches under 1F1B, 8 and 24 under the others, equal to this count).
    Approximates: the count is the most over the whole step, added to every moment of the
    rank; at the rank's peak moment it may hold a few fewer (1F1B's last stage holds its one
    receive buffer before a forward, none during its loss backward). Ignores: NCCL's own
    staging buffers, a received activation's dtype cast inside the stage.
    """
    L = plan.layout
    if L.pp <= 1:
        return 0.0
    tokens = plan.seq_len / L.cp * plan.micro_batch  # s_l * b of one micro-batch
    io = plan.compute_bytes if L.zero >= 2 else 4
    m = max(1, plan.grad_accum)
    n = boundary_tensors(L.pp_schedule, L.pp, m, L.pp_virtual, rank)
    return n * io * tokens * plan.model.dim / (L.tp if L.sp else 1)
