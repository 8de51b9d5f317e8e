import pytest

from scaletrain.parallel.launch import spawn

from ._fns import allreduce_rank, environment_seen, fail_on_rank1

pytestmark = pytest.mark.distributed


def test_spawn_collects_results_per_rank():
    assert spawn(allreduce_rank, 2) == [3.0, 3.0]


def test_spawn_reports_the_failing_rank():
    with pytest.raises(RuntimeError, match="boom on rank 1"):
        spawn(fail_on_rank1, 2)


def test_ranks_see_the_launchers_environment_and_directory_at_each_call(tmp_path, monkeypatch):
    """The ranks fork from a server started at the first call (`launch._start_method`); each
    call's ranks still see the launcher's environment and working directory of that call, as
    spawned ranks would, and the thread count asked for."""
    spawn(allreduce_rank, 2)  # the fork server is running from here on
    for value in ("first", "second"):
        monkeypatch.setenv("SCALETRAIN_LAUNCH_PROBE", value)
        (tmp_path / value).mkdir()
        monkeypatch.chdir(tmp_path / value)
        seen = spawn(environment_seen, 2, "SCALETRAIN_LAUNCH_PROBE", threads=2)
        assert seen == [(value, str(tmp_path / value), 2)] * 2
    monkeypatch.delenv("SCALETRAIN_LAUNCH_PROBE")
    assert spawn(environment_seen, 2, "SCALETRAIN_LAUNCH_PROBE")[0][0] is None
