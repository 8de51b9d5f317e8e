"""Which precisions a GPU generation runs: one home for the rules, read by plan and train.

Torch-free. A preset names its architecture (`HardwareSpec.arch`); `train` builds the same
`GpuArch` from the device it runs on (`torch.cuda.get_device_properties`, trainer side), and
both ask `precision_problem`. The thresholds are NVIDIA's compute capabilities ("sm"):
- bf16 tensor cores arrived with Ampere, sm80 (A100; V100 sm70 has fp16 only);
- float8 (E4M3/E5M2) tensor cores with Ada, sm89 (RTX 4090) and Hopper, sm90 (H100/H200), and
  `torch._scaled_mm`, the GEMM of `precision/fp8.py`, requires sm89+; A100 and RTX 3090 (sm86)
  have none;
- TF32 tensor cores (fp32 matmuls at reduced mantissa) arrived with Ampere, sm80.
AMD's CDNA3 (MI300X, gfx942) runs bf16 and TF32-free fp32 matrix math; its float8 is the FNUZ
variant (torch.float8_e4m3fnuz), not the OCP float8_e4m3fn our fp8 GEMMs take, so scaletrain's
fp8 is refused there (frameworks with FNUZ kernels are not).
A CPU has no rule here: `train` on a CPU runs every precision (slowly) and is never refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "GpuArch",
    "CPU_ARCH",
    "nvidia_arch",
    "amd_arch",
    "parse_arch",
    "arch_text",
    "precision_problem",
    "runs_tf32",
    "BF16_MIN_SM",
    "FP8_MIN_SM",
    "TF32_MIN_SM",
]

BF16_MIN_SM = (8, 0)
"""bf16 tensor cores: Ampere (sm80) and newer."""
FP8_MIN_SM = (8, 9)
"""float8 tensor cores and `torch._scaled_mm`: Ada (sm89), Hopper (sm90) and newer."""
TF32_MIN_SM = (8, 0)
"""TF32 tensor cores: Ampere (sm80) and newer."""

# NVIDIA compute capability -> generation (the ones our presets and common cards use)
_NVIDIA_GENERATIONS = (
    ((12, 0), "Blackwell"),
    ((10, 0), "Blackwell"),
    ((9, 0), "Hopper"),
    ((8, 9), "Ada"),
    ((8, 0), "Ampere"),
    ((7, 5), "Turing"),
    ((7, 0), "Volta"),
    ((0, 0), "pre-Volta"),
)
# AMD gfx target -> (generation, runs bf16, float8 format); CDNA2 MI200 and CDNA3 MI300
_AMD_TARGETS = {
    "gfx90a": ("CDNA2", True, ""),
    "gfx942": ("CDNA3", True, "fnuz"),
    "gfx950": ("CDNA4", True, "ocp"),
}


@dataclass(frozen=True)
class GpuArch:
    """A device generation as the precision rules see it."""

    vendor: Literal["nvidia", "amd", "cpu"]
    generation: str
    """'Volta', 'Ampere', 'Ada', 'Hopper', 'Blackwell', 'CDNA3', ... or 'cpu'."""
    capability: tuple[int, int] | None = None
    """NVIDIA compute capability (sm major, minor); None off NVIDIA."""
    gfx: str = ""
    """AMD gfx target ('gfx942'); empty off AMD."""

    def label(self) -> str:
        """'Ampere (sm80)', 'CDNA3 (gfx942)', 'cpu'."""
        if self.capability is not None:
            return f"{self.generation} (sm{self.capability[0]}{self.capability[1]})"
        return f"{self.generation} ({self.gfx})" if self.gfx else self.generation


CPU_ARCH = GpuArch("cpu", "cpu")


def nvidia_arch(capability: tuple[int, int]) -> GpuArch:
    """The arch of an NVIDIA device with this compute capability
    (`torch.cuda.get_device_capability`)."""
    gen = next(g for cc, g in _NVIDIA_GENERATIONS if tuple(capability) >= cc)
    return GpuArch("nvidia", gen, (int(capability[0]), int(capability[1])))


def amd_arch(gfx: str) -> GpuArch:
    """The arch of an AMD device with this gfx target (`gcnArchName`, features stripped)."""
    target = gfx.split(":")[0]
    gen = _AMD_TARGETS.get(target, ("AMD", False, ""))[0]
    return GpuArch("amd", gen, None, target)


def parse_arch(text: str) -> GpuArch | None:
    """The arch a hardware description names (`hardware.arch` in TOML): 'sm90' / 'sm_90' (NVIDIA
    compute capability 9.0; 'sm100' is 10.0, 'sm86' 8.6: the last digit is the minor
    version, as NVIDIA writes sm_XY), 'gfx942' (an AMD gfx target) or 'cpu'; None when the
    text is none of these."""
    t = text.strip().lower()
    if t == "cpu":
        return CPU_ARCH
    sm = t.removeprefix("sm_").removeprefix("sm")
    if sm != t and sm.isascii() and sm.isdigit() and len(sm) >= 2:
        return nvidia_arch((int(sm[:-1]), int(sm[-1])))
    if t.startswith("gfx") and len(t) > 3 and t[3:].isascii() and t[3:].isalnum():
        return amd_arch(t)
    return None


def arch_text(arch: GpuArch) -> str:
    """The `parse_arch` spelling of `arch` ('sm90', 'gfx942', 'cpu'): its inverse."""
    if arch.capability is not None:
        return f"sm{arch.capability[0]}{arch.capability[1]}"
    return arch.gfx or "cpu"


def runs_tf32(arch: GpuArch) -> bool:
    """Whether fp32 matmuls can run on TF32 tensor cores (NVIDIA sm80+)."""
    return arch.capability is not None and arch.capability >= TF32_MIN_SM


def precision_problem(dtype: str, arch: GpuArch, device: str) -> str | None:
    """Why `device` (a preset or device name) of `arch` cannot run `precision.dtype` = `dtype`
    under scaletrain's kernels, in one clause; None when it can (always on a CPU)."""
    on = f"{device} is {arch.label()}"
    if arch.vendor == "nvidia":
        assert arch.capability is not None
        if dtype == "bf16" and arch.capability < BF16_MIN_SM:
            return f"bf16 needs sm80+ (Ampere or newer); {on}: use fp16 or fp32"
        if dtype == "fp8" and arch.capability < FP8_MIN_SM:
            fix = "bf16" if arch.capability >= BF16_MIN_SM else "fp16 or fp32"
            return f"fp8 needs sm89+ (Ada, Hopper or newer); {on}: use {fix}"
    elif arch.vendor == "amd":
        _, bf16, fp8 = _AMD_TARGETS.get(arch.gfx, ("", False, ""))
        if dtype in ("bf16", "fp8") and not bf16:
            return f"{dtype} needs CDNA2+ (MI200/MI300); {on}: use fp16 or fp32"
        if dtype == "fp8" and fp8 != "ocp":
            why = "whose float8 is FNUZ only" if fp8 == "fnuz" else "with no float8"
            return f"scaletrain's fp8 GEMMs take OCP float8_e4m3fn; {on}, {why}: use bf16"
    return None
