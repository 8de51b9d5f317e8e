"""Rank functions for the data/tensor-parallel parity tests (module-level: spawn pickles them).

Each mode trains the same tiny model for a few AdamW steps on its share of one fixed global
batch and returns per-step losses and gradient norms, the final full parameters, and the
per-rank bytes of parameters / gradients / optimizer states (see `_train`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from scaletrain.config import MODEL_PRESETS, Layout, MemoryConfig, PrecisionConfig
from scaletrain.models import build_model, causal_lm_loss, clean_fqn, materialize
from scaletrain.parallel import (
    ParallelDims,
    clip_grad_norm_,
    local_state_bytes,
    loss_context,
    maybe_no_sync,
    parallelize,
    wrap_optimizer,
)

STEPS, LR, MAX_NORM = 3, 1e-3, 0.5
GLOBAL_BATCH, SEQ_LEN = 4, 16


def batch(preset: str, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: tokens and shifted targets, (GLOBAL_BATCH, SEQ_LEN) each."""
    vocab = MODEL_PRESETS[preset]().vocab_size
    g = torch.Generator().manual_seed(1000 + step)
    seq = torch.randint(0, vocab, (GLOBAL_BATCH, SEQ_LEN + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def reference(preset: str) -> dict:
    """Single process, full batch, no accumulation: the numbers every mode must reproduce."""
    torch.manual_seed(0)
    model = build_model(MODEL_PRESETS[preset](), device="cpu", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for step in range(STEPS):
        x, y = batch(preset, step)
        loss = causal_lm_loss(model(x), y)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    params = {clean_fqn(n): p.detach().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "norms": norms, "params": params}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _block_param_bytes(model) -> int:
    return sum(p.to_local().numel() * 4 if isinstance(p, DTensor) else p.numel() * 4
               for p in model.layers.parameters())


def _train(preset: str, layout: dict, accum: int, opts: dict | None = None) -> dict:
    """opts: precision dtype `dtype`, memory `offload` / `ac`, `loss_parallel` (default on)."""
    opts = opts or {}
    cfg = MODEL_PRESETS[preset]()
    dims = ParallelDims.from_layout(Layout(**layout), dist.get_world_size(), cfg,
                                    seq_len=SEQ_LEN)
    dims.build_mesh("cpu")
    model = build_model(cfg)  # meta
    parallelize(model, dims, precision=PrecisionConfig(dtype=opts.get("dtype", "fp32")),
                memory=MemoryConfig(ac=opts.get("ac", "none"),
                                    offload=opts.get("offload", "none")),
                loss_parallel=opts.get("loss_parallel", True))
    materialize(model, device="cpu", seed=0)
    opt = wrap_optimizer(torch.optim.AdamW, model.parameters(), dims, lr=LR)
    tp_mesh = dims.submesh("tp")
    losses, norms, mem = [], [], {}
    for step in range(STEPS):
        x, y = batch(preset, step)
        x, y = x.chunk(dims.dp_size)[dims.dp_rank], y.chunk(dims.dp_size)[dims.dp_rank]
        total = torch.zeros(())
        for i, (xm, ym) in enumerate(zip(x.chunk(accum), y.chunk(accum), strict=True)):
            with maybe_no_sync(model, i == accum - 1):
                logits = model(xm)
                mem["block_params_after_forward"] = _block_param_bytes(model)
                with loss_context(tp_mesh, enabled=opts.get("loss_parallel", True)):
                    loss = causal_lm_loss(logits, ym) / accum
                    loss.backward()
            total += _full(loss).detach()
        dist.all_reduce(total, group=dims.submesh("dp").get_group())
        losses.append(float(total) / dims.dp_size)
        mem["grads"] = local_state_bytes(model)["grads"]
        norms.append(float(clip_grad_norm_(model.parameters(), MAX_NORM)))
        opt.step()
        opt.zero_grad()
    after = local_state_bytes(model, opt)
    mem["params_at_rest"], mem["optimizer"] = after["params"], after["optimizer"]
    params = {clean_fqn(n): _full(p).detach().clone() for n, p in model.named_parameters()}
    dtypes = sorted({str(_full(p).dtype) for p in model.parameters()})
    meshes = {n: (dims.submesh(n).size(), dims.submesh(n).get_local_rank())
              for n in ("dp", "dp_shard_cp", "dp_cp", "tp")}
    return {"losses": losses, "norms": norms, "params": params, "mem": mem, "meshes": meshes,
            "logits_type": type(logits).__name__, "param_dtypes": dtypes}


def train_modes(runs: list[tuple]) -> dict:
    """Run each (name, preset, layout, accum[, opts]) in turn; results keyed by name."""
    return {run[0]: _train(*run[1:]) for run in runs}


def moe_under_tp_error() -> str:
    """The ConfigError raised when tensor parallelism meets an MoE model."""
    from scaletrain.config import ConfigError

    dims = ParallelDims.from_layout(Layout(tp=2), dist.get_world_size())
    dims.build_mesh("cpu")
    try:
        parallelize(build_model(MODEL_PRESETS["tiny-moe"]()), dims,
                    precision=PrecisionConfig(), memory=MemoryConfig())
    except ConfigError as e:
        return str(e)
    return "no error"


def options_suite(runs: list[tuple]) -> dict:
    """`train_modes(runs)` plus the MoE x TP refusal message, in one spawn."""
    out = train_modes(runs)
    out["moe_tp_error"] = moe_under_tp_error()
    return out


def world4_suite(runs: list[tuple]) -> dict:
    """`train_modes(runs)` plus the ranks of this rank's expert-parallel group for ep=2."""
    out = train_modes(runs)
    dims = ParallelDims.from_layout(Layout(dp=4, zero=3, ep=2), dist.get_world_size())
    dims.build_mesh("cpu")
    out["ep_group"] = dist.get_process_group_ranks(dims.submesh("ep").get_group())
    return out
