"""Tensor and sequence parallelism (Megatron-LM, Shoeybi et al. 2019; Korthikanti et al. 2022)
with DTensor `parallelize_module` plans.

Per block: wq/wk/wv column-wise (whole query and key/value heads per rank, so GQA needs tp to
divide num_kv_heads), wo row-wise; MLP w1/w3 column-wise, w2 row-wise. One all-reduce (or, with
sp, one all-gather + one reduce-scatter) per sub-layer in forward, as many in backward.

Sequence parallel (sp): the residual stream between sub-layers is sharded on the sequence dim
(Shard(1)): norms run on T/tp tokens (`SequenceParallel`), `PrepareModuleInput` all-gathers
the norm output to Replicate before attention / MLP, and the row-wise wo/w2 reduce-scatter
back to Shard(1).

Embeddings: vocabulary-sharded (row-wise), output Replicate, or Shard(1) with sp. Learned
position embeddings are sharded the same way; their output (T, h) is sharded on dim 0 so it adds
to the local (B, T/tp, h) token embeddings — positions must then be the default 1-D ids.

Training loss: `model(x, targets=y)` never forms the logits; `vocab_parallel_head_loss` runs
the fused chunked cross-entropy (models/loss.py) on this rank's V/tp head rows with the row max,
sum of exponentials and target logit all-reduced over tp. The plans below still serve the
logits path (generation, evaluation tools, a pipeline's last stage).

Head: column-wise (vocabulary-sharded logits). With `loss_parallel=True` the model returns a
DTensor of logits sharded on the vocabulary dim and the loss must be computed and
back-propagated inside `loss_context(...)` (torch's `loss_parallel`: cross-entropy without
gathering the (B, T, V) logits). With `loss_parallel=False` logits are all-gathered to a plain
(B, T, V) tensor. Tied embeddings (GPT-2): the head is `F.linear(h, tok_embeddings.weight)` in
the model; the final norm's output is made a Replicate DTensor so that product is a vocabulary-
sharded DTensor, the same layout as the untied head.

MoE layers are not tensor-parallel here: `config.layout_problems` refuses tp > 1 for MoE models
(use parallel.ep: experts split whole over ranks); the head-count rules live there too.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from scaletrain.models.loss import VocabShard, linear_cross_entropy

__all__ = ["apply_tp", "loss_context", "vocab_parallel_head_loss"]


def _root_plan(model: nn.Module, sp: bool, loss_parallel_: bool) -> dict:
    seq = Shard(1) if sp else Replicate()
    plan: dict = {}
    if getattr(model, "tok_embeddings", None) is not None:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if getattr(model, "pos_embeddings", None) is not None:
        # positions (T,) -> (T, h): the sequence is dim 0 of this output.
        plan["pos_embeddings"] = RowwiseParallel(input_layouts=Replicate(),
                                                 output_layouts=Shard(0) if sp else Replicate())
    if getattr(model, "norm", None) is not None and sp:
        plan["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        plan["output"] = ColwiseParallel(
            input_layouts=seq, output_layouts=Shard(-1) if loss_parallel_ else Replicate(),
            use_local_output=not loss_parallel_)
    return plan


def _block_plan(sp: bool) -> dict:
    seq = Shard(1) if sp else Replicate()
    plan: dict = {
        # The block input stays a Replicate DTensor (use_local_output=False) so that wq, wk, wv
        # (and w1, w3) share it: their partial input gradients are summed locally and reduced
        # once at this boundary. A local tensor here would give each column-wise linear its own
        # backward all-reduce (5 per layer instead of 2; counted by benchmarks/comm_volume.py).
        "attention": PrepareModuleInput(input_layouts=(seq, None, None),
                                        desired_input_layouts=(Replicate(), None, None),
                                        use_local_output=False),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq),
        "feed_forward": PrepareModuleInput(input_layouts=(seq,),
                                           desired_input_layouts=(Replicate(),),
                                           use_local_output=False),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=seq),
    }
    if sp:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
    return plan


def _slice_embedding_grad(module: nn.Module, args: object) -> None:
    """Forward pre-hook of the vocab-parallel embedding: make its weight's gradient arrive in
    the weight's own placement.

    DTensor's embedding backward, with replicated token ids and output gradient, computes the
    full-vocabulary gradient on every rank and returns it Replicate; kept as is, the sharded
    weight would hold a V x h gradient at rest (tp times its shard; seen as 256 x 64 for a
    128 x 64 shard at tp 2). The hook slices it before it accumulates (local, no
    communication). It is attached to the parameter at its first forward, because
    `materialize` (to_empty) replaces DTensor parameter objects after parallelization.
    """
    w = module.weight
    if isinstance(w, DTensor) and not getattr(w, "_grad_sliced", False):
        w.register_hook(lambda g: g.redistribute(w.device_mesh, w.placements)
                        if isinstance(g, DTensor) and g.placements != w.placements else g)
        w._grad_sliced = True  # type: ignore[attr-defined]


def apply_tp(model: nn.Module, mesh: DeviceMesh, *, sp: bool, loss_parallel: bool = True
             ) -> nn.Module:
    """Shard `model` over the 1-D tp `mesh` in place (degree 1: no-op); see module docstring."""
    tp = mesh.size()
    if tp == 1:
        return model
    if sp and hasattr(model, "input_seq_shards"):
        model.input_seq_shards = tp  # a later pipeline stage receives T/tp of the sequence
    parallelize_module(model, mesh, _root_plan(model, sp, loss_parallel))
    tied = getattr(model, "output", None) is None and getattr(model, "tie_embeddings", False)
    if tied and getattr(model, "norm", None) is not None:
        # Make the head's input a Replicate DTensor: F.linear(h, vocab-sharded weight) then
        # yields vocabulary-sharded logits; the backward reduces h's partial gradient.
        parallelize_module(model.norm, mesh, PrepareModuleOutput(
            output_layouts=Shard(1) if sp else Replicate(), desired_output_layouts=Replicate(),
            use_local_output=False))
        if not loss_parallel:
            parallelize_module(model, mesh, PrepareModuleOutput(
                output_layouts=Shard(-1), desired_output_layouts=Replicate(),
                use_local_output=True))
    for block in model.layers.values():  # type: ignore[union-attr]
        plan = _block_plan(sp)
        if getattr(block.feed_forward, "w3", None) is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
        parallelize_module(block, mesh, plan)
        block.attention.n_heads //= tp
        block.attention.n_kv_heads //= tp
    emb = getattr(model, "tok_embeddings", None)
    if emb is not None:
        emb.register_forward_pre_hook(_slice_embedding_grad)
    if hasattr(model, "head_loss"):
        model.head_loss = vocab_parallel_head_loss
    return model


def vocab_parallel_head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             *, chunk_tokens: int = 0) -> torch.Tensor:
    """The model's training loss under TP: `models.loss.linear_cross_entropy` on this rank's
    V/tp head rows, max / sum-exp / target logit all-reduced over tp, nothing gathered.

    weight: the head (or tied embedding) DTensor sharded on the vocabulary (Shard(0)).
    hidden: the final norm's output: a plain replicated tensor (tp without sp), or a DTensor
    (Replicate, or Shard(1) with sp: all-gathered here, as the column-wise head would). Its
    local gradient is a partial sum over the vocabulary shards, so it is handed back as
    Partial: the redistribution's backward all-reduces it (or reduce-scatters it under sp).
    Returns the plain fp32 loss, equal on every tp rank.
    """
    if not isinstance(weight, DTensor) or weight.placements != (Shard(0),):
        return linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk_tokens)
    mesh = weight.device_mesh
    if not isinstance(hidden, DTensor):
        hidden = DTensor.from_local(hidden, mesh, [Replicate()], run_check=False)
    h = hidden.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
    w = weight.to_local()  # (V/tp, h); its gradient is this shard's, Shard(0) as the weight
    group = mesh.get_group()
    rows = -(-weight.shape[0] // mesh.size())  # torch.chunk sizes, as Shard(0) splits
    vocab = VocabShard(
        start=min(mesh.get_local_rank() * rows, weight.shape[0]),
        all_reduce_max=lambda t: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group),
        all_reduce_sum=lambda t: dist.all_reduce(t, group=group))
    if isinstance(targets, DTensor):
        targets = targets.full_tensor()
    return linear_cross_entropy(h, w, targets, chunk_tokens=chunk_tokens, vocab=vocab)


def loss_context(mesh: DeviceMesh | None, *, enabled: bool = True):
    """The context the loss *and its backward* must run in: `loss_parallel()` when the logits
    are vocabulary-sharded (tp > 1 with loss_parallel), else a no-op."""
    if enabled and mesh is not None and mesh.size() > 1:
        return loss_parallel()
    return contextlib.nullcontext()
