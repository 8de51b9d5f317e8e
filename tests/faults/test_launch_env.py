"""The launcher's environment: a wrong RANK / WORLD_SIZE / LOCAL_RANK / MASTER_* is one line
naming the variable before any process group is joined; a WORLD_SIZE with no peer, or a rank
with no rank 0, is one line after train.rendezvous_timeout_s instead of a hang."""

from __future__ import annotations

import time

import pytest

from scaletrain.config import ConfigError
from scaletrain.config.launch_env import launch_env
from scaletrain.parallel.launch import free_port

from ._cli import no_traceback, scaletrain, tiny_job

OK = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}

BAD_ENV = [  # (environment, the variable the error must name)
    ({"WORLD_SIZE": "x"}, "WORLD_SIZE"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
    ({"WORLD_SIZE": "-2"}, "WORLD_SIZE"),
    ({"WORLD_SIZE": "2.0"}, "WORLD_SIZE"),
    ({"WORLD_SIZE": ""}, "WORLD_SIZE"),
    ({"WORLD_SIZE": "1e3"}, "WORLD_SIZE"),
    ({"WORLD_SIZE": "2", "RANK": "2", **OK}, "RANK"),
    ({"WORLD_SIZE": "2", "RANK": "7", **OK}, "RANK"),
    ({"RANK": "1"}, "RANK"),
    ({"RANK": "-1"}, "RANK"),
    ({"RANK": "zero"}, "RANK"),
    ({"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "-1", **OK}, "LOCAL_RANK"),
    ({"LOCAL_RANK": "a"}, "LOCAL_RANK"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": " "}, "MASTER_ADDR"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT"),
    ({"WORLD_SIZE": "2", "RANK": "0", **OK, "MASTER_PORT": "0"}, "MASTER_PORT"),
    ({"WORLD_SIZE": "2", "RANK": "0", **OK, "MASTER_PORT": "70000"}, "MASTER_PORT"),
    ({"WORLD_SIZE": "2", "RANK": "0", **OK, "MASTER_PORT": "http"}, "MASTER_PORT"),
]


@pytest.mark.parametrize(("env", "var"), BAD_ENV)
def test_bad_launch_env_is_one_line_naming_the_variable(env, var):
    with pytest.raises(ConfigError) as e:
        launch_env(env)
    assert e.value.field == var and "\n" not in str(e.value)
    assert "torchrun" in str(e.value) or "MASTER_PORT" in str(e.value)


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, (0, 1, 0)),
        ({"WORLD_SIZE": "1"}, (0, 1, 0)),
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", **OK}, (1, 2, 1)),
    ],
)
def test_good_launch_env(env, want):
    e = launch_env(env)
    assert (e.rank, e.world_size, e.local_rank) == want


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rank", "var", "said"),
    [
        (0, "WORLD_SIZE", "only 1 of 2 ranks"),  # WORLD_SIZE=2 with no peer
        (1, "MASTER_ADDR", "reached no rank 0"),  # a rank whose rank 0 never starts
    ],
)
def test_missing_peer_is_one_line_after_the_timeout_not_a_hang(tmp_path, rank, var, said):
    t0 = time.monotonic()
    p = scaletrain(
        "train",
        *tiny_job(tmp_path, "run", "--train.rendezvous_timeout_s=2"),
        timeout=90,
        extra_env={
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        },
    )
    assert p.returncode == 2 and no_traceback(p), p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and var in err[0] and said in err[0], err
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "1e9", "x"])
def test_rendezvous_timeout_is_checked(value):
    from scaletrain.config import load_config

    with pytest.raises(ConfigError) as e:
        load_config(None, [f"--train.rendezvous_timeout_s={value}"])
    assert e.value.field == "train.rendezvous_timeout_s"
