"""Record each case's fault class (`@pytest.mark.fault(NAME)`) in the JUnit report, where
benchmarks/faults.py counts per class; an unknown name is a collection error."""

from __future__ import annotations

import pytest

from .classes import CLASSES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for mark in item.iter_markers("fault"):
            (name,) = mark.args
            if name not in CLASSES:
                raise pytest.UsageError(
                    f"{item.nodeid}: fault class {name!r} is not in tests/faults/classes.py"
                )
            item.user_properties.append(("fault_class", name))
