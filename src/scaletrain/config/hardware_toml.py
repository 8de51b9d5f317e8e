"""A device described in TOML: the `[hardware]` figures that make a `HardwareSpec`, in the
units of a datasheet, and the what-if changes (`plan --sweep`) made to one figure.

`hardware.gpu` names a preset (`config.hardware.HARDWARE_PRESETS`) or a new device. With a
preset, every figure given replaces the preset's (a what-if: an H100 with twice the NVLink
bandwidth); a new device must give the REQUIRED figures, the others take `HardwareSpec`'s
documented defaults. A figure left at 0 (or `peak_tflops` empty) is not given. Torch-free.

Units are the datasheet's: TFLOP/s (1e12), GB/s (1e9 bytes/s), GiB (2^30 bytes, the unit CUDA
reports memory in), microseconds, watts. Each conversion is written as the presets write it
(`989.4 * TFLOPS`, `79.10 * GiB`, `450 * GB`), and microseconds are divided by 1e6 (5 / 1e6 is
the double nearest 5e-6; 5 * 1e-6 is not), so a TOML copy of a preset's datasheet figures is
the preset, bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._errors import ConfigError
from .hardware import GB, HARDWARE_PRESETS, TFLOPS, GiB, HardwareSpec
from .hardware_rules import arch_text, parse_arch
from .strict import did_you_mean

__all__ = [
    "Figure",
    "FIGURES",
    "DTYPES",
    "REQUIRED",
    "describe_hardware",
    "spec_figures",
    "with_figure",
    "figure_value",
    "figure_unit",
]

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""The compute dtypes `peak_tflops` may name (`HardwareSpec.peak_flops`' keys)."""


@dataclass(frozen=True)
class Figure:
    """One `[hardware]` figure: the `HardwareSpec` attribute it sets and its unit."""

    attr: str
    scale: float
    """Spec units per TOML unit (bytes/s per GB/s, ...); microseconds divide (see module)."""
    unit: str
    integer: bool = False


FIGURES: dict[str, Figure] = {
    "peak_tflops": Figure("peak_flops", TFLOPS, "TFLOP/s"),
    "memory_gib": Figure("memory_bytes", GiB, "GiB"),
    "memory_bw_gb_s": Figure("memory_bw", GB, "GB/s"),
    "intra_node_bw_gb_s": Figure("intra_node_bw", GB, "GB/s"),
    "inter_node_bw_gb_s": Figure("inter_node_bw", GB, "GB/s"),
    "intra_node_latency_us": Figure("intra_node_latency_s", 1e6, "us"),
    "inter_node_latency_us": Figure("inter_node_latency_s", 1e6, "us"),
    "host_to_device_bw_gb_s": Figure("host_to_device_bw", GB, "GB/s"),
    "host_memory_gib": Figure("host_memory_bytes", GiB, "GiB"),
    "gpus_per_node": Figure("gpus_per_node", 1.0, "GPUs", integer=True),
    "power_w": Figure("power_w", 1.0, "W"),
    "usd_per_gpu_hour": Figure("usd_per_hour", 1.0, "USD/h"),
    "storage_gb_per_s": Figure("storage_bw", GB, "GB/s"),
    "mamf_bf16_tflops": Figure("mamf_bf16", TFLOPS, "TFLOP/s"),
    "fp8_mamf_share": Figure("fp8_mamf_share", 1.0, "fraction"),
    "attention_bf16_tflops": Figure("attention_bf16", TFLOPS, "TFLOP/s"),
    "intra_node_bw_efficiency": Figure("intra_node_bw_efficiency", 1.0, "fraction"),
    "nvls_allreduce_busbw_gb_s": Figure("nvls_allreduce_busbw", GB, "GB/s"),
    "intra_node_pair_bw_gb_s": Figure("intra_node_pair_bw", GB, "GB/s"),
    "sm_count": Figure("sm_count", 1.0, "SMs", integer=True),
}
"""TOML figure -> spec attribute. `arch` (a text, `hardware_rules.parse_arch`) is the other
field a description gives."""

REQUIRED = (
    "peak_tflops",
    "memory_gib",
    "memory_bw_gb_s",
    "intra_node_bw_gb_s",
    "inter_node_bw_gb_s",
    "power_w",
    "arch",
)
"""What a device that is not a preset must state; the rest default as `HardwareSpec` says
(8 GPUs per node, 5 / 10 us latencies, 25 GB/s PCIe, 2 USD/h, host RAM not stated)."""


def _to_spec(name: str, value: float) -> float:
    f = FIGURES[name]
    if f.unit == "us":
        return value / f.scale
    return value * f.scale


def figure_unit(name: str) -> str:
    """The unit a figure (or 'peak_tflops.<dtype>') is written in."""
    return FIGURES[name.split(".")[0]].unit


def _peak_table(value: Any) -> dict[str, float]:
    """`peak_tflops` as {dtype: TFLOP/s}: a TOML table, or 'bf16=989.4,fp8=1978.9' from the
    command line."""
    field = "hardware.peak_tflops"
    if isinstance(value, str):
        table: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in value.split(","))):
            key, eq, num = part.partition("=")
            if not eq:
                raise ConfigError(field, value, "write dtype=TFLOP/s pairs: bf16=989.4,fp8=1978.9")
            table[key.strip()] = num.strip()
        value = table
    if not isinstance(value, Mapping):
        raise ConfigError(field, value, "give a table of TFLOP/s by dtype: { bf16 = 989.4 }")
    out: dict[str, float] = {}
    for dtype, tf in value.items():
        if dtype not in DTYPES:
            raise ConfigError(
                field,
                dtype,
                f"unknown dtype{did_you_mean(dtype, DTYPES)}; use {', '.join(DTYPES)}",
            )
        out[str(dtype)] = _positive(f"{field}", tf, f"{dtype} TFLOP/s")
    return out


def _positive(field: str, value: Any, what: str) -> float:
    """`value` as a positive finite number, else one ConfigError naming `field`."""
    if isinstance(value, bool):
        raise ConfigError(field, value, f"give {what} as a positive number")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(field, value, f"give {what} as a positive number") from None
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(field, value, f"give {what} as a positive number")
    return v


def describe_hardware(gpu: str, figures: Mapping[str, Any], arch: str = "") -> HardwareSpec:
    """The `HardwareSpec` of `hardware.gpu` = `gpu` with the `figures` given (TOML names, only
    those given: see the module docstring) and `arch` ('' = not given): a preset with them
    replacing its own, or a new device, which must give every REQUIRED figure. Every fault is
    one ConfigError naming the field."""
    for name in figures:
        if name not in FIGURES:  # (HardwareConfig's own fields are checked by the loader)
            raise ConfigError(
                f"hardware.{name}", figures[name], f"unknown figure{did_you_mean(name, FIGURES)}"
            )
    values: dict[str, Any] = {}
    for name, value in figures.items():
        if name == "peak_tflops":
            values[name] = _peak_table(value)
        else:
            values[name] = _positive(
                f"hardware.{name}", value, f"{name} in {FIGURES[name].unit} (0 = not given)"
            )
            if FIGURES[name].integer and not values[name].is_integer():
                raise ConfigError(f"hardware.{name}", value, "give a whole number")
    if values.get("intra_node_bw_efficiency", 0.0) > 1:
        raise ConfigError(
            "hardware.intra_node_bw_efficiency",
            figures["intra_node_bw_efficiency"],
            "give the achieved share of intra_node_bw_gb_s, in (0, 1]",
        )
    if values.get("fp8_mamf_share", 0.0) > 1.25:
        raise ConfigError(
            "hardware.fp8_mamf_share",
            figures["fp8_mamf_share"],
            "give the fp8 GEMM's share of its peak over bf16's share of its own, in (0, 1.25] "
            "(measured: H100 0.88, MI300X 0.90)",
        )
    parsed = parse_arch(arch) if arch else None
    if arch and parsed is None:
        raise ConfigError(
            "hardware.arch",
            arch,
            "name the device's architecture: 'sm90' (NVIDIA compute capability 9.0), "
            "'gfx942' (an AMD gfx target) or 'cpu'",
        )
    if gpu in HARDWARE_PRESETS:
        base = HARDWARE_PRESETS[gpu]()
        if not values and parsed is None:
            return base
        changes = _changes(values, base)
        if parsed is not None:
            changes["arch"] = parsed
        text = ", ".join(f"{k} = {_show(v)}" for k, v in values.items())
        if parsed is not None:
            text += (", " if text else "") + f"arch = {arch_text(parsed)}"
        return dataclasses.replace(base, **changes, notes=f"{gpu} with {text}")
    missing = [n for n in REQUIRED if n not in values and not (n == "arch" and parsed)]
    if missing:
        have = ", ".join(HARDWARE_PRESETS)
        if len(missing) == len(REQUIRED):  # nothing described: a misspelt preset, most likely
            raise ConfigError(
                "hardware.gpu",
                gpu,
                f"not a preset{did_you_mean(gpu, HARDWARE_PRESETS)}: use one of {have}, or "
                f"describe the device with hardware.{', hardware.'.join(REQUIRED)}",
            )
        raise ConfigError(
            f"hardware.{missing[0]}",
            "not given",
            f"{gpu!r} is no preset, so it is a device described in TOML, which must state "
            f"{', '.join(REQUIRED)}: add {', '.join(missing)} to [hardware] (or set "
            f"hardware.gpu to a preset{did_you_mean(gpu, HARDWARE_PRESETS)})",
        )
    assert parsed is not None  # (arch is required)
    spec = HardwareSpec(
        gpu,
        {},
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        arch=parsed,
        notes=f"{gpu}: described in TOML",
    )
    return dataclasses.replace(spec, **_changes(values, spec))


def _show(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {x:g}" for k, x in v.items()) + "}"
    return f"{v:g}"


def _changes(values: Mapping[str, Any], base: HardwareSpec) -> dict[str, Any]:
    """`dataclasses.replace` arguments setting the given TOML figures on `base`."""
    out: dict[str, Any] = {}
    for name, v in values.items():
        f = FIGURES[name]
        if name == "peak_tflops":
            out[f.attr] = {**base.peak_flops, **{k: x * TFLOPS for k, x in v.items()}}
        elif f.integer:
            out[f.attr] = int(v)
        else:
            out[f.attr] = _to_spec(name, v)
    return out


def figure_value(spec: HardwareSpec, name: str) -> float | None:
    """`spec`'s figure `name` ('memory_gib', 'peak_tflops.bf16') in its TOML unit; None for a
    dtype the device has no rate for."""
    head, _, dtype = name.partition(".")
    f = FIGURES[head]
    raw = getattr(spec, f.attr)
    if head == "peak_tflops":
        return raw[dtype] / TFLOPS if dtype in raw else None
    return raw * f.scale if f.unit == "us" else raw / f.scale


def with_figure(spec: HardwareSpec, name: str, value: float) -> HardwareSpec:
    """`spec` with figure `name` ('intra_node_bw_gb_s', 'peak_tflops.bf16') set to `value`
    in its TOML unit (a `plan --sweep` point); the name keeps the device's."""
    head, _, dtype = name.partition(".")
    f = FIGURES[head]
    if head == "peak_tflops":
        return dataclasses.replace(spec, peak_flops={**spec.peak_flops, dtype: value * TFLOPS})
    v: Any = int(value) if f.integer else _to_spec(head, value)
    return dataclasses.replace(spec, **{f.attr: v})


def spec_figures(spec: HardwareSpec) -> dict[str, Any]:
    """The TOML figures (and arch) that describe `spec`: what `describe_hardware` reads back
    (up to the rounding of a unit conversion)."""
    out: dict[str, Any] = {}
    for name in FIGURES:
        if name == "peak_tflops":
            out[name] = {k: v / TFLOPS for k, v in spec.peak_flops.items()}
        else:
            out[name] = figure_value(spec, name)
    out["arch"] = arch_text(spec.arch)
    return out
