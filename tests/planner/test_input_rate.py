"""The input rate in the plan (`planner.time.input_rate`): replicas per node counted as the
trainer's mesh places ranks, the storage bytes per node, the `[hardware]` bandwidth and the
margin `explain` prints."""

from __future__ import annotations

import math

import pytest

from scaletrain.config import GB, Layout, load_config, resolve_model
from scaletrain.planner import estimate
from scaletrain.planner.time.input_rate import PAGE_BYTES, input_rate, replicas_per_node
from scaletrain.planner.types import plan_input_from_job


def _brute(dp, tp, cp, pp, g) -> int:
    """Replica index of every rank by the mesh (pp, dp, cp, tp), tp innermost, counted per
    node of g consecutive ranks."""
    world = dp * tp * cp * pp
    coords = {}
    r = 0
    for _pp in range(pp):
        for d in range(dp):
            for _cp in range(cp):
                for _tp in range(tp):
                    coords[r] = d
                    r += 1
    return max(len({coords[r] for r in range(s, min(s + g, world))}) for s in range(0, world, g))


@pytest.mark.parametrize(
    "dp,tp,cp,pp,g",
    [
        (64, 1, 1, 1, 8),
        (8, 8, 1, 1, 8),
        (4, 2, 2, 2, 8),
        (2, 16, 1, 2, 8),  # a replica spans two nodes
        (6, 4, 1, 1, 8),  # 3 nodes, the middle one holds ranks of 2 replicas
        (3, 1, 1, 1, 8),  # fewer GPUs than a node
        (16, 2, 3, 1, 72),  # NVL72
    ],
)
def test_replicas_per_node_follow_the_mesh(dp, tp, cp, pp, g):
    world = dp * tp * cp * pp
    got = replicas_per_node(dp=dp, tp=tp, cp=cp, world=world, gpus_per_node=g)
    assert got == _brute(dp, tp, cp, pp, g)


def _job(*overrides):
    return load_config(None, ["--model.name=llama2-7b", "--hardware.gpu=h100-sxm", *overrides])


def test_storage_bytes_per_node_and_margin():
    job = _job("--batch.seq_len=4096", "--batch.global_batch=64", "--batch.micro_batch=1")
    layout = Layout(dp=64)
    est = estimate(plan_input_from_job(job, layout))
    r = input_rate(est)
    assert resolve_model("llama2-7b").vocab_size < 65536 and r.bytes_per_token == 2
    assert r.replicas_per_node == 8 and r.replica_tokens_per_s == est.tokens_per_s / 64
    # a window: 4097 uint16 ids = 8194 bytes = 2.0005 pages, plus one page on average
    assert r.window_bytes == pytest.approx((8194 / PAGE_BYTES + 1) * PAGE_BYTES)
    windows = 8 * est.tokens_per_s / 64 / 4096
    assert r.node_bytes_per_s == pytest.approx(windows * r.window_bytes)
    assert r.storage_bytes_per_s == 4 * GB and r.margin == pytest.approx(
        4 * GB / r.node_bytes_per_s
    )
    slow = _job("--hardware.storage_gb_per_s=0.001", "--batch.seq_len=4096")
    r2 = input_rate(estimate(plan_input_from_job(slow, layout)))
    assert r2.storage_bytes_per_s == 1e6 and math.isfinite(r2.margin)


def test_explain_prints_the_input_rate_and_its_margin(capsys):
    from scaletrain.cli import main

    argv = ["explain", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16"]
    argv += ["--dp", "2", "--tp", "8", "--seq-len", "8192", "--global-batch", "16"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "input per node = replicas on the node x tokens/s per dp replica = 1 x" in out
    assert "(4 B ids, seq_len + 1 per window" in out  # vocabulary 128,256: uint32
    assert "storage bandwidth per node 4 GB/s" in out and "margin" in out
    assert main([*argv, "--storage-gb-per-s", "0.00001"]) == 0
    assert "the GPUs would wait for data" in capsys.readouterr().out
