"""One bytes formatter (`config.units`): binary units, one unit per table, every figure labelled
(issue #41 item 6: GB and GiB in one table, `verify` in GB where training spoke MiB)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scaletrain.config import GiB, MiB, byte_unit, fmt_bytes, hardware_preset
from scaletrain.measure.verify import CATEGORIES, Comparison, format_table

SRC = Path(__file__).resolve().parents[2] / "src" / "scaletrain"


@pytest.mark.parametrize(
    "n,unit",
    [
        (0, "B"),
        (1023, "B"),
        (1024, "KiB"),
        (MiB - 1, "KiB"),
        (MiB, "MiB"),
        (GiB - 1, "MiB"),
        (GiB, "GiB"),
        (5000 * GiB, "GiB"),
        (-3 * MiB, "MiB"),  # a negative margin: its magnitude picks the unit
    ],
)
def test_byte_unit_keeps_the_figure_at_one_or_more(n: float, unit: str) -> None:
    assert byte_unit(n)[0] == unit


def test_fmt_bytes_labels_every_figure() -> None:
    assert fmt_bytes(3.2 * MiB) == "3.2 MiB"
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(hardware_preset("h100-sxm").memory_bytes, digits=2) == "79.10 GiB"
    assert fmt_bytes(1.5 * MiB, sign=True) == "+1.5 MiB"
    assert fmt_bytes(-1.5 * MiB, sign=True) == "-1.5 MiB"
    # in a table's unit: small figures are not promoted to their own
    assert fmt_bytes(3 * MiB, digits=3, unit=byte_unit(2 * GiB)) == "0.003 GiB"
    assert fmt_bytes(2048 * GiB) == "2,048.0 GiB"


def _comparison(scale: float) -> Comparison:
    measured = {c: scale * (i + 1) for i, c in enumerate(CATEGORIES)}
    return Comparison(measured=measured, predicted=dict(measured))


def test_verify_table_is_in_one_named_unit() -> None:
    """The default CPU job's tables were 0.003 GB while training printed MiB: the unit now
    follows the table's largest figure, and the header names it."""
    text = format_table(_comparison(3.2 * MiB))
    head = text.splitlines()[0]
    assert "measured MiB" in head and "predicted MiB" in head
    assert "GB" not in text and "GiB" not in text
    rows = {line.split()[0]: line.split() for line in text.splitlines()[1:]}
    assert rows["params"][1] == "3.200"
    assert "measured GiB" in format_table(_comparison(2 * GiB)).splitlines()[0]


def test_no_other_module_formats_bytes_itself() -> None:
    """One home: memory figures go through `config.units`. Divisions by a binary unit, or by
    decimal GB printed as 'GB', are allowed only there and in the napkin verbs (the seeds'
    decimal arithmetic, docs/DESIGN.md "Units"); rates (GB/s, MB/s) are decimal by design."""
    binary = re.compile(r"/ ?(2 ?\*\* ?(20|30)|1024 ?\*\* ?[23]|MiB|GiB)\b")
    decimal = re.compile(r"/ ?(GB|1e9)\b[^\n]*?\}[^\n{]*?\bGB\b(?!/)")
    napkin = ("planner/napkin/", "cli/napkin")
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "config/units.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if binary.search(line) or (decimal.search(line) and not rel.startswith(napkin)):
                offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
