"""Tensor and sequence parallelism (Megatron-LM, Shoeybi et al. 2019; Korthikanti et al. 2022)
with DTensor `parallelize_module` plans.

Per block: wq/wk/wv column-wise (whole query and key/value heads per rank, so GQA needs tp to
divide num_kv_heads; q/k/v biases split with their rows), wo row-wise; MLP w1/w3 column-wise,
w2 row-wise. Per-head q/k norms (Qwen3) keep their (head_dim,) weights whole on every rank and
sum their gradients over tp. Gemma 2's post-sub-layer norms run where their input lives: on
the replicated output without sp, sequence-parallel on the T/tp slice with it. One all-reduce
(or, with
sp, one all-gather + one reduce-scatter) per sub-layer in forward, as many in backward.

Sequence parallel (sp): the residual stream between sub-layers is sharded on the sequence dim
(Shard(1)): norms run on T/tp tokens (`SequenceParallel`), `PrepareModuleInput` all-gathers
the norm output to Replicate before attention / MLP, and the row-wise wo/w2 reduce-scatter
back to Shard(1).

Embeddings: the token embedding is vocabulary-parallel (`VocabParallelEmbedding`, Megatron's
VocabParallelEmbedding): each rank holds V/tp rows, looks up the ids in its range (the others
masked to zero), and the partial outputs are all-reduced (Replicate) or reduce-scattered over
the sequence (Shard(1) with sp); its backward keeps only this rank's V/tp x h gradient rows.
Learned position embeddings are row-wise sharded with DTensor's plan; their output (T, h) is
sharded on dim 0 so it adds to the local (B, T/tp, h) token embeddings — positions must then be
the default 1-D ids.

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

MoE blocks (expert tensor parallelism: Shoeybi et al. 2019's MLP split applied per expert, as
Megatron-Core's MoE layer does): attention is split as above; the MoE layer's input is
gathered to the whole (replicated) sequence, the router stays replicated (every tp rank routes
the same tokens the same way, so the load-balancing loss is the single-device one), and the
experts are either

- split over tp (`shard_experts=True`, the layout rule for ep = 1): w1/w3 (E, f, h) column-wise
  on f, w2 (E, h, f) row-wise on f, as a dense MLP's; `TensorParallelExperts` all-reduces
  their partial (N*k, h) output over tp before the combine, and all-reduces the gradient of
  their input in backward. Megatron-Core's token dispatchers reduce at the same place (a
  reduce-scatter of the experts' output before un-permutation,
  megatron/core/transformer/moe/token_dispatcher.py); here every tp rank combines all rows,
  hence an all-reduce; or
- kept whole on every tp rank (`shard_experts=False`, the rule for ep > 1: expert parallelism
  then splits them over its sub-axis of dp x cp, `expert_parallel.apply_ep`): each tp rank
  runs the same experts on the same tokens, so their gradients are already equal over tp.

Either way the MoE output is the same on every tp rank; with sp each keeps its T/tp slice.
DeepSeekMoE's shared experts follow its routed experts (split over tp with them, or whole).
Multi-head Latent Attention (DeepSeek): heads split, latents whole on every rank
(`tensor_parallel_mla.py`). LoRA projections: each adapter split with its base, B with a
column-parallel W's rows, A with a row-parallel W's columns (`tensor_parallel_lora.py`).
The legality rules (head counts, which expert split runs) live in `config.layout_problems`.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from scaletrain.dtensor import to_local
from scaletrain.models.loss import VocabShard, linear_cross_entropy
from scaletrain.models.mla import MLAttention
from scaletrain.models.moe import (
    EXPERT_WEIGHTS,
    GroupedExperts,
    grouped_expert_mlp,
    host_counts,
)
from scaletrain.models.transformer import Transformer

from .tensor_parallel_lora import lora_tp_styles
from .tensor_parallel_mla import mla_tp_plan

__all__ = [
    "TensorParallelExperts",
    "VocabParallelEmbedding",
    "apply_tp",
    "loss_context",
    "vocab_parallel_head_loss",
]


def _root_plan(model: Transformer, sp: bool, loss_parallel_: bool) -> dict:
    seq = Shard(1) if sp else Replicate()
    plan: dict = {}
    if model.pos_embeddings is not None:
        # positions (T,) -> (T, h): the sequence is dim 0 of this output.
        plan["pos_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(0) if sp else Replicate()
        )
    if model.norm is not None and sp:
        plan["norm"] = SequenceParallel()
    if model.output is not None:
        plan["output"] = ColwiseParallel(
            input_layouts=seq,
            output_layouts=Shard(-1) if loss_parallel_ else Replicate(),
            use_local_output=not loss_parallel_,
        )
    return plan


def _block_plan(sp: bool, moe: bool = False) -> dict:
    seq = Shard(1) if sp else Replicate()
    mlp: dict = {
        "feed_forward": PrepareModuleInput(
            input_layouts=(seq,), desired_input_layouts=(Replicate(),), use_local_output=False
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=seq),
    }
    if moe:
        # the whole sequence in (plain: MoE routes local tensors), the same output on every
        # tp rank out (sp: this rank's slice). The input's gradient is equal over tp (router
        # replicated; split experts all-reduce theirs), hence Replicate.
        mlp = {
            "moe": PrepareModuleInputOutput(
                input_layouts=(seq,),
                desired_input_layouts=(Replicate(),),
                use_local_input=True,
                output_layouts=(Replicate(),),
                desired_output_layouts=(seq,),
                use_local_output=True,
            )
        }
    plan: dict = {
        # The block input stays a Replicate DTensor (use_local_output=False) so that wq, wk, wv
        # (and w1, w3) share it: their partial input gradients are summed locally and reduced
        # once at this boundary. A local tensor here would give each column-wise linear its own
        # backward all-reduce (5 per layer instead of 2; counted by benchmarks/comm_volume.py).
        "attention": PrepareModuleInput(
            input_layouts=(seq, None, None),
            desired_input_layouts=(Replicate(), None, None),
            use_local_output=False,
        ),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq),
        **mlp,
    }
    if sp:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
    return plan


class VocabParallelEmbedding(nn.Embedding):
    """The token embedding with its (V, h) table split over the tp mesh by rows (Shard(0)).

    Forward: ids outside this rank's rows [start, start + V_local) are looked up as row 0 and
    their output zeroed; the partial (B, T, h) outputs are summed over tp by redistributing a
    Partial DTensor, to Replicate (all-reduce) or, with `sequence_parallel`, to Shard(1)
    (reduce-scatter: this rank's T/tp slice). Every id is in exactly one rank's rows, so the
    sum adds zeros to one lookup: exact. Backward: the redistribution's backward brings the
    output gradient back replicated (all-gather under sp); the local lookup's backward writes
    only this rank's V_local x h rows, and the weight's gradient arrives as a Shard(0) DTensor
    like the weight. DTensor's own embedding backward (RowwiseParallel) computes the whole
    V x h gradient on every rank before slicing it (Megatron's layer, Shoeybi et al. 2019
    sec. 3, computes only the local rows, as here).
    A tied head reads the same `weight` (`vocab_parallel_head_loss`): both gradients are
    V/tp x h.
    """

    sequence_parallel: bool

    @classmethod
    def from_embedding(
        cls, emb: nn.Embedding, mesh: DeviceMesh, *, sequence_parallel: bool
    ) -> VocabParallelEmbedding:
        """`emb` (on any device, meta included) with its table distributed Shard(0) over the
        1-D tp `mesh`; the parameter keeps its name (`weight`)."""
        if emb.padding_idx is not None or emb.max_norm is not None or emb.sparse:
            raise ValueError(
                "VocabParallelEmbedding: padding_idx, max_norm and sparse "
                "gradients are not supported (the model's embedding uses none)"
            )
        weight = nn.Parameter(
            distribute_tensor(emb.weight.detach(), mesh, [Shard(0)]),
            requires_grad=emb.weight.requires_grad,
        )
        out = cls(
            emb.num_embeddings,
            emb.embedding_dim,
            _weight=weight,
            _freeze=not emb.weight.requires_grad,
            device="meta",
        )
        out.weight = weight  # the DTensor parameter itself, not a re-wrapped copy
        out.sequence_parallel = sequence_parallel
        return out

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if not isinstance(w, DTensor) or w.placements != (Shard(0),):
            return super().forward(ids)
        mesh = w.device_mesh
        if isinstance(ids, DTensor):
            ids = ids.full_tensor()
        local = w.to_local()  # (V_local, h); its gradient arrives as Shard(0), as the weight
        rows = -(-w.shape[0] // mesh.size())  # torch.chunk sizes, as Shard(0) splits
        start = min(mesh.get_local_rank() * rows, w.shape[0])
        outside = (ids < start) | (ids >= start + local.shape[0])
        out = F.embedding((ids - start).masked_fill(outside, 0), local)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        target = Shard(1) if self.sequence_parallel else Replicate()
        return (
            DTensor.from_local(out, mesh, [Partial()], run_check=False)
            .redistribute(mesh, [target])
            .to_local()
        )


def apply_tp(
    model: Transformer,
    mesh: DeviceMesh,
    *,
    sp: bool,
    loss_parallel: bool = True,
    shard_experts: bool = True,
) -> Transformer:
    """Shard `model` over the 1-D tp `mesh` in place (degree 1: no-op); see module docstring.

    shard_experts: MoE experts split over tp (else kept whole per tp rank, for expert
    parallelism to split)."""
    tp = mesh.size()
    if tp == 1:
        return model
    if sp:
        model.input_seq_shards = tp  # a later pipeline stage receives T/tp of the sequence
    # torch's SequenceParallel re-registers a norm's weight as a new Parameter that requires a
    # gradient whatever the old one did (`_replicate_module_fn`); a frozen weight (LoRA's
    # frozen base) must stay frozen, so the frozen names are restored at the end
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    parallelize_module(model, mesh, _root_plan(model, sp, loss_parallel))
    if model.output is None and model.tie_embeddings and model.norm is not None:
        # Make the head's input a Replicate DTensor: F.linear(h, vocab-sharded weight) then
        # yields vocabulary-sharded logits; the backward reduces h's partial gradient.
        parallelize_module(
            model.norm,
            mesh,
            PrepareModuleOutput(
                output_layouts=Shard(1) if sp else Replicate(),
                desired_output_layouts=Replicate(),
                use_local_output=False,
            ),
        )
        if not loss_parallel:
            parallelize_module(
                model,
                mesh,
                PrepareModuleOutput(
                    output_layouts=Shard(-1),
                    desired_output_layouts=Replicate(),
                    use_local_output=True,
                ),
            )
    for block in model.blocks():
        moe = getattr(block, "moe", None)
        plan = _block_plan(sp, moe=moe is not None)
        if moe is None and getattr(block.feed_forward, "w3", None) is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
        if sp and block.post_attention_norm is not None:
            # Gemma 2's norms on the sub-layers' outputs: the reduce-scattered T/tp slice in,
            # a local slice out (it is added to the local residual stream)
            post = SequenceParallel(use_local_output=True)
            plan["post_attention_norm"] = plan["post_ffn_norm"] = post
        if isinstance(block.attention, MLAttention):  # heads split, latents whole
            for name in ("attention.wq", "attention.wk", "attention.wv"):
                del plan[name]
            plan |= mla_tp_plan(block.attention)
        elif block.attention.q_norm is not None:
            # Qwen3's per-head q/k norms read this rank's heads, (B, T, nh/tp, hd): their
            # (hd,) weights are replicated and the input seen as sharded on the heads dim
            # (2), so each weight's gradient is the sum over all ranks' heads (a Partial,
            # reduced like a sequence-parallel norm's); the output goes back local.
            heads = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["attention.q_norm"] = plan["attention.k_norm"] = heads
        parallelize_module(block, mesh, lora_tp_styles(block, plan))
        if moe is not None and shard_experts:
            moe.experts = TensorParallelExperts(moe.experts, mesh)
            shared = getattr(moe, "shared_experts", None)  # DeepSeekMoE: split the same way
            if shared is not None:
                moe.shared_experts = TensorParallelExperts(shared, mesh)
        block.attention.n_heads //= tp
        block.attention.n_kv_heads //= tp
        block.attention.fused_qkv = False  # the sharding hooks sit on each of wq, wk, wv
    if model.tok_embeddings is not None:
        model.tok_embeddings = VocabParallelEmbedding.from_embedding(
            model.tok_embeddings, mesh, sequence_parallel=sp
        )
    model.head_loss = vocab_parallel_head_loss
    for name in frozen:  # the names are the single-device ones (see above)
        model.get_parameter(name).requires_grad_(False)
    return model


class _CopyToTP(torch.autograd.Function):
    """Identity forward; backward all-reduces the gradient over tp (the split experts'
    partial input gradients; Megatron's `copy_to_tensor_model_parallel_region`)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone(memory_format=torch.contiguous_format)  # never reduce autograd's own
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward (sum of the tp ranks' partial outputs); identity backward
    (Megatron's `reduce_from_tensor_model_parallel_region`)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# Shard dim of each expert weight over tp: f is dim 1 of w1/w3 (E, f, h) and b1/b3 (E, f),
# dim 2 of w2 (E, h, f); b2 (E, h) is whole on every rank, added once after the reduction.
_EXPERT_TP_DIM = {"w1": 1, "w3": 1, "b1": 1, "b3": 1, "w2": 2}


class TensorParallelExperts(GroupedExperts):
    """`GroupedExperts` with every expert's f dimension split over the tp `mesh`.

    Same parameter names and global shapes (DTensors: `materialize` draws the single-device
    values and keeps this rank's slice). `forward` takes the same replicated sorted tokens and
    counts on every tp rank and returns the same (N*k, h) rows on every tp rank: the partial
    products of the f slices are summed by one all-reduce of the output, and the input's
    partial gradients by one all-reduce in backward.
    """

    def __init__(self, experts: GroupedExperts, mesh: DeviceMesh) -> None:
        nn.Module.__init__(self)
        self.mesh, self.group = mesh, mesh.get_group()
        self.num_experts, self.activation = experts.num_experts, experts.activation
        self.linear = experts.linear  # F.linear, or the fp8 matmul apply_fp8 set
        self.kernel = experts.kernel
        for name in EXPERT_WEIGHTS:
            p = getattr(experts, name)
            if p is None:
                setattr(self, name, None)
                continue
            dim = _EXPERT_TP_DIM.get(name)
            # Shard(dim)'s own split (torch.chunk), taken locally: no communication, and it
            # works on a meta model too
            local = (
                p.detach().chunk(mesh.size(), dim)[mesh.get_local_rank()].clone()
                if dim is not None
                else p.detach().clone()
            )
            dt = DTensor.from_local(
                local,
                mesh,
                [Shard(dim) if dim is not None else Replicate()],
                run_check=False,
                shape=p.shape,
                stride=p.stride(),
            )
            setattr(self, name, nn.Parameter(dt, requires_grad=p.requires_grad))

    def forward(
        self, x_sorted: torch.Tensor, num_tokens_per_expert: torch.Tensor | list[int]
    ) -> torch.Tensor:
        counts = host_counts(num_tokens_per_expert)
        x = _CopyToTP.apply(x_sorted, self.group)
        local = self.weights().map(to_local)
        b2 = local.b2  # added once, after the reduction (below), not to every partial sum
        summed = local._replace(b2=None)
        y = grouped_expert_mlp(
            x, counts, self.activation, summed, linear=self.linear, kernel=self.kernel
        )
        y = _ReduceFromTP.apply(y, self.group)
        if b2 is not None:  # once, after the reduction
            rows = torch.as_tensor(counts, device=y.device)
            y = y + torch.repeat_interleave(b2, rows, dim=0, output_size=y.shape[0])
        return y


def vocab_parallel_head_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """The model's training loss under TP: `models.loss.linear_cross_entropy` on this rank's
    V/tp head rows, max / sum-exp / target logit all-reduced over tp, nothing gathered.

    weight: the head (or tied embedding) DTensor sharded on the vocabulary (Shard(0)).
    hidden: the final norm's output: a plain replicated tensor (tp without sp), or a DTensor
    (Replicate, or Shard(1) with sp: all-gathered here, as the column-wise head would). Its
    local gradient is a partial sum over the vocabulary shards, so it is handed back as
    Partial: the redistribution's backward all-reduces it (or reduce-scatters it under sp).
    Returns the plain fp32 loss, equal on every tp rank. softcap: Gemma 2's final-logit cap,
    elementwise, so each rank caps its own V/tp logits.
    """
    if not isinstance(weight, DTensor) or weight.placements != (Shard(0),):
        return linear_cross_entropy(
            hidden, weight, targets, chunk_tokens=chunk_tokens, softcap=softcap
        )
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
        all_reduce_sum=lambda t: dist.all_reduce(t, group=group),
    )
    if isinstance(targets, DTensor):
        targets = targets.full_tensor()
    return linear_cross_entropy(
        h, w, targets, chunk_tokens=chunk_tokens, vocab=vocab, softcap=softcap
    )


def loss_context(mesh: DeviceMesh | None, *, enabled: bool = True):
    """The context the loss *and its backward* must run in: `loss_parallel()` when the logits
    are vocabulary-sharded (tp > 1 with loss_parallel), else a no-op."""
    if enabled and mesh is not None and mesh.size() > 1:
        return loss_parallel()
    return contextlib.nullcontext()
