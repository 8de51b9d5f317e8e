"""Every fault class of classes.py has at least one case in tests/faults/, and every case's
class is one of them (benchmarks/faults.py reports the counts per class)."""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path

from .classes import CLASSES


def _marks(obj: object) -> list:
    marks = getattr(obj, "pytestmark", [])
    return marks if isinstance(marks, list) else [marks]


def class_counts() -> Counter:
    """Test functions per fault class over tests/faults/test_*.py (a parametrized function
    counts once here; the benchmark counts its cases)."""
    counts: Counter = Counter()
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        mod = importlib.import_module(f"{__package__}.{path.stem}")
        module_marks = [m.args[0] for m in _marks(mod) if m.name == "fault"]
        for name, fn in vars(mod).items():
            if name.startswith("test_") and callable(fn):
                own = [m.args[0] for m in _marks(fn) if m.name == "fault"]
                for cls in own or module_marks:
                    counts[cls] += 1
    return counts


def test_every_class_has_a_case_and_every_case_a_known_class():
    counts = class_counts()
    assert not set(counts) - set(CLASSES), set(counts) - set(CLASSES)
    missing = [c for c in CLASSES if not counts[c]]
    assert not missing, f"fault classes without a case: {missing}"
