"""Rank function of the sequence-parallel RMSNorm test (module-level: `spawn` pickles it)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

from scaletrain.config import Layout, MemoryConfig, PrecisionConfig
from scaletrain.models import build_model, clean_fqn, materialize
from scaletrain.models.norms import RMSNorm
from scaletrain.parallel import ParallelDims, parallelize
from scaletrain.parallel.ac import apply_ac

from ._parity_fns import CONFIGS, SEQ_LEN, batch

SHAPE, EPS = (2, 16, 64), 1e-5  # (B, T, h): T splits over the ranks


def norm_case(seed: int = 0):
    """The full bf16 input, weight and output gradient every rank and the reference use."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(SHAPE, generator=g) * 3).to(torch.bfloat16)
    w = (1 + 0.5 * torch.randn(SHAPE[-1], generator=g)).to(torch.bfloat16)
    dy = torch.randn(SHAPE, generator=g).to(torch.bfloat16)
    return x, w, dy


class _Layers(nn.Module):
    """The one attribute `apply_ac` reads: `layers`, here holding the norm alone."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({"0": norm})


def run_norm(norm, x, dy, ac: str):
    """Forward (under `ac`: none | selective | full, the trainer's checkpoint wrappers of
    parallel/ac.py) and backward of one norm; returns the output and the saved tensors'
    (dtype, local shape); the gradients land in x.grad and the norm's weight."""
    saved = []

    def pack(t):
        loc = t.to_local() if isinstance(t, DTensor) else t
        saved.append((str(loc.dtype), tuple(loc.shape)))
        return t

    holder = _Layers(norm)
    apply_ac(holder, ac)  # type: ignore[arg-type]  # apply_ac reads `.layers` only
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = holder.layers["0"](x)
    local = y.to_local() if isinstance(y, DTensor) else y
    local.backward(dy)
    return y, saved


def sp_norm(acs: list[str]) -> dict:
    """Per ac: this rank's output slice, x gradient slice, the full weight gradient and what
    the norm saved, for a SequenceParallel (Shard(1)) bf16 RMSNorm over the tp ranks."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rank, world = dist.get_rank(), dist.get_world_size()
    x, w, dy = norm_case()
    x_l, dy_l = (t.chunk(world, dim=1)[rank].contiguous() for t in (x, dy))
    out = {}
    for ac in acs:
        norm = RMSNorm(SHAPE[-1], EPS).to(torch.bfloat16)
        with torch.no_grad():
            norm.weight.copy_(w)
        parallelize_module(norm, mesh, SequenceParallel())
        xr = x_l.clone().requires_grad_()
        y, saved = run_norm(norm, xr, dy_l, ac)
        gw = norm.weight.grad
        out[ac] = {
            "y": y.to_local().detach(),
            "y_placements": str(y.placements),
            "gx": xr.grad,
            "gw": gw.full_tensor() if isinstance(gw, DTensor) else gw,
            "saved": saved,
        }
    return out


def sp_model_bf16(acs: list[str]) -> dict:
    """Per ac: loss and full gradients of tiny-llama under tp = world with sequence
    parallelism, its parameters cast to bf16 (a 16-bit residual stream, as FSDP2's
    mixed precision gives: the norms take `_RMSNorm16`'s DTensor path)."""
    out = {}
    for ac in acs:
        dims = ParallelDims.from_layout(
            Layout(tp=dist.get_world_size(), sp=True),
            dist.get_world_size(),
            CONFIGS["tiny-llama"],
            seq_len=SEQ_LEN,
        )
        dims.build_mesh("cpu")
        model = build_model(CONFIGS["tiny-llama"])
        parallelize(
            model, dims, precision=PrecisionConfig(dtype="fp32"), memory=MemoryConfig(ac=ac)
        )
        materialize(model, device="cpu", seed=0)
        model.to(torch.bfloat16)
        x, y = batch("tiny-llama", 0)
        loss = model(x, targets=y)
        loss.backward()
        grads = {}
        for n, p in model.named_parameters():
            g = p.grad
            grads[clean_fqn(n)] = (g.full_tensor() if isinstance(g, DTensor) else g).detach()
        out[ac] = {"loss": float(loss.detach()), "grads": grads}
    return out


def sp_suite(acs: list[str]) -> dict:
    return {"norm": sp_norm(acs), "model": sp_model_bf16(acs)}
