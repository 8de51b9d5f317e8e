"""fp8 training's cost beside its GEMMs: how fast float8 GEMMs run against bf16 ones, and the
memory-bound casts (amax, scale, cast, transposed copies) each converted Linear adds. Torch-free.

The float8 GEMM rate (`fp8_gemm_share`). Float8 GEMMs reach a smaller fraction of their (2x)
peak than bf16 GEMMs do of theirs: the maximum achievable matmul FLOP/s (MAMF) measured with
the same finder (stas00/ml-engineering compute/accelerator/README.md, 'Maximum Achievable
Matmul FLOPS comparison table', BF16 and FP8 (float8_e4m3fn) tables; mamf-finder.py, mean of
100 iterations of the best shape):
- H100 SXM: bf16 794.5 of 989 TFLOP/s (80.3%), fp8 1402.6 of 1979 (70.9%), torch 2.7.0+cu126;
- H200 SXM: fp8 1453.4 of 1979 (73.4%); bf16 "H200 is the same" as H100 (80.3%);
- B200 SXM: bf16 1745.0 of 2250 (77.6%), fp8 3432.5 of 4500 (76.3%), torch 2.7.1+cu128.
(Figures as read at stas00/ml-engineering 744d01e, 2026-08-22.) A second source agrees on the
B200: OpenXLA's measured GEMM table (ROCm/xla 333a694 xla/service/gpu/model/
matmul_interpolator_data.h, key 'sm_100_B200') peaks at batch 4 x 4096^3 with bf16 1670.5 and
float8_e4m3fn 3279.7 TFLOP/s, 74.2% and 72.9% of peak: a share of 0.98, as above. Not used as a
rate: the same table's 'sm_90' float8 entries (up to 2592.8) exceed the H100's dense fp8 peak.
So fp8 GEMMs keep (fp8 share / bf16 share) of the bf16 matmul efficiency against the fp8 peak
(`step_time.default_efficiency`). A device whose preset or description states its own share
(`HardwareSpec.fp8_mamf_share`, both rates from one measurement: the MI300X's 0.899 from AMD's
hipBLASLt MAF table, config/hardware.py) keeps it; any other takes the H100's.

The casts (`fp8_cast_bytes_per_token`, `fp8_weight_cast_bytes`; in seconds `fp8_cast_s`,
`fp8_weight_cast_s`): each converted Linear's input
(M x K), output gradient (M x N) and weight (K x N) are cast to float8 with a per-tensor scale
from their amax, in kernels that move bytes and do almost no arithmetic (far below every GPU's
ridge point): bytes / memory bandwidth. By the kernels that run them (`fp8_cast_kernels`):
- 'torchao_fused': torchao's Float8Linear (tensorwise, dynamic scaling) under torch.compile.
  torchao's own roofline of this recipe (pytorch/ao torchao/testing/training/roofline_utils.py
  `get_tensor_memory_traffic_ovhd_s`, float8_recipe_name 'tensorwise', fuse_with_prev False, the
  default of benchmarks/float8/float8_roofline.py whose tables the torchao docs publish): an
  activation or gradient costs an amax read (2 B) and one cast kernel reading it (2 B) and
  writing both fp8 layouts (1 + 1 B): 6 B per element; a weight the amax read, then a cast
  per GEMM layout (2 + 1 B each, forward and backward): 8 B per element per use.
- 'torchao_eager': the same Float8Linear without compile (torchao/float8/float8_linear.py
  `matmul_with_hp_or_float8_args`: the input, the weight and the output gradient are each cast
  twice, once per GEMM layout); one eager cast (float8_utils.py `tensor_to_amax`:
  `torch.max(torch.abs(x))`; float8_training_tensor.py `_ToFloat8ConstrFunc`: `to(float32) *
  scale`, float8_utils.py `to_fp8_saturated`: clamp, `.to(float8)`) moves abs 2 + 2, max 2,
  upcast 2 + 4, scale 4 + 4, clamp 4 + 4, cast 4 + 1 = 33 B per element.
- 'scaletrain': our Float8Linear (precision/fp8.py, precision/scaling.py): `abs_max` on CUDA
  reads twice (amin, amax: 4 B), `cast_to_fp8` upcasts (2 + 4), divides and clamps in place
  (4 + 4 each) and casts (4 + 1): 31 B per cast; x and dy are cast once, each with one
  column-major copy for `_scaled_mm` (1 + 1 B): 33 B; W is cast in forward and again in
  backward, with one column-major copy: 64 B. Under torch.compile the chain is fused as
  torchao's is ('torchao_fused': the same amax, scale, clamp and cast).
- 'transformer_engine': Transformer Engine's Linear / LayerNormLinear (Megatron-Core, NeMo),
  delayed scaling (TE's default recipe: the scale from the amax history, the amax recorded by
  the cast kernel itself): transformer_engine/pytorch/module/linear.py sets the input
  quantizer's usage to row-wise and column-wise and quantizes once (`input_quantizer(inputmat)`):
  one kernel reads the 16-bit input (2 B) and writes both fp8 layouts (1 + 1 B): 4 B per
  element; the output gradient likewise (4 B). The inputs that follow a layernorm (QKV, fc1:
  LayerNormLinear) come out of the norm kernel in fp8, their column-wise copy a transpose
  (1 + 1 B). Weights are cast once per step and cached across micro-batches (`is_first_
  microbatch`); with fp8 primary weights (the recipes' assumption,
  `Recipe.te_fp8_gemm_inputs`) they are fp8 already: not charged.

Recompute: full AC redoes the forward, so each input's forward cast again (and the weight's
forward cast, except under Transformer Engine); torchtitan's per-op SAC recomputes wk, wo and
w3 (`flops.op_sac_recompute_flops_per_token`) and saves abs / max (torchtitan
parallelize_llama.py `_save_list`: "for low precision training, it's useful to always save the
result of max(abs(tensor))"): their input casts again without the amax read.

Counts the dense block's Linears: q, k, v, o and the MLP (separate q/k/v and gate/up modules,
each casting its own input, for torchtitan and scaletrain; fused QKV and fc1 for Transformer
Engine). MoE models: under a Megatron-Core recipe (Transformer Engine) the attention's
Linears here and the experts' grouped casts in time/moe_traffic.py; otherwise not charged.
Ignores: the output head and the router (bf16 in every recipe), MLA's projections (dense q/k/v dims
are counted), the fp8 all-gather's own cast of the weight shard
(1/dp of the weight, before the gather), the scale computations (a few scalars), replicated
(non-sequence-parallel) inputs cast on every tp rank, kernel launch gaps, torchao's roofline
caveat that compile does not always produce its ideal kernels, and Transformer Engine's
current-scaling recipe (an extra amax read per tensor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scaletrain.config import HardwareSpec

from ..memory.states import fp8_linear_params
from .efficiency import generation_of

if TYPE_CHECKING:
    from ..recipes.schema import Recipe
    from ..types import PlanInput

__all__ = [
    "FP8_MAMF_SHARE",
    "fp8_gemm_share",
    "CastBytes",
    "CAST_BYTES",
    "fp8_cast_kernels",
    "fp8_cast_bytes_per_token",
    "fp8_weight_cast_bytes",
    "fp8_cast_s",
    "fp8_weight_cast_s",
]

FP8_MAMF_SHARE: dict[str, float] = {
    # (fp8 MAMF / fp8 peak) / (bf16 MAMF / bf16 peak), the module docstring's table
    "h100": (1402.6 / 1979) / (794.5 / 989),
    "h200": (1453.4 / 1979) / (794.5 / 989),
    "b200": (3432.5 / 4500) / (1745.0 / 2250),
}
"""The fraction of the bf16 matmul efficiency float8 GEMMs keep against the fp8 peak, by GPU
generation (stas00/ml-engineering MAMF tables, module docstring)."""


def fp8_gemm_share(hardware: HardwareSpec) -> float:
    """The device's own measured share (`HardwareSpec.fp8_mamf_share`: the MI300X's from AMD's
    hipBLASLt MAF table, 0.899), else `FP8_MAMF_SHARE` of its generation; the H100's for a
    device with neither; 1 for a device with no fp8 peak (its 'fp8' runs the bf16 path)."""
    if "fp8" not in hardware.peak_flops:
        return 1.0
    if hardware.fp8_mamf_share > 0:
        return hardware.fp8_mamf_share
    return FP8_MAMF_SHARE.get(generation_of(hardware), FP8_MAMF_SHARE["h100"])


@dataclass(frozen=True, slots=True)
class CastBytes:
    """Bytes moved per element by one kernel family's casts (module docstring)."""

    activation: float
    """A GEMM input: its forward cast and its backward layout."""
    gradient: float
    """An output gradient: both of its layouts."""
    weight: float
    """A weight, per micro-batch (forward and backward)."""
    weight_forward: float
    """The forward's share of `weight` (what full AC casts again)."""
    amax: float
    """The amax read a recompute skips when abs / max are saved (torchtitan's op-SAC)."""
    normed_input: float
    """An input a fused norm kernel already wrote in fp8 (Transformer Engine's
    LayerNormLinear); `activation` where no norm fuses the cast."""


CAST_BYTES: dict[str, CastBytes] = {
    "torchao_fused": CastBytes(
        activation=6.0, gradient=6.0, weight=8.0, weight_forward=5.0, amax=2.0, normed_input=6.0
    ),
    "torchao_eager": CastBytes(
        activation=66.0,
        gradient=66.0,
        weight=66.0,
        weight_forward=33.0,
        amax=6.0,
        normed_input=66.0,
    ),
    "scaletrain": CastBytes(
        activation=33.0,
        gradient=33.0,
        weight=64.0,
        weight_forward=31.0,
        amax=4.0,
        normed_input=33.0,
    ),
    "transformer_engine": CastBytes(
        activation=4.0, gradient=4.0, weight=0.0, weight_forward=0.0, amax=0.0, normed_input=2.0
    ),
}
"""`CastBytes` of each kernel family (`fp8_cast_kernels`), from the module docstring's counts."""


def _fp8_linears(plan: PlanInput, recipe: Recipe | None) -> str:
    """Whose fp8 Linears a plan runs: 'transformer_engine' (a recipe reading Transformer
    Engine), 'torchao' (torchtitan: float8.py `Float8Handler.convert_to_float8_training`; the
    default recipe with `fp8_backend` 'torchao'), 'scaletrain' (ours), '' (another foreign
    recipe: no fp8 path read; another precision; a CPU)."""
    if plan.precision != "fp8" or plan.hardware.is_cpu:
        return ""
    if recipe is not None and recipe.te_fp8_gemm_inputs:
        return "transformer_engine"
    name = recipe.name if recipe is not None else "scaletrain"
    if name == "torchtitan":
        return "torchao"
    return plan.fp8_backend if name == "scaletrain" else ""


def fp8_cast_kernels(plan: PlanInput, recipe: Recipe | None) -> str:
    """The `CAST_BYTES` family of a plan's fp8 casts ('' = none charged): Transformer
    Engine's; torchao's or ours fused ('torchao_fused': the same amax / scale / clamp / cast
    chain) under torch.compile; else torchao's or our eager chain."""
    linears = _fp8_linears(plan, recipe)
    if linears in ("", "transformer_engine"):
        return linears
    if plan.compile:
        return "torchao_fused"
    return "torchao_eager" if linears == "torchao" else "scaletrain"


def fp8_cast_bytes_per_token(plan: PlanInput, recipe: Recipe | None) -> float:
    """Bytes the fp8 casts of one dense block move per token (forward, backward and what AC
    recomputes), for the block's whole width (the caller divides by tp x cp as it does the
    block's FLOPs); 0 where `fp8_cast_kernels` charges none."""
    kind = fp8_cast_kernels(plan, recipe)
    if not kind:
        return 0.0
    model = plan.model
    if model.is_moe:
        if kind != "transformer_engine" or recipe is None or not _megatron_moe(plan, recipe):
            return 0.0
        # a Megatron-Core MoE layer: the attention's Linears here, the experts' grouped casts
        # in time/moe_traffic.py
        return _te_attention_cast_bytes(plan)
    b = CAST_BYTES[kind]
    h, q, kv, f = model.dim, model.q_dim, model.kv_dim, model.ffn_dim
    n_in = 2 if model.gated_mlp else 1
    if kind == "transformer_engine":
        # fused QKV and fc1 (LayerNormLinear: inputs out of the norm), proj and fc2 (Linear)
        normed_in, plain_in = 2.0 * h, float(q + f)
    else:
        # separate wq / wk / wv and w1 / w3, each casting the same normed input
        normed_in, plain_in = float(3 * h + n_in * h), float(q + f)
    grads = float(q + 2 * kv + h + n_in * f + h)
    forward = b.normed_input * normed_in + b.activation * plain_in
    total = forward + b.gradient * grads
    if plan.ac == "full":
        total += forward  # the forward's casts again
    elif (
        plan.ac == "selective"
        and recipe is not None
        and recipe.selective == "torchtitan_op"
        and not model.is_moe
    ):
        # wk, wo and the MLP's second matmul recompute their forward, amax saved
        second = h if model.gated_mlp else f
        total += (b.activation - b.amax) * (h + q + second)
    return total


def _megatron_moe(plan: PlanInput, recipe: Recipe) -> bool:
    """recipes.activations.megatron_moe_applies (imported here: the recipes import this
    package's neighbours)."""
    from ..recipes.activations import megatron_moe_applies

    return megatron_moe_applies(plan, recipe)


def _te_attention_cast_bytes(plan: PlanInput) -> float:
    """The Transformer Engine casts of an MoE layer's attention Linears per token: the fused
    QKV LayerNormLinear's input out of the norm (`normed_input`), the output projection's input
    q wide (`activation`), and both GEMMs' output gradients, q + 2kv and h (`gradient`); the
    forward's casts again under full AC. The router (16-bit) is not cast."""
    b = CAST_BYTES["transformer_engine"]
    m = plan.model
    h, q, kv = m.dim, m.q_dim, m.kv_dim
    forward = b.normed_input * h + b.activation * q
    total = forward + b.gradient * (q + 2 * kv + h)
    if plan.ac == "full":
        total += forward
    return total


def fp8_weight_cast_bytes(plan: PlanInput, recipe: Recipe | None, linear_params: float) -> float:
    """Bytes the weight casts of one micro-batch move on a rank holding `linear_params`
    converted-Linear parameters (unsharded: the gathered weights the GEMMs read), plus the
    forward's weight casts again under full AC; 0 where `fp8_cast_kernels` charges none, under
    Transformer Engine (cached per step), and where FSDP gathers the weights in fp8
    (`PlanInput.fp8_all_gather` under ZeRO-2/3: torchao's `WeightWithDynamicFloat8CastTensor`
    casts the shard before the gather and the Linear takes the fp8 weight uncast,
    float8_linear.py `tensor_already_casted_to_fp8`; the shard's cast, 1/dp, is ignored; ours,
    precision/fp8_fsdp.py, dequantizes after the gather and casts as without it)."""
    kind = fp8_cast_kernels(plan, recipe)
    gathered = plan.fp8_all_gather and plan.layout.zero >= 2
    if not kind or (gathered and _fp8_linears(plan, recipe) == "torchao"):
        return 0.0
    b = CAST_BYTES[kind]
    per = b.weight + (b.weight_forward if plan.ac == "full" else 0.0)
    return per * linear_params


def fp8_cast_s(plan: PlanInput, recipe: Recipe | None) -> float:
    """Seconds per token per block of the fp8 Linears' casts (fp8_cast_bytes_per_token
    over the memory bandwidth: memory-bound kernels); 0 with a user-set efficiency (which
    stands for the whole block), on a CPU and where no cast is charged."""
    if plan.efficiency > 0:
        return 0.0
    return fp8_cast_bytes_per_token(plan, recipe) / plan.hardware.memory_bw


def fp8_weight_cast_s(plan: PlanInput, recipe: Recipe | None, *, layers: int) -> float:
    """Seconds of one micro-batch's fp8 weight casts on a rank of `layers` blocks (its
    converted Linears' parameters per tp rank, memory.states.fp8_linear_params; dense blocks,
    MoE models not charged, `fp8_casts`); 0 as `fp8_cast_s`, and under a calibration (its
    measured block rates hold the casts)."""
    if plan.efficiency > 0 or plan.calibration is not None or plan.model.is_moe:
        return 0.0
    params = fp8_linear_params(plan.model, layers, plan.layout.tp)
    return fp8_weight_cast_bytes(plan, recipe, params) / plan.hardware.memory_bw
