"""fp8 training of linear layers: `Float8Linear` (`fp8_apply.apply_fp8` converts a model).

What is float8 and what is not (the recipe of Micikevicius et al. 2022 and DeepSeek-V3 §3.3):
- the three GEMMs of every converted Linear run in float8 through `torch._scaled_mm`:
  forward `y = x W^T` (x, W in E4M3), dgrad `dx = dy W` and wgrad `dW = dy^T x` (dy in E5M2,
  the saved x and W in E4M3); products accumulate in fp32 inside the kernel, outputs are the
  compute dtype (y, dx) and the weight's dtype (dW); scales are fp32;
- the weight stays an ordinary fp32 (or FSDP-cast bf16) `nn.Parameter`, quantized inside every
  forward: FSDP2 shards and all-gathers the master as usual, optimizer states never see fp8;
- MoE experts (stacked (E, out, in) parameters, not Linears) run the same three float8 GEMMs per
  expert and projection (`Float8ExpertLinear`, set as `GroupedExperts.linear`), scaled from
  each expert's own weight and token group; always with the current amax (a delayed history
  per expert would follow how many tokens the router sent it, DeepSeek-V3 scales experts
  this way too);
- everything else — embeddings, norms, attention softmax, the router, the output head, the loss —
  stays in the compute dtype (bf16 with autocast).

Scaling: `tensorwise` with `current` amax (this tensor now) or `delayed` amax (max over the last
`history_len` steps, Transformer Engine style); `tilewise` (1x128 activation/gradient tiles,
128x128 weight blocks) always uses the current amax, as in DeepSeek-V3. See `scaling.py` for how
tile-wise GEMMs run on `_scaled_mm`.

Memory of one converted Linear, weight (N, K), input (M, K) (what the planner must model):
- persistent: the Parameter as it was (fp32 master: 4 B/param), its grad in the weight's dtype,
  the optimizer's states. No fp8 weight cache, no stored transpose. Delayed scaling adds three
  fp32 amax histories of `history_len` values per Linear (checkpointed, see `Float8Linear`).
- saved forward -> backward: the fp8 input (M·K B) and its fp32 scales (tensorwise: 4 B;
  tilewise: 4 B per 1x128 tile, K zero-padded up to a multiple of 128, data padded too), plus
  a reference to the weight and its 0-dim scale. No fp8 weight copy survives the forward:
  W is re-quantized in backward (under FSDP2 from the re-gathered unsharded weight, exactly as
  a plain Linear saves and re-gathers it). An input shared by several Linears (the norm output
  feeding wq/wk/wv) is saved once per Linear — as autocast's per-Linear bf16 casts are.
- transient: fp32 temporaries of x and W while quantizing; the fp8 W (N·K B, padded to 128x128
  blocks for tilewise) in forward and again in backward; in backward the fp8 dy, the
  column-major copies `_scaled_mm` needs (W_q for dgrad, x_q and dy_q^T for wgrad) and, for
  tilewise, the fp32 dequantized x and its 128x1 re-tiled fp8 copy.

On CUDA with `torchao` importable, tensorwise/current conversion is delegated to
`torchao.float8.convert_to_float8_training` (fused casts, `torch.compile`-friendly); everything
else uses `Float8Linear`, the same code on CPU and CUDA.

Kernel: `matmul` ('auto', 'scaled_mm' or 'emulated', `precision.fp8_matmul`) picks what runs the
GEMMs, resolved per device at each call (`fp8_matmul.choose_fp8_matmul`: on a CPU 'auto' is
measured once per process). The emulation quantizes exactly as above and only replaces the
`_scaled_mm` calls; it adds fp32 copies of both operands as transients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from scaletrain.dtensor import is_dtensor, to_full

from .fp8_matmul import choose_fp8_matmul
from .scaling import (
    E4M3,
    E5M2,
    TILE,
    AmaxHistory,
    cast_to_fp8,
    dequantize,
    quantize,
    scaled_mm,
    tiled_scaled_mm,
)

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["Float8Linear", "Float8ExpertLinear", "SCALINGS", "AMAXES", "MATMULS"]

SCALINGS = ("tensorwise", "tilewise")
AMAXES = ("current", "delayed")
MATMULS = ("auto", "scaled_mm", "emulated")
_DIM_MULTIPLE = 16  # cuBLASLt fp8 GEMMs need the inner dims to be multiples of 16
_EXTRA_STATE = "_extra_state"  # nn.Module's key suffix for non-parameter state


class _Fp8State:
    """Recipe, GEMM kernel setting and delayed-scaling histories of one Float8Linear (input,
    weight, grad_output)."""

    def __init__(self, scaling: str, amax: str, history_len: int, matmul: str = "auto") -> None:
        self.scaling, self.amax, self.matmul = scaling, amax, matmul
        delayed = amax == "delayed"
        self.x = AmaxHistory(history_len) if delayed else None
        self.w = AmaxHistory(history_len) if delayed else None
        self.dy = AmaxHistory(history_len) if delayed else None

    def histories(self) -> tuple[AmaxHistory, ...]:
        return tuple(h for h in (self.x, self.w, self.dy) if h is not None)

    def emulate(self, device: torch.device) -> bool:
        """Whether the GEMMs on `device` run `emulated_scaled_mm` (the process's choice)."""
        return choose_fp8_matmul(self.matmul, device.type).emulate


def _quant_tensorwise(
    t: torch.Tensor, dtype: torch.dtype, hist: AmaxHistory | None
) -> tuple[torch.Tensor, torch.Tensor]:
    if hist is None:
        return quantize(t, dtype)
    amax = hist.amax_for(t)
    if is_dtensor(t) and not is_dtensor(amax):  # history is a plain replicated tensor
        from torch.distributed.tensor import DTensor, Replicate

        mesh = t.device_mesh
        amax = DTensor.from_local(amax, mesh, [Replicate()] * mesh.ndim, run_check=False)
    data, scale = quantize(t, dtype, amax=amax)
    hist.record(t)
    return data, scale


def _pad_rows(t: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero rows up to a multiple (fp8 tensors padded through their uint8 bits: 0x00 is +0)."""
    pad = -t.shape[0] % multiple
    if not pad:
        return t
    bits = t.view(torch.uint8)
    return torch.cat([bits, bits.new_zeros(pad, t.shape[1])]).view(t.dtype)


class _Fp8Matmul(torch.autograd.Function):
    """y = x @ W^T with float8 GEMMs in forward and backward. x: (M, K), W: (N, K)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, state: _Fp8State, out_dtype: torch.dtype
    ) -> torch.Tensor:
        ctx.state, ctx.x_dtype, ctx.w_dtype = state, x.dtype, weight.dtype
        ctx.shape = (x.shape[0], weight.shape[0], x.shape[1])  # (M, N, K)
        ctx.emulate = emu = state.emulate(x.device)
        with torch.autocast(x.device.type, enabled=False):
            if state.scaling == "tensorwise":
                xq, sx = _quant_tensorwise(x, E4M3, state.x)
                wq, sw = _quant_tensorwise(weight, E4M3, state.w)
                y = scaled_mm(xq, sx, wq.t(), sw, out_dtype, emulate=emu)
            else:
                xq, sx = quantize(x, E4M3, (1, TILE))  # (M, Kp), (M, Kp/128)
                wq, sw = quantize(weight, E4M3, (TILE, TILE))  # (Np, Kp), (Np/128, Kp/128)
                b_scale = sw.t().repeat_interleave(TILE, dim=1)  # (Kp/128, Np)
                y = tiled_scaled_mm(xq, sx, wq.t(), b_scale, emulate=emu)
                y = y[:, : weight.shape[0]].to(out_dtype)
        # Saved for backward: the fp8 input (1 byte/element) and its scale, and the weight
        # itself, re-quantized in backward. A saved fp8 copy of W would stay alive from every
        # layer's forward to its backward — under FSDP2 a full unsharded copy per layer, 1 B/param
        # of the whole model — whereas the Parameter costs nothing extra: FSDP2 frees and
        # re-gathers it for backward as for any Linear. The re-cast is bit-identical: the
        # tensorwise scale is saved (delayed scaling's history has moved on since), tile scales
        # are a max over the same values.
        ctx.save_for_backward(xq, sx, weight, sw)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        xq, sx, weight, sw = ctx.saved_tensors
        state: _Fp8State = ctx.state
        m, n, k = ctx.shape
        emu = ctx.emulate
        if state.scaling == "tensorwise":
            wq = cast_to_fp8(weight, sw, E4M3)  # the forward's wq, bit for bit
            dyq, sdy = _quant_tensorwise(dy, E5M2, state.dy)
            dx = scaled_mm(dyq, sdy, wq, sw, ctx.x_dtype, emulate=emu)  # (M, K) = dy W
            # wgrad contracts over M (tokens); cuBLASLt wants it a multiple of 16: zero rows.
            dyq_p, xq_p = _pad_rows(dyq, _DIM_MULTIPLE), _pad_rows(xq, _DIM_MULTIPLE)
            dw = scaled_mm(dyq_p.t(), sdy, xq_p, sx, torch.float32, emulate=emu)  # (N, K)
        else:
            wq, sw = quantize(weight, E4M3, (TILE, TILE))  # the forward's (wq, sw)
            dyq, sdy = quantize(dy, E5M2, (1, TILE))  # (M, Np), (M, Np/128)
            b_scale = sw.repeat_interleave(TILE, dim=1)  # (Np/128, Kp)
            dx = tiled_scaled_mm(dyq, sdy, wq, b_scale, emulate=emu)[:, :k]
            # wgrad contracts over tokens, so both operands need tiles along M (128x1, as in
            # DeepSeek-V3): re-tile the saved 1x128 x (a second rounding) and dy.
            x_deq = dequantize(xq, sx, (1, TILE))  # (M, Kp) fp32
            xq2, sx2 = quantize(x_deq, E4M3, (TILE, 1))  # (Mp, Kp), (Mp/128, Kp)
            dyq2, sdy2 = quantize(dy, E5M2, (TILE, 1))  # (Mp, Np), (Mp/128, Np)
            dw = tiled_scaled_mm(dyq2.t(), sdy2.t(), xq2, sx2, emulate=emu)[:n, :k]
        return dx.to(ctx.x_dtype), dw.to(ctx.w_dtype), None, None


class Float8Linear(nn.Linear):
    """nn.Linear whose matmuls run in float8; weight and bias are the original Parameters.

    Being an `nn.Linear` (same `weight`/`bias`, same state-dict keys) it checkpoints, shards
    (FSDP2) and is matched by Linear-based plans exactly like the module it replaced. With
    amax='delayed' its state dict also holds the amax histories (`<prefix>_extra_state`), so a
    resumed run uses the scales the uninterrupted one would have.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        scaling: str = "tensorwise",
        amax: str = "current",
        history_len: int = 16,
        matmul: str = "auto",
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._set_recipe(scaling, amax, history_len, matmul)

    def _set_recipe(self, scaling: str, amax: str, history_len: int, matmul: str) -> None:
        if scaling not in SCALINGS:
            raise ValueError(f"fp8 scaling {scaling!r}: use one of {SCALINGS}")
        if amax not in AMAXES:
            raise ValueError(f"fp8 amax {amax!r}: use one of {AMAXES}")
        if scaling == "tilewise" and amax == "delayed":
            raise ValueError(
                "fp8 amax 'delayed' is per-tensor only: use amax='current' with "
                "scaling='tilewise' (tiles are scaled from their own amax)"
            )
        if history_len < 1:
            raise ValueError(f"fp8 history_len {history_len}: use a positive integer")
        _check_matmul(matmul)
        self.fp8_state = _Fp8State(scaling, amax, history_len, matmul)

    @classmethod
    def from_linear(
        cls,
        mod: nn.Linear,
        *,
        scaling: str = "tensorwise",
        amax: str = "current",
        history_len: int = 16,
        matmul: str = "auto",
    ) -> Float8Linear:
        """Wrap `mod`'s own Parameters (no copy, works on meta): optimizers keep their refs."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = mod.in_features, mod.out_features
        new.weight = mod.weight
        new.bias = mod.bias
        new._set_recipe(scaling, amax, history_len, matmul)
        return new

    # Delayed scaling is run state that decides the next step's scales, so it is checkpointed:
    # one (3, 1 + history_len) float64 tensor under the key `<prefix>_extra_state` (the name
    # nn.Module and torch.distributed.checkpoint reserve for non-parameter state; DCP saves a
    # plain tensor once, from rank 0 — the histories are identical on every rank). Done here
    # rather than with get/set_extra_state, which would add the key to every Float8Linear:
    # current scaling has no state, and its state dict stays exactly nn.Linear's.

    def _save_to_state_dict(
        self, destination: dict[str, Any], prefix: str, keep_vars: bool
    ) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        hists = self.fp8_state.histories()
        if hists:
            destination[prefix + _EXTRA_STATE] = torch.stack([h.state() for h in hists])

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # `state_dict` is the per-module copy nn.Module.load_state_dict hands over: popping
        # the key keeps nn.Linear's loader from calling it unexpected. A history saved by a
        # delayed-scaling run is dropped by a current-scaling model (it has no use for it).
        saved = state_dict.pop(prefix + _EXTRA_STATE, None)
        hists = self.fp8_state.histories()
        if hists and saved is None:
            missing_keys.append(prefix + _EXTRA_STATE)
        elif hists:
            device = self.weight.device if self.weight.device.type != "meta" else None
            saved = to_full(saved)
            if saved.shape[0] != len(hists):
                error_msgs.append(
                    f"{prefix}{_EXTRA_STATE}: {saved.shape[0]} amax histories "
                    f"saved, {len(hists)} expected"
                )
            else:
                try:
                    for h, row in zip(hists, saved.unbind(0)):
                        h.load_state(row, device)
                except ValueError as e:
                    error_msgs.append(f"{prefix}{_EXTRA_STATE}: {e}")
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_dtype = _out_dtype(x)
        if self.fp8_state.scaling == "tilewise" and is_dtensor(self.weight):
            y = _tilewise_tp(x, self.weight, self.fp8_state, out_dtype)
        else:
            # Plain tensors, or tensorwise DTensors: DTensor's own rules run the quantization
            # (a global amax: the same scale on every rank) and its `_scaled_mm` strategy.
            x2 = x.reshape(-1, x.shape[-1])  # (M, K), M = all leading dims
            y = _Fp8Matmul.apply(x2, self.weight, self.fp8_state, out_dtype)  # (M, N)
            y = y.view(*x.shape[:-1], y.shape[-1])
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        s = self.fp8_state
        kernel = "" if s.matmul == "auto" else f", matmul={s.matmul}"
        return f"{super().extra_repr()}, fp8={s.scaling}/{s.amax}{kernel}"


class Float8ExpertLinear:
    """`linear(x, weight, bias)` in float8 for MoE experts (`GroupedExperts.linear`).

    x: (n_e, K) one expert's tokens, weight: (N, K) that expert's slice of the stacked
    parameter (its gradient flows back into the stack). The same `_Fp8Matmul` as Float8Linear,
    with the current amax: one scale per expert weight and token group (tensorwise) or per
    tile. An expert that received no tokens, or dims not multiples of 16, run F.linear.
    """

    def __init__(self, scaling: str = "tensorwise", matmul: str = "auto") -> None:
        if scaling not in SCALINGS:
            raise ValueError(f"fp8 scaling {scaling!r}: use one of {SCALINGS}")
        _check_matmul(matmul)
        self.fp8_state = _Fp8State(scaling, "current", 1, matmul)

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        n, k = weight.shape
        if x.shape[0] == 0 or n % _DIM_MULTIPLE or k % _DIM_MULTIPLE:
            return F.linear(x, weight, bias)
        y = _Fp8Matmul.apply(x, weight, self.fp8_state, _out_dtype(x))
        return y if bias is None else y + bias.to(y.dtype)

    def __repr__(self) -> str:
        return f"Float8ExpertLinear(fp8={self.fp8_state.scaling}/current)"


def _check_matmul(matmul: str) -> None:
    if matmul not in MATMULS:
        raise ValueError(f"fp8 matmul {matmul!r}: use one of {MATMULS}")


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a Linear under the current autocast would return (x's without autocast)."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def _tilewise_tp(
    x: torch.Tensor, weight: DTensor, state: _Fp8State, out_dtype: torch.dtype
) -> torch.Tensor:
    """Tile-wise fp8 on a tensor-parallel weight: the GEMMs run on the local shards.

    Colwise (weight Shard(0)): replicated x, output Shard(-1). Rowwise (Shard(1)): x Shard(-1),
    output Partial (summed by the TP output hook). With local dims multiples of 128 no tile
    straddles a shard, so the tiles and scales are exactly the single-process ones.
    """
    from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

    mesh, placements = weight.device_mesh, weight.placements
    if len(placements) != 1:
        raise ValueError("tilewise fp8 supports a 1-D tensor-parallel mesh")
    p = placements[0]
    # (placement x must have, placement of dx's local shard, placement of y)
    want_x: Placement
    grad_x: Placement
    out_p: Placement
    if isinstance(p, Shard) and p.dim == 0:  # each rank's dx sums over its own N columns only
        want_x, grad_x, out_p = Replicate(), Partial(), Shard(x.dim() - 1)
    elif isinstance(p, Shard) and p.dim == 1:
        want_x, grad_x, out_p = Shard(x.dim() - 1), Shard(x.dim() - 1), Partial()
    else:
        want_x, grad_x, out_p = Replicate(), Replicate(), Replicate()
    if isinstance(x, DTensor):
        x = x.redistribute(mesh, [want_x]).to_local(grad_placements=[grad_x])
    w = weight.to_local()
    y = _Fp8Matmul.apply(x.reshape(-1, x.shape[-1]), w, state, out_dtype)  # (M, N_local)
    y = y.view(*x.shape[:-1], w.shape[0])
    return DTensor.from_local(y, mesh, [out_p], run_check=False)
