"""The pure rules of the hang watchdog and the straggler report, and the monitor's config."""

from __future__ import annotations

import pytest

from scaletrain.config import ConfigError, load_config
from scaletrain.trainer.stragglers import find_stragglers
from scaletrain.trainer.watchdog import RankEvidence, step_limit, stuck_ranks


def test_step_limit_is_the_timeout_until_the_median_times_factor_exceeds_it():
    assert step_limit(timeout_s=10, factor=5, step_times=[]) == 10
    assert step_limit(timeout_s=10, factor=5, step_times=[1, 1, 100]) == 10  # median 1
    assert step_limit(timeout_s=10, factor=5, step_times=[3, 4, 100]) == 20  # median 4


def _ev(rank, where="collective", seq=None):
    return RankEvidence(rank=rank, step=7, elapsed_s=30.0, where=where, collective_seq=seq or {})


def test_stuck_ranks_rules_in_order():
    # a rank that wrote nothing is named first, whatever the others say
    assert stuck_ranks({0: _ev(0, "data")}, 2)[0] == [1]
    # behind in the world group's collectives (no record at all counts as none issued)
    ev = {
        0: _ev(0, seq={"0/default_pg": 12}),
        1: _ev(1, "compute"),
        2: _ev(2, seq={"0/default_pg": 12}),
    }
    assert stuck_ranks(ev, 3) == ([1], "behind its peers' collectives (flight recorder)")
    # a subgroup only counts the ranks that reported it
    ev = {0: _ev(0, seq={"3/dp": 5}), 1: _ev(1, seq={"4/dp": 2})}
    assert stuck_ranks(ev, 2)[0] == [0, 1]  # falls through to "all wait in collectives"
    ev = {0: _ev(0), 1: _ev(1, "data"), 2: _ev(2, "compute")}
    assert stuck_ranks(ev, 3)[0] == [1]  # data before compute
    ev = {0: _ev(0), 1: _ev(1, "compute")}
    assert stuck_ranks(ev, 2) == ([1], "busy outside collectives")
    assert stuck_ranks({0: _ev(0), 1: _ev(1)}, 2)[1].startswith("every rank waits")


def test_find_stragglers_step_time_data_wait_and_noise():
    got = find_stragglers(step_s=[1.0, 1.0, 1.6, 1.0], data_wait_s=[0.0] * 4, factor=1.5)
    assert list(got) == [2] and "step 1.600 s" in got[2]
    got = find_stragglers(step_s=[1.0] * 3, data_wait_s=[0.01, 0.01, 0.3], factor=1.5)
    assert list(got) == [2] and "data wait 0.300 s" in got[2]
    # 10x the median wait, but 1% of a step: noise
    assert find_stragglers(step_s=[1.0] * 3, data_wait_s=[0.001, 0.001, 0.01], factor=1.5) == {}


@pytest.mark.parametrize(
    "override",
    [
        "--monitor.watchdog_timeout_s=-1",
        "--monitor.watchdog_factor=0.5",
        "--monitor.straggler_every=-2",
        "--monitor.straggler_factor=1",
    ],
)
def test_monitor_config_rejects_bad_values_naming_the_field(override):
    with pytest.raises(ConfigError, match=override.split("=")[0][2:]):
        load_config(None, [override])


def test_watchdog_stands_down_when_its_loop_raised(tmp_path):
    import sys

    from scaletrain.trainer.watchdog import Watchdog

    wd = Watchdog(tmp_path, rank=0, world_size=1, timeout_s=2.0, factor=1.0, poll_s=0.02)

    def loop():
        wd.begin(1, loop_frame=sys._getframe())
        raise RuntimeError("step failed")

    with pytest.raises(RuntimeError):
        loop()
    wd._thread.join(timeout=1.0)  # well before the 2 s limit would end this process
    alive = wd._thread.is_alive()
    wd.close()
    assert not alive and not (tmp_path / "watchdog").exists()


def test_heartbeat_rate_limits_running_beats_only(tmp_path):
    import json

    from scaletrain.trainer.watchdog import Heartbeat

    hb = Heartbeat(tmp_path, rank=3, enabled=True)
    hb.beat(step=0, state="started")
    hb.beat(step=1, state="running")
    hb.beat(step=2, state="running")  # within MIN_INTERVAL_S of the last: not written
    assert json.loads(hb.path.read_text())["step"] == 1
    hb.beat(step=2, state="exited")
    got = json.loads(hb.path.read_text())
    assert (got["rank"], got["step"], got["state"]) == (3, 2, "exited")
