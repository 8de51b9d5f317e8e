"""Float8 quantization: per-tensor and tile-wise scales, amax history, and scaled matmuls.

Conventions. A quantized tensor is `(data, scale)` with `data` float8 and `scale` fp32 the
*dequantization* factor: `t ≈ data.float() * scale`, `scale = amax / fp8_max` (the largest
|value| maps to the format's largest finite value, no margin). This is the factor
`torch._scaled_mm` multiplies by (`(a * scale_a) @ (b * scale_b)`), so scales pass straight
through. E4M3 (max 448, 3 mantissa bits) holds weights and activations, E5M2 (max 57344, 2
mantissa bits, wider range) holds gradients: the split of Micikevicius et al. 2022, "FP8 Formats
for Deep Learning", used by Transformer Engine's HYBRID recipe.

Granularity, as a tile shape `(rows, cols)` over a 2-D tensor:
- per tensor: one tile covering the whole tensor, a 0-dim scale;
- tile-wise (DeepSeek-V3 technical report, 2024, section 3.3.2): 1x128 tiles along the
  contraction dim for activations and output gradients, 128x128 blocks for weights. Tiles are
  zero-padded to full size: a zero never raises a tile's amax and contributes nothing to a
  product, so a partial last tile behaves exactly like a narrower tile.

`torch._scaled_mm` (torch 2.13) accepts a 0-dim scale per operand ("tensorwise") or an (M, 1)
scale for `a` and a (1, N) scale for `b` ("rowwise"), on CPU and CUDA; it has no block-scale
mode on CPU. `tiled_scaled_mm` therefore runs one rowwise `_scaled_mm` per 128-wide slice of the
contraction dim — within a slice the 1x128 and 128x128 scales are exactly a row scale of `a` and
a column scale of `b` — and sums the slices in fp32. That is DeepSeek-V3's own arithmetic: fp8
products, partial sums promoted to fp32 every 128 elements of K (their N_C = 128), each partial
scaled by its tiles' scales. The only rounding besides the fp8 inputs is each partial's bf16
output (relative 2^-9), bf16 being the dtype rowwise `_scaled_mm` emits on CUDA.

CUDA layout rules kept everywhere (CPU is lenient): `a` row-major, `b` column-major, both inner
dims multiples of 16, e5m2 never multiplied by e5m2.

`emulated_scaled_mm` is `_scaled_mm`'s arithmetic in plain fp32 ops, for CPUs whose `_scaled_mm`
is pathologically slow (`fp8_matmul.py` decides by measurement): the same fp8 operands and
scales, each operand dequantized (fp8 -> fp32, times its scale), an fp32 matmul, the result
cast to `out_dtype`. `scaled_mm` and `tiled_scaled_mm` take `emulate=True` to run it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from scaletrain.dtensor import to_full

__all__ = [
    "E4M3",
    "E5M2",
    "TILE",
    "quantize",
    "dequantize",
    "AmaxHistory",
    "scaled_mm",
    "tiled_scaled_mm",
    "emulated_scaled_mm",
    "pad_to",
    "abs_max",
    "cast_to_fp8",
    "widen",
]

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
TILE = 128
_EPS = 1e-12  # amax floor: an all-zero tensor gets a finite scale and quantizes to zeros


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def pad_to(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad a 2-D tensor up to multiples of (rows, cols)."""
    pr, pc = -t.shape[0] % rows, -t.shape[1] % cols
    return F.pad(t, (0, pc, 0, pr)) if pr or pc else t


def _plain(t: torch.Tensor) -> bool:
    """A real CPU tensor (not a DTensor, fake or meta tensor): where the fast paths below apply;
    everything else takes the plain expressions, whose results they equal."""
    return type(t) is torch.Tensor and t.device.type == "cpu"


def abs_max(t: torch.Tensor) -> torch.Tensor:
    """max |t| as a 0-dim fp32 tensor, with no fp32 temporary the size of t: the same value
    as `t.float().abs().amax()` exactly (negation, |.| and widening to fp32 are exact), NaN
    propagating. That expression held an fp32 copy of t and its |.| at once: 8 bytes per
    element of t (8 GiB for a 16 x 8,192-token x 8,192 bf16 activation).
    - a real CPU tensor: `aminmax`, one read (about 1.3x `abs().amax()` on fp32 and 2.2x on
      bf16 here);
    - CUDA and fake tensors: max(-amin, amax), two reads, scalars only;
    - a DTensor: `abs().amax()` in t's own dtype, widened after (DTensor's sharding rules
      cover both: a sharded t's amax is reduced over its mesh). One |t| in t's dtype (2 B per
      element of bf16), below `cast_to_fp8`'s fp32 quotient (4 B): under TP+SP the gathered
      (s*b, h) input of every column-parallel linear is a DTensor (dry-run of Llama-3-70B
      TP8+SP fp8: the fp32 copy and |.| were an eager step's largest temporaries, 8 GiB).
    """
    if _plain(t):
        lo, hi = torch.aminmax(t)
    elif isinstance(t, DTensor):
        return t.abs().amax().float()
    else:
        lo, hi = t.amin(), t.amax()
    return torch.maximum(lo.neg(), hi).float()


def cast_to_fp8(t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp8 of t / scale, saturated at the format's max: the division in fp32 (one rounding),
    then the cast (the second). One fp32 temporary: the quotient is divided and clamped in
    place when `t` is narrower than fp32 (its fp32 copy is already fresh)."""
    fmax = fp8_max(dtype)
    q = t.float().div_(scale) if t.dtype != torch.float32 else t / scale
    return q.clamp_(-fmax, fmax).to(dtype)


def widen(data: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """`data.float() * scale` (or `data.float()`) for an fp8 tensor, the same values exactly.

    Why not the cast: torch's CPU cast from E4M3 is scalar code, ~3.5 ms per million elements
    on the AVX-512 hosts measured (~40x widening bf16); through fp16 it is ~0.25 ms. Both fp8
    formats embed in fp16 by their bits (IEEE layouts, Micikevicius et al. 2022):
    - E5M2 is fp16's top byte (sign, the same 5-bit exponent and bias, 2 of its 10 mantissa
      bits): the pattern shifted left by 8 is that fp16 value, subnormals, inf and NaN included.
    - E4M3 (bias 7) with its 7 low bits shifted left by 7 lands in fp16 (bias 15) with the
      exponent field unchanged and the mantissa on top: the value divided by 2^8, subnormals
      included (m 2^-9 becomes m 2^-17, fp16's subnormal step 2^-24 times m 2^7). E4M3fn has no
      inf; its NaN (all 7 bits set) is restored explicitly.
    fp16 -> fp32 is exact and vectorized; 2^8 (exact) is folded into the scale, so each element
    is rounded once, when multiplied by its scale, as in `data.float() * scale`. Strides are
    kept (a column-major GEMM operand stays column-major).
    """
    if not _plain(data) or data.dtype not in (E4M3, E5M2):
        out = data.float()
        return out if scale is None else out * scale
    bits = data.view(torch.uint8).to(torch.int16)
    if data.dtype == E5M2:
        out = (bits << 8).view(torch.float16).float()
        return out if scale is None else out.mul_(scale)
    low = bits & 0x7F
    half = (low << 7).bitwise_or_((bits & 0x80) << 8)
    out = half.view(torch.float16).float()
    out.mul_(2.0**8 if scale is None else scale * 2.0**8)
    return out.masked_fill_(low == 0x7F, float("nan"))


def quantize(
    t: torch.Tensor,
    dtype: torch.dtype,
    tile: tuple[int, int] | None = None,
    amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D tensor; returns (fp8 data, fp32 dequantization scale).

    tile=None: per tensor, 0-dim scale; `amax` overrides the measured one (delayed scaling:
    values beyond it saturate at the format's max, as in Transformer Engine). tile=(r, c): the
    tensor is zero-padded to multiples of (r, c) (data comes back padded) and the scale has
    shape (rows/r, cols/c).
    """
    fmax = fp8_max(dtype)
    if tile is None:
        a = abs_max(t) if amax is None else amax.float()
        scale = a.clamp(min=_EPS) / fmax  # ()
        return cast_to_fp8(t, scale, dtype), scale
    tf = t.float()
    r, c = tile
    tp = pad_to(tf, r, c)
    rows, cols = tp.shape
    blocks = tp.view(rows // r, r, cols // c, c)  # (R/r, r, C/c, c)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=_EPS) / fmax  # (R/r, C/c)
    data = (blocks / scale[:, None, :, None]).clamp_(-fmax, fmax).to(dtype)
    return data.view(rows, cols), scale


def dequantize(
    data: torch.Tensor, scale: torch.Tensor, tile: tuple[int, int] | None = None
) -> torch.Tensor:
    """Inverse of `quantize` (fp32, still padded for tiles)."""
    if tile is None:
        return widen(data, scale)
    r, c = tile
    full = scale.repeat_interleave(r, dim=0).repeat_interleave(c, dim=1)  # (R, C)
    return data.float() * full


class AmaxHistory:
    """Delayed scaling state for one tensor role (Transformer Engine's `amax_history_len`).

    The scale used at step n comes from the max over the amaxes recorded at the previous
    `length` steps (TE's default `amax_compute_algo="max"`); the current amax is recorded after
    use. Before anything is recorded the current amax is used, so step 0 does not saturate.
    A plain tensor attribute, not a buffer: created lazily on the input's device, so meta-device
    build, `to_empty` materialization and FSDP leave it alone. It still belongs in checkpoints
    (the scales of step n+1 depend on it): `state()`/`load_state()` pack it into one tensor,
    which `Float8Linear` puts in its state dict.
    """

    def __init__(self, length: int) -> None:
        self.length = length
        self.history: torch.Tensor | None = None  # (length,) fp32, newest first
        self.num_recorded = 0

    def amax_for(self, t: torch.Tensor) -> torch.Tensor:
        if self.history is None or self.num_recorded == 0:
            return t.detach().abs().amax().float()  # a DTensor for a DTensor `t`
        return self._history_on(t.device).amax()

    def _history_on(self, device: torch.device) -> torch.Tensor:
        # a history restored from a checkpoint lands on the CPU (or wherever it was loaded)
        assert self.history is not None
        if self.history.device != device:
            self.history = self.history.to(device)
        return self.history

    def state(self) -> torch.Tensor:
        """(1 + length,) float64: [num_recorded, history...] — float64 holds the fp32 amaxes
        and any step count below 2^53 exactly, so one tensor round-trips bit for bit."""
        out = torch.zeros(1 + self.length, dtype=torch.float64)
        out[0] = self.num_recorded
        if self.history is not None:
            out[1:] = self.history.detach().to("cpu", torch.float64)
        return out

    def load_state(self, state: torch.Tensor, device: torch.device | None = None) -> None:
        """Inverse of `state()`; the history is kept on `device` (default: the CPU)."""
        if state.shape != (1 + self.length,):
            raise ValueError(
                f"fp8 amax history of shape {tuple(state.shape)} does not match "
                f"history_len={self.length}: convert the model with the "
                "history_len the checkpoint was saved with"
            )
        self.num_recorded = int(state[0].item())
        self.history = state[1:].to(device=device or "cpu", dtype=torch.float32).clone()

    @torch.no_grad()
    def record(self, t: torch.Tensor) -> None:
        cur = t.detach().abs().amax().float()
        cur = to_full(cur)  # a DTensor's amax (tensor parallel): the global one
        if self.history is None:
            self.history = torch.zeros(self.length, dtype=torch.float32, device=t.device)
        self.history = torch.roll(self._history_on(t.device), 1)
        self.history[0] = cur
        self.num_recorded += 1


def emulated_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """`torch._scaled_mm(a, b, scale_a=..., scale_b=..., out_dtype=...)` without its kernel.

    fp8 a: (M, K), b: (K, N); scales 0-dim (tensorwise) or (M, 1) and (1, N) (rowwise). Each
    operand is dequantized exactly as `dequantize` does (fp8 -> fp32 is exact, times the fp32
    scale: one rounding), multiplied in fp32 with fp32 accumulation, and the result cast to
    `out_dtype` — the arithmetic torch's reference CPU `_scaled_mm` runs (aten `Blas.cpp`,
    `_scaled_mm_out_cpu_emulated`; bitwise equal to it where the CPU takes that path). A fused
    kernel (oneDNN's fp8 GEMM on AMX hosts, cuBLASLt) scales the fp32 sum of exact fp8 products
    instead and sums in its own order: the results differ by fp32 rounding of the K-term sum
    (tests/unit/test_fp8_emulation.py derives the bound). No bias: our callers add theirs after.
    Costs two fp32 copies of the operands (4 B/element) on top of the kernel's memory.
    """
    return (widen(a, scale_a) @ widen(b, scale_b)).to(out_dtype)


def scaled_mm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    emulate: bool = False,
) -> torch.Tensor:
    """(a*sa) @ (b*sb) for fp8 a: (M, K) and b: (K, N) with per-tensor (0-dim) scales.

    `b` is made column-major (a free view when it is the transpose of a row-major tensor).
    `emulate`: `emulated_scaled_mm` instead of `torch._scaled_mm` (same operands and scales).
    """
    if emulate:
        return emulated_scaled_mm(a, b, scale_a=a_scale, scale_b=b_scale, out_dtype=out_dtype)
    if b.stride(0) != 1:
        b = b.t().contiguous().t()
    return torch._scaled_mm(
        a.contiguous(), b, scale_a=a_scale, scale_b=b_scale, out_dtype=out_dtype
    )


def tiled_scaled_mm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    emulate: bool = False,
) -> torch.Tensor:
    """fp32 (a @ b) with a: (M, K) in 1x128 K-tiles, a_scale (M, K/128), and b: (K, N) with
    one scale per (128-slice of K, column), b_scale (K/128, N). K must be a multiple of 128.

    One rowwise `_scaled_mm` per K-slice, partial sums accumulated in fp32 (module docstring);
    `emulate`: each slice through `emulated_scaled_mm` (the same bf16 partials).
    """
    k = a.shape[1]
    assert k % TILE == 0 and b.shape[0] == k, (a.shape, b.shape)
    if b.stride(0) != 1 and not emulate:
        b = b.t().contiguous().t()  # column-major, so each K-slice stays column-major
    mm = emulated_scaled_mm if emulate else torch._scaled_mm
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
    for i in range(k // TILE):
        sl = slice(i * TILE, (i + 1) * TILE)
        part = mm(
            a[:, sl].contiguous(),
            b[sl, :],
            # contiguous before unsqueeze: _scaled_mm checks the strides
            scale_a=a_scale[:, i].contiguous().unsqueeze(1),  # (M, 1)
            scale_b=b_scale[i, :].contiguous().unsqueeze(0),  # (1, N)
            out_dtype=torch.bfloat16,
        )  # (M, N) partial over 128 of K
        out += part.float()
    return out
