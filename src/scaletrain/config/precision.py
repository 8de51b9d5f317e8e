"""The precision table: one home for what each `precision.dtype` means (torch-free).

Read by the planner (bytes), the trainer's autocast and FSDP policy (dtype names, looked up on
`torch` by the torch side) and the profiler. fp8 runs its converted Linears' GEMMs in float8
(`precision/fp8.py`) and everything else in bf16, so its compute dtype is bf16 and its
16-bit-class tensors (gathered weights, activations) are 2 bytes; `bytes` is what the planner
charges per element of a weight in that precision (1 for fp8: the float8 GEMM inputs), and
`compute_bytes` what it charges per element of a tensor computed in it (activations, gathered
16-bit weights, communication buffers): 4 in fp32, 2 in the rest (fp8 included).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from .choices import Precision, names

__all__ = [
    "PrecisionSpec",
    "PRECISION_TABLE",
    "PRECISIONS",
    "REDUCE_DTYPES",
    "precision_spec",
    "compute_bytes",
    "FP8_BACKENDS",
    "torchao_installed",
    "fp8_backend_for",
]


@dataclass(frozen=True)
class PrecisionSpec:
    name: str
    bytes: int
    """Bytes per element of a tensor stored in this precision (fp8: 1)."""
    compute: str
    """The torch dtype (attribute of `torch`) autocast and FSDP's param_dtype use."""
    mixed: bool
    """Whether parameters are kept in fp32 and cast for compute (every precision but fp32)."""
    compute_bytes: int
    """Bytes per element of a tensor in the compute dtype (`compute`): activations, the 16-bit
    copies FSDP gathers, communication buffers. 2 under fp8, whose non-GEMM work is bf16."""


PRECISION_TABLE: dict[str, PrecisionSpec] = {  # keys: names(Precision), in its order
    "fp32": PrecisionSpec("fp32", 4, "float32", mixed=False, compute_bytes=4),
    "bf16": PrecisionSpec("bf16", 2, "bfloat16", mixed=True, compute_bytes=2),
    "fp16": PrecisionSpec("fp16", 2, "float16", mixed=True, compute_bytes=2),
    "fp8": PrecisionSpec("fp8", 1, "bfloat16", mixed=True, compute_bytes=2),
}
PRECISIONS: tuple[Precision, ...] = names(Precision)
REDUCE_DTYPES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16"}
"""`precision.reduce_dtype` (each of names(ReduceDtype)) -> the torch dtype gradients are
reduced in."""


def precision_spec(name: str) -> PrecisionSpec:
    return PRECISION_TABLE[name]


def compute_bytes(name: str) -> int:
    """Bytes per element of an activation (or any compute-dtype tensor) in precision `name`."""
    return PRECISION_TABLE[name].compute_bytes


FP8_BACKENDS = ("scaletrain", "torchao")
"""Who converts fp8's Linears, once `precision.fp8_backend='auto'` is resolved
(`fp8_backend_for`): our `precision/fp8.py` Float8Linear or torchao's."""


def torchao_installed() -> bool:
    """Whether `torchao` can be imported here (its spec is found; nothing is imported)."""
    return importlib.util.find_spec("torchao") is not None


def fp8_backend_for(backend: str, *, scaling: str, amax: str, matmul: str, device_type: str) -> str:
    """The fp8 backend a run on `device_type` ('cuda', 'cpu') uses: one rule for the trainer
    (`precision.apply_fp8`), the dry-run (its target device) and the planner
    (`planner.types.plan_input_from_job`, `plan`). 'scaletrain' and 'torchao' are taken as
    given (the trainer refuses a 'torchao' it cannot run, `PrecisionConfig` a recipe torchao
    has not); 'auto' is torchao where the device is CUDA, torchao is installed here and the
    recipe is torchao's (tensorwise scaling, current amax, a real `_scaled_mm`), else ours.
    Torch-free: the planner reads it."""
    if backend != "auto":
        return backend
    fits = scaling == "tensorwise" and amax == "current" and matmul != "emulated"
    return "torchao" if device_type == "cuda" and fits and torchao_installed() else "scaletrain"
