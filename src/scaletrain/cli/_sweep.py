"""`plan --sweep hardware.FIELD=V1,V2,...`: the same job planned on one device with one figure
changed per point (Calculon's co-design question: what would 2x the NVLink bandwidth buy?).

A value is a number in the field's TOML unit (`config.hardware_toml.FIGURES`: GB/s, GiB,
TFLOP/s, us, ...) or a multiple of the device's own figure ('2x', '0.5x'). The fields are the
`[hardware]` figures, and `peak_tflops.<dtype>` for one dtype's rate. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import ConfigError, HardwareSpec
from scaletrain.config.hardware_toml import DTYPES, FIGURES, figure_unit, figure_value
from scaletrain.config.strict import did_you_mean

__all__ = ["Sweep", "SweepPoint", "parse_sweep", "MAX_POINTS"]

MAX_POINTS = 16
"""Points of one sweep (each is a full search)."""


@dataclass(frozen=True)
class SweepPoint:
    label: str
    """As the user wrote it ('2x', '900')."""
    value: float
    """In the field's TOML unit."""


@dataclass(frozen=True)
class Sweep:
    field: str
    """The figure without 'hardware.': 'intra_node_bw_gb_s', 'peak_tflops.bf16'."""
    base: float
    """The device's own figure, in its unit."""
    unit: str
    points: tuple[SweepPoint, ...]


def _fields() -> list[str]:
    return [f for f in FIGURES if f != "peak_tflops"] + [f"peak_tflops.{d}" for d in DTYPES]


def parse_sweep(text: str, spec: HardwareSpec) -> Sweep:
    """`hardware.FIELD=V1,V2,...` against the plan's device `spec`; every fault one line."""
    flag = "--sweep"
    key, eq, values = text.partition("=")
    key = key.strip()
    if not eq or not values.strip():
        raise ConfigError(
            flag, text, "write hardware.FIELD=V1,V2,... e.g. hardware.intra_node_bw_gb_s=1x,2x,4x"
        )
    section, dot, name = key.partition(".")
    if section != "hardware" or not dot:
        raise ConfigError(
            flag,
            text,
            f"only [hardware] figures are swept: write hardware.{key if not dot else name}=... "
            f"(fields: {', '.join(_fields())})",
        )
    if name == "peak_tflops":
        raise ConfigError(
            flag, text, f"name one dtype: hardware.peak_tflops.bf16=... ({', '.join(DTYPES)})"
        )
    if name not in _fields():
        raise ConfigError(
            flag,
            text,
            f"unknown figure{did_you_mean(name, _fields())}; sweep one of {', '.join(_fields())}",
        )
    base = figure_value(spec, name)
    if base is None:
        raise ConfigError(
            flag,
            text,
            f"{spec.name} has no {name.split('.')[1]} rate to sweep: give it in "
            "hardware.peak_tflops, or sweep another dtype",
        )
    points: list[SweepPoint] = []
    for raw in (v.strip() for v in values.split(",")):
        if not raw:
            continue
        times = raw.lower().endswith("x")
        try:
            num = float(raw[:-1] if times else raw)
        except ValueError:
            raise ConfigError(flag, raw, "give a number or a multiple such as 2x") from None
        if not num > 0 or num == float("inf"):
            raise ConfigError(flag, raw, "give a positive value (or a multiple such as 2x)")
        value = base * num if times else num
        if FIGURES[name.split(".")[0]].integer and not float(value).is_integer():
            raise ConfigError(flag, raw, f"{name} is a whole number: {base:g} x {num:g} is not")
        points.append(SweepPoint(raw, value))
    if not 1 <= len(points) <= MAX_POINTS:
        raise ConfigError(flag, text, f"give 1 to {MAX_POINTS} values")
    return Sweep(name, base, figure_unit(name), tuple(points))
