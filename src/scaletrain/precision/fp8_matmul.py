"""Which kernel runs the float8 GEMMs: `torch._scaled_mm`, or its emulation in fp32 ops.

`precision.fp8_matmul`: 'scaled_mm' and 'emulated' force a kernel; 'auto' takes `_scaled_mm` on
CUDA (the fp8 tensor-core GEMM, the point of fp8) and, on a CPU, the emulation only where this
process measures `_scaled_mm` over `SLOWER_BY` times slower — once, at a small shape with the
default job's K and N (`probe_cpu_fp8_matmul`).
The probe exists because the CPU `_scaled_mm` ranges from the reference path (fp32 dequantize
and matmul: as fast as the emulation, bitwise equal to it) to oneDNN's fp8 GEMM, which on Intel
AMX hosts ran 256x128x512 in 1.19 s (~0.05 GFLOP/s; issue 32): fp8 training there never
finished. The emulation (`scaling.emulated_scaled_mm`) keeps the arithmetic: same fp8 operands
and scales, fp32 accumulation, same output dtype.
"""

from __future__ import annotations

import functools
import statistics
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from .scaling import E4M3, emulated_scaled_mm, quantize

__all__ = [
    "Fp8MatmulProbe",
    "Fp8MatmulChoice",
    "probe_cpu_fp8_matmul",
    "kernel_for",
    "choose_fp8_matmul",
]

Fp8Kernel = Literal["scaled_mm", "emulated"]
KERNELS: tuple[Fp8Kernel, ...] = typing.get_args(Fp8Kernel)
SLOWER_BY = 2.0
"""'auto' emulates when `_scaled_mm` takes more than this many times the emulation's time: a
clear margin over timing noise on a shared host (the two paths measured 0.9-1.1x of each other
where the CPU runs the reference path, 15-25x apart where it runs the slow fp8 GEMM)."""


@dataclass(frozen=True)
class Fp8MatmulProbe:
    """Median seconds per call of one fp8 (m, k) @ (k, n) product on this CPU, both ways."""

    scaled_mm_s: float
    emulated_s: float
    shape: tuple[int, int, int]  # (m, k, n)
    threads: int

    @property
    def ratio(self) -> float:
        """`_scaled_mm` time over the emulation's (> SLOWER_BY: emulate)."""
        return self.scaled_mm_s / self.emulated_s


@dataclass(frozen=True)
class Fp8MatmulChoice:
    """The kernel the float8 GEMMs run on one device type, and why."""

    kernel: Fp8Kernel
    setting: str  # precision.fp8_matmul as configured
    device_type: str
    probe: Fp8MatmulProbe | None = None  # measured only for 'auto' on a CPU

    @property
    def emulate(self) -> bool:
        return self.kernel == "emulated"

    def line(self) -> str:
        """One line for the run's start: the kernel, and the measurement or setting behind it."""
        head = f"fp8 matmul: {self.kernel}"
        p = self.probe
        if p is None:
            why = f"on {self.device_type}" if self.setting == "auto" else "set"
            return f"{head} (precision.fp8_matmul={self.setting}, {why})"
        m, k, n = p.shape
        return (
            f"{head} (precision.fp8_matmul=auto: CPU torch._scaled_mm "
            f"{p.scaled_mm_s * 1e6:.0f} us vs emulation {p.emulated_s * 1e6:.0f} us "
            f"at {m}x{k}x{n}, {p.threads} threads; emulate above {SLOWER_BY:g}x)"
        )


def probe_cpu_fp8_matmul(
    m: int = 32, k: int = 128, n: int = 512, *, seconds: float = 0.2, min_calls: int = 3
) -> Fp8MatmulProbe:
    """Time `torch._scaled_mm` and `emulated_scaled_mm` on one E4M3 (m, k) @ (k, n) CPU product.

    K and N are the default job's MLP (dim 128, ffn 512); m is small so the probe stays short
    where `_scaled_mm` is slow (~0.15 s a call at AMX's 0.05 GFLOP/s). One warm-up call each,
    then calls alternate (the two share the host's load) for about `seconds`, at least
    `min_calls` each; medians. Runs on real tensors even inside a FakeTensorMode (the dry-run).
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        a, sa = quantize(torch.randn(m, k, generator=gen), E4M3)
        w, sw = quantize(torch.randn(n, k, generator=gen), E4M3)
        b = w.t()  # (k, n) column-major, as the Linear forward passes it

        def scaled() -> torch.Tensor:
            return torch._scaled_mm(a, b, scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16)

        def emulated() -> torch.Tensor:
            return emulated_scaled_mm(a, b, scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16)

        calls: dict[Callable[[], torch.Tensor], list[float]] = {scaled: [], emulated: []}
        scaled(), emulated()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or len(calls[scaled]) < min_calls:
            for fn, times in calls.items():
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
    return Fp8MatmulProbe(
        scaled_mm_s=statistics.median(calls[scaled]),
        emulated_s=statistics.median(calls[emulated]),
        shape=(m, k, n),
        threads=torch.get_num_threads(),
    )


def kernel_for(probe: Fp8MatmulProbe) -> Fp8Kernel:
    """'emulated' when `_scaled_mm` measured more than `SLOWER_BY` times the emulation's time."""
    return "emulated" if probe.ratio > SLOWER_BY else "scaled_mm"


# Once per process: the answer depends on the CPU and torch build, not on the model, and every
# Float8Linear of every step asks. A zero-argument memo, not a table keyed on objects.
_cpu_probe = functools.cache(probe_cpu_fp8_matmul)


def choose_fp8_matmul(setting: str, device_type: str) -> Fp8MatmulChoice:
    """The kernel for `precision.fp8_matmul=setting` on `device_type` ('cpu', 'cuda', ...).

    'scaled_mm' / 'emulated': that kernel. 'auto': `_scaled_mm` off the CPU; on the CPU the
    emulation when the process's probe measured `_scaled_mm` more than `SLOWER_BY` times slower.
    """
    for kernel in KERNELS:
        if setting == kernel:
            return Fp8MatmulChoice(kernel, setting, device_type)
    if setting != "auto":
        raise ValueError(f"fp8 matmul {setting!r}: use 'auto', 'scaled_mm' or 'emulated'")
    if device_type != "cpu":
        return Fp8MatmulChoice("scaled_mm", setting, device_type)
    probe = _cpu_probe()
    return Fp8MatmulChoice(kernel_for(probe), setting, device_type, probe)
