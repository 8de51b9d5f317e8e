"""`count_collectives` on known collectives over 2 real gloo ranks: exact calls and bytes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from scaletrain.measure.comm import count_collectives, ring_bytes_sent
from scaletrain.parallel.launch import spawn

pytestmark = pytest.mark.distributed

F32 = 4


def _known_collectives() -> dict:
    """One call of each entry point; returns this rank's counts as plain data."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    sharded = distribute_tensor(torch.ones(4, 6), mesh, [Shard(0)])  # local (2, 6)
    with count_collectives() as c:
        dist.all_reduce(torch.ones(100))
        dist.all_gather_into_tensor(torch.empty(200), torch.ones(100))
        dist.reduce_scatter_tensor(torch.empty(50), torch.ones(100))
        dist.broadcast(torch.ones(100), src=0)
        # uneven all-to-all: rank 0 keeps 3 rows and sends 1, rank 1 sends 3 and keeps 1
        splits = [3, 1]
        out_splits = [3, 3] if rank == 0 else [1, 1]
        dist.all_to_all_single(
            torch.empty(sum(out_splits), 5),
            torch.ones(4, 5),
            output_split_sizes=out_splits,
            input_split_sizes=splits,
        )
        if rank == 0:
            dist.send(torch.ones(7), dst=1)
        else:
            dist.recv(torch.empty(7), src=0)
        ops = [
            dist.P2POp(dist.isend, torch.ones(3), peer),
            dist.P2POp(dist.irecv, torch.empty(3), peer),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        funcol.wait_tensor(funcol.all_reduce(torch.ones(8), "sum", dist.group.WORLD))
        funcol.wait_tensor(funcol.reduce_scatter_tensor(torch.ones(8), "sum", 0, dist.group.WORLD))
        full = sharded.redistribute(mesh, [Replicate()])  # DTensor -> one all-gather
        dist.reduce(torch.ones(5), dst=0)  # no ring convention: seen, 0 bytes
        dist.barrier()  # no payload: not recorded
    assert full.to_local().shape == (4, 6)
    # collectives issued from C++ inside autograd (DDP's reducer) are seen too
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 10))
    out = ddp(torch.ones(3, 10)).sum()
    with count_collectives() as backward:
        out.backward()
    del ddp, out  # the reducer holds the process group: free it before the group goes
    return {
        "ops": {k: (v.calls, v.bytes_sent, v.received) for k, v in c.by_op.items()},
        "total": c.total_bytes,
        "groups": {g for (_, g, _) in c.by_group},
        "world": dist.group.WORLD.group_name,
        "ddp": {k: (v.calls, v.bytes_sent) for k, v in backward.by_op.items()},
    }


def test_ring_bytes_convention():
    assert ring_bytes_sent("all_reduce", 1000, 4) == 1500  # 2 (n-1)/n
    assert ring_bytes_sent("all_gather", 1000, 4) == 750
    assert ring_bytes_sent("reduce_scatter", 1000, 2) == 500
    assert ring_bytes_sent("send", 1000, 2) == 1000
    assert ring_bytes_sent("recv", 1000, 2) == 0
    assert ring_bytes_sent("all_reduce", 1000, 1) == 0  # a 1-rank group moves nothing


def test_no_collectives_counts_nothing():
    with count_collectives() as c:
        torch.ones(3).sum()
    assert c.total_calls == 0 and c.total_bytes == 0


@pytest.mark.slow
def test_exact_bytes_of_known_collectives_on_two_ranks():
    r0, r1 = spawn(_known_collectives, 2)
    for r in (r0, r1):
        ops = r["ops"]
        # c10d all-reduce of 400 B + funcol all-reduce of 32 B, each 2(n-1)/n = 1x at n = 2
        assert ops["all_reduce"] == (2, 400 + 32, 0)
        # 800 B gathered (half sent) + DTensor Shard(0)->Replicate of a (4, 6) fp32 tensor
        assert ops["all_gather"] == (2, 400 + 4 * 6 * F32 / 2, 0)
        # 400 B reduce-scattered + funcol 32 B: (n-1)/n of the full input
        assert ops["reduce_scatter"] == (2, 200 + 16, 0)
        assert ops["broadcast"] == (1, 200, 0)
        assert ops["other:reduce_"] == (1, 0, 0)
        # send 7 floats (rank 0) or receive them (rank 1), plus one isend/irecv pair of 3 each
        assert r["groups"] == {r["world"]}
    # all-to-all: only the rows addressed to the other rank leave (uneven splits)
    assert r0["ops"]["all_to_all"] == (1, 1 * 5 * F32, 0)
    assert r1["ops"]["all_to_all"] == (1, 3 * 5 * F32, 0)
    assert r0["ops"]["send"] == (2, (7 + 3) * F32, 0)
    assert r0["ops"]["recv"] == (1, 0, 3 * F32)
    assert r1["ops"]["send"] == (1, 3 * F32, 0)
    assert r1["ops"]["recv"] == (2, 0, (7 + 3) * F32)
    assert r0["total"] == 432 + 448 + 216 + 200 + 20 + 40
    # DDP: one bucket all-reduce of the 110 fp32 gradients of Linear(10, 10)
    assert r0["ddp"] == r1["ddp"] == {"all_reduce": (1, 110 * F32)}
