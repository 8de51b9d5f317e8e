"""Rank function of the vocabulary-parallel loss test (module-level: `spawn` pickles it)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from scaletrain.config import Layout, MemoryConfig, PrecisionConfig
from scaletrain.models import build_model, clean_fqn, materialize
from scaletrain.parallel import ParallelDims, parallelize

from ._parity_fns import CONFIGS, batch


def _grads(model) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in model.named_parameters():
        g = p.grad
        out[clean_fqn(n)] = (g.full_tensor() if isinstance(g, DTensor) else g).detach().clone()
    return out


def tp_loss_and_grads(cases: list[tuple[str, bool, int, str]]) -> dict:
    """Per (preset, sp, chunk, ac): the tp-sharded model's fused loss and full gradients, and the
    gradient bytes of the head / embedding weight this rank holds."""
    out = {}
    for preset, sp, chunk, ac in cases:
        dims = ParallelDims.from_layout(Layout(tp=dist.get_world_size(), sp=sp),
                                        dist.get_world_size(), CONFIGS[preset], seq_len=16)
        dims.build_mesh("cpu")
        model = build_model(CONFIGS[preset])
        parallelize(model, dims, precision=PrecisionConfig(dtype="fp32"),
                    memory=MemoryConfig(ac=ac))
        materialize(model, device="cpu", seed=0)
        model.loss_chunk_tokens = chunk
        x, y = batch(preset, 0)
        loss = model(x, targets=y)
        loss.backward()
        head = model.output.weight if model.output is not None else model.tok_embeddings.weight
        out[(preset, sp, chunk, ac)] = {
            "loss": float(loss), "loss_type": type(loss).__name__, "grads": _grads(model),
            "head_grad_local_rows": head.grad.to_local().shape[0]}
    return out


class _EmbeddingBackwardRows(TorchDispatchMode):
    """Records the row count of every token-embedding backward output: the local
    `embedding_dense_backward` calls (DTensor-level calls are handed back to DTensor to
    desugar first) whose indices are (B, T) token ids (positions are 1-D)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if any(t is DTensor for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.embedding_dense_backward.default and args[1].dim() == 2:
            self.rows.append(int(out.shape[0]))
        return out


def tp_embedding_grads(cases: list[tuple[str, bool]]) -> dict:
    """Per (preset, sp): the tp-sharded model's fused loss, full gradients, the rows of the
    embedding gradient this rank holds, and the rows of every embedding-backward output."""
    out = {}
    for preset, sp in cases:
        dims = ParallelDims.from_layout(Layout(tp=dist.get_world_size(), sp=sp),
                                        dist.get_world_size(), CONFIGS[preset], seq_len=16)
        dims.build_mesh("cpu")
        model = build_model(CONFIGS[preset])
        parallelize(model, dims, precision=PrecisionConfig(dtype="fp32"),
                    memory=MemoryConfig(ac="none"))
        materialize(model, device="cpu", seed=0)
        x, y = batch(preset, 0)
        loss = model(x, targets=y)
        mode = _EmbeddingBackwardRows()
        with mode:
            loss.backward()
        out[(preset, sp)] = {
            "loss": float(loss.detach()), "grads": _grads(model), "backward_rows": mode.rows,
            "grad_local_rows": model.tok_embeddings.weight.grad.to_local().shape[0]}
    return out
