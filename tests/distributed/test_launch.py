import pytest

from scaletrain.parallel.launch import spawn

from ._fns import allreduce_rank, fail_on_rank1

pytestmark = pytest.mark.distributed


def test_spawn_collects_results_per_rank():
    assert spawn(allreduce_rank, 2) == [3.0, 3.0]


def test_spawn_reports_the_failing_rank():
    with pytest.raises(RuntimeError, match="boom on rank 1"):
        spawn(fail_on_rank1, 2)
