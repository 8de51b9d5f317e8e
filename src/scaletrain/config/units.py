"""Byte units, and the one formatter every command prints memory with.

The convention (docs/DESIGN.md, "Units"): memory is printed in binary units, KiB / MiB / GiB
(2**10, 2**20, 2**30 bytes), the units `torch.cuda.memory_*`, nvidia-smi and /proc/meminfo
count in, and in which a card sold as "80GB" reads as the 79-80 GiB a user knows from them.
A table uses one unit, chosen by its largest figure (`byte_unit`), and says it in its header;
a figure printed on its own carries its unit (`fmt_bytes`). Decimal units stay where they are
the quoted ones: rates (GB/s, MB/s, as vendors and storage quote them) and the napkin's
textbook arithmetic (`planner/napkin`: the seeds' "7B x 16 B = 112 GB", GB = 1e9 bytes).
Pure Python, no torch.
"""

from __future__ import annotations

__all__ = ["KiB", "MiB", "GiB", "GB", "byte_unit", "fmt_bytes"]

KiB = 1024
MiB = 1024**2
GiB = 1024**3
GB = 1e9
"""Decimal gigabyte: rates (GB/s) and the napkin's textbook figures only (see above)."""

_UNITS = (("GiB", float(GiB)), ("MiB", float(MiB)), ("KiB", float(KiB)))


def byte_unit(largest: float) -> tuple[str, float]:
    """(name, bytes per unit) of the binary unit that keeps `largest` (its magnitude) at 1 or
    more: GiB from 1 GiB up, then MiB, KiB, and B below 1 KiB. A table passes its largest
    figure so every row is printed in the same unit."""
    for name, size in _UNITS:
        if abs(largest) >= size:
            return name, size
    return "B", 1.0


def fmt_bytes(
    n: float,
    *,
    digits: int = 1,
    unit: tuple[str, float] | None = None,
    sign: bool = False,
) -> str:
    """`n` bytes as '3.2 MiB', '79.25 GiB' (digits=2), '+1.5 MiB' (sign=True), in `unit`
    (a `byte_unit` result, for figures that sit beside a table's) or its own unit; whole
    bytes below 1 KiB ('512 B')."""
    name, size = unit if unit is not None else byte_unit(n)
    plus = "+" if sign else ""
    if size == 1.0:
        return f"{n:{plus},.0f} B"
    return f"{n / size:{plus},.{digits}f} {name}"
