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
        dims = ParallelDims.from_layout(
            Layout(tp=dist.get_world_size(), sp=sp),
            dist.get_world_size(),
            CONFIGS[preset],
            seq_len=16,
        )
        dims.build_mesh("cpu")
        model = build_model(CONFIGS[preset])
        parallelize(
            model, dims, precision=PrecisionConfig(dtype="fp32"), memory=MemoryConfig(ac=ac)
        )
        materialize(model, device="cpu", seed=0)
        model.loss_chunk_tokens = chunk
        x, y = batch(preset, 0)
        loss = model(x, targets=y)
        loss.backward()
        head = model.output.weight if model.output is not None else model.tok_embeddings.weight
        out[(preset, sp, chunk, ac)] = {
            "loss": float(loss),
            "loss_type": type(loss).__name__,
            "grads": _grads(model),
            "head_grad_local_rows": head.grad.to_local().shape[0],
        }
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
        dims = ParallelDims.from_layout(
            Layout(tp=dist.get_world_size(), sp=sp),
            dist.get_world_size(),
            CONFIGS[preset],
            seq_len=16,
        )
        dims.build_mesh("cpu")
        model = build_model(CONFIGS[preset])
        parallelize(
            model, dims, precision=PrecisionConfig(dtype="fp32"), memory=MemoryConfig(ac="none")
        )
        materialize(model, device="cpu", seed=0)
        x, y = batch(preset, 0)
        loss = model(x, targets=y)
        mode = _EmbeddingBackwardRows()
        with mode:
            loss.backward()
        out[(preset, sp)] = {
            "loss": float(loss.detach()),
            "grads": _grads(model),
            "backward_rows": mode.rows,
            "grad_local_rows": model.tok_embeddings.weight.grad.to_local().shape[0],
        }
    return out


class _LargestLastDim(TorchDispatchMode):
    """The most elements of any allocated op output whose last dimension is `width` (the
    vocabulary): a (tokens x V) logits tensor, or one chunk's logits in the fused loss."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width, self.most = width, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if any(t is DTensor for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # views (the head's w.t()) allocate nothing
            return out
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == self.width:
                self.most = max(self.most, t.numel())
        return out


def pp_fused_loss(cases: list[tuple[str, str, int, int]]) -> dict:
    """Per (preset, schedule, virtual, chunk): one pipelined step of the global batch in 2
    micro-batches; the loss, this rank's full gradients (the tied pair already summed), and
    the largest (.., V) tensor its stages produced."""
    from ._parity_fns import _build

    out = {}
    for preset, schedule, virtual, chunk in cases:
        layout = Layout(pp=dist.get_world_size(), pp_schedule=schedule, pp_virtual=virtual)
        dims = ParallelDims.from_layout(layout, dist.get_world_size(), CONFIGS[preset], seq_len=16)
        dims.build_mesh("cpu")
        modules, runtime = _build(preset, dims, 2, {})
        for mod in modules:
            mod.loss_chunk_tokens = chunk
        x, y = batch(preset, 0)
        mode = _LargestLastDim(CONFIGS[preset].vocab_size)
        with mode:
            loss = runtime.step(x, y)
        grads = {}
        for mod in modules:
            grads.update(_grads(mod))
        out[(preset, schedule, virtual, chunk)] = {
            "loss": float(loss),
            "grads": grads,
            "largest_vocab_tensor": mode.most,
            "is_last": runtime.is_last,
        }
    return out
