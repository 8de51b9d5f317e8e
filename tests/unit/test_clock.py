"""`scaletrain.clock`: exclusive nested phases, switching, and the running phase in totals."""

from __future__ import annotations

import pytest

from scaletrain import clock


@pytest.fixture
def fake_time(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(clock.time, "perf_counter", lambda: now[0])
    clock.reset()
    yield now
    clock.reset()


def test_nested_phase_pauses_the_outer_one(fake_time):
    with clock.phase("setup"):
        fake_time[0] += 1.0
        with clock.phase("data"):
            fake_time[0] += 2.0
        fake_time[0] += 4.0
    assert clock.totals() == {"setup": 5.0, "data": 2.0}


def test_switch_and_running_phase(fake_time):
    with clock.phase("setup"):
        fake_time[0] += 1.0
        clock.switch("steps")
        fake_time[0] += 3.0
        with clock.phase("eval"):
            fake_time[0] += 0.5
        fake_time[0] += 0.25
        # the running phase counts up to now
        assert clock.totals() == {"setup": 1.0, "steps": 3.25, "eval": 0.5}
    assert clock.totals() == {"setup": 1.0, "steps": 3.25, "eval": 0.5}


def test_an_exception_closes_every_phase(fake_time):
    with pytest.raises(RuntimeError), clock.phase("outer"):
        fake_time[0] += 1.0
        with clock.phase("inner"):
            fake_time[0] += 1.0
            raise RuntimeError("boom")
    fake_time[0] += 7.0  # no phase open: not counted anywhere
    assert clock.totals() == {"outer": 1.0, "inner": 1.0}
