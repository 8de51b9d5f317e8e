"""Reduced-precision training beyond autocast: float8 linear layers and MoE experts
(`fp8.py`), and converting a model to them (`fp8_apply.py`)."""

from .fp8 import AMAXES, SCALINGS, Float8ExpertLinear, Float8Linear
from .fp8_apply import (
    amax_histories,
    apply_fp8,
    fp8_backend_of,
    fp8_eligible,
    maybe_apply_fp8,
    sync_amax_histories,
)
from .scaling import E4M3, E5M2, AmaxHistory, dequantize, quantize

__all__ = [
    "Float8Linear",
    "Float8ExpertLinear",
    "apply_fp8",
    "maybe_apply_fp8",
    "fp8_eligible",
    "fp8_backend_of",
    "amax_histories",
    "sync_amax_histories",
    "SCALINGS",
    "AMAXES",
    "E4M3",
    "E5M2",
    "AmaxHistory",
    "quantize",
    "dequantize",
]
