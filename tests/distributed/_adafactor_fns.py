"""Rank functions of the Adafactor sharding tests (module-level, so `spawn` can import them)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from scaletrain.dtensor import is_dtensor
from scaletrain.trainer.adafactor import Adafactor

from ._parity_fns import train_modes

SHAPES = [(7, 5), (6, 4), (3, 5, 4), (9,)]
"""Rows uneven over 2 ranks (7), even ones, a batch of matrices, an uneven vector."""


def sharded_vs_whole(placement: str, beta1: float, steps: int) -> dict[str, float]:
    """`steps` Adafactor steps on float64 parameters sharded by `placement` ('rows': FSDP2's
    Shard(0), 'last': a split of the last dim, as a tensor-parallel column split) over every
    rank, and the same steps on whole plain copies in this process, with the same gradients
    each step. Returns the largest parameter difference per shape, the number of states and
    how many of them are DTensors (DCP saves those sharded)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    gen = torch.Generator().manual_seed(0)  # every rank draws the same values
    whole = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
    dims = [0 if placement == "rows" else len(s) - 1 for s in SHAPES]
    sharded = [
        torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [Shard(d)]))
        for w, d in zip(whole, dims, strict=True)
    ]
    plain = [torch.nn.Parameter(w.clone()) for w in whole]
    kw = {"lr": 0.05, "beta1": beta1, "weight_decay": 0.1}
    opt_s, opt_p = Adafactor(sharded, **kw), Adafactor(plain, **kw)
    for _ in range(steps):
        for s, p, d in zip(sharded, plain, dims, strict=True):
            g = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.grad = g.clone()
            s.grad = distribute_tensor(g.clone(), mesh, [Shard(d)])
        opt_s.step()
        opt_p.step()
    out = {
        str(shape): float((s.detach().full_tensor() - p.detach()).abs().max())
        for shape, s, p in zip(SHAPES, sharded, plain, strict=True)
    }
    states = [v for st in opt_s.state.values() for k, v in st.items() if k != "step"]
    out["states"] = len(states)
    out["dtensor_states"] = sum(is_dtensor(v) for v in states)
    return out


def adafactor_suite(modes: dict[str, tuple], steps: int) -> dict:
    """`train_modes(modes)` (the parity runs), then `sharded_vs_whole` for each placement and
    beta1 (0: no first moment; 0.9), keyed 'placement/beta1': one spawn for both."""
    out = {"modes": train_modes(modes)}
    for placement in ("rows", "last"):
        for beta1 in (0.0, 0.9):
            out[f"{placement}/{beta1}"] = sharded_vs_whole(placement, beta1, steps)
    return out
