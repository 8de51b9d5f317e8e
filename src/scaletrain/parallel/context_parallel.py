"""Context parallelism: load-balanced sequence sharding and ring attention.

PyTorch's `context_parallel` has no CPU kernel in 2.13 (DESIGN §3), so this is our own ring
attention, the same code on CPU and GPU:

* **Sharding.** The sequence (length T) is cut into 2·cp equal chunks; cp rank r holds chunks
  r and 2cp−1−r, concatenated (the "zigzag" layout of Brandon et al. 2023, Striped/ring
  attention load balancing). Under a causal mask every rank then does the same amount of
  attention work. Position ids travel with the shard so RoPE / learned positions stay global.
* **Ring attention** (Liu et al. 2023). Each rank keeps its queries; K/V blocks (with the
  model's KV heads, before the GQA expansion, so the ring carries the smaller tensors) move
  one hop around the ring per step with `batch_isend_irecv`, posted *before* the block is
  computed so the transfer overlaps it. Per block pair the mask is: own block → causal; a KV
  block from a lower rank j < r → all local queries see its first chunk (chunk j) and nothing
  of its second (chunk 2cp−1−j lies in their future); from a higher rank j > r → only the
  second local query chunk (2cp−1−r) sees it, whole. Block outputs are merged exactly with
  their log-sum-exp (online softmax, Milakov & Gimelshein 2018).
* **Backward** recomputes per block from the saved global output and LSE (the flash-attention
  backward identity: P = exp(S − lse), dS = P ∘ (dP − rowsum(dO ∘ O))), so no per-block
  probabilities are kept. dK/dV accumulators ride the ring with their K/V and are delivered
  back to the owning rank after a full turn.

* **Document masking** (`documents`: the (B, T) document index of every token of the whole
  sequence, identical on every rank, computed before sharding). Each (query shard, K/V shard)
  pair is masked with "same document and key position <= query position", both shards' global
  positions following from their ranks (`cp_positions`), so nothing but K/V rides the ring.
  Such blocks go through the fp32 math kernels with that explicit mask (no flash kernel takes
  one); a pair with no visible key is skipped. Without `documents` nothing changes.

Block kernels: on CPU `aten._scaled_dot_product_flash_attention_for_cpu` and its backward,
which take/return the LSE; elsewhere a plain fp32 math block (exact, O(T²) per block).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.models.transformer import Transformer
from scaletrain.numerics import acc_dtype, upcast

__all__ = [
    "RingAttentionCore",
    "apply_cp",
    "attach_cp_positions",
    "cp_shard",
    "cp_unshard",
    "cp_positions",
    "ring_attention",
]


def _as_group(group_or_mesh) -> dist.ProcessGroup | None:
    """A 1-D DeviceMesh or a ProcessGroup -> ProcessGroup (None stays None)."""
    if group_or_mesh is None or isinstance(group_or_mesh, dist.ProcessGroup):
        return group_or_mesh
    return group_or_mesh.get_group()


# ---------------------------------------------------------------------------------------------
# load-balanced sharding


def _chunk_ids(rank: int, size: int) -> tuple[int, int]:
    return rank, 2 * size - 1 - rank


def cp_shard(x: torch.Tensor, rank: int, size: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s load-balanced shard of `x` along `dim`: chunks r and 2cp−1−r of 2cp.

    x.shape[dim] must divide by 2·size. Size 1 returns x unchanged.
    """
    if size == 1:
        return x
    if x.shape[dim] % (2 * size):
        raise ValueError(
            f"sequence length {x.shape[dim]} must divide by 2*cp={2 * size}; "
            "choose batch.seq_len as a multiple of 2*parallel.cp"
        )
    chunks = x.chunk(2 * size, dim=dim)
    a, b = _chunk_ids(rank, size)
    return torch.cat([chunks[a], chunks[b]], dim=dim)


def cp_unshard(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """Inverse of `cp_shard` given every rank's shard in rank order (e.g. from all_gather)."""
    size = len(shards)
    if size == 1:
        return shards[0]
    slots: list[torch.Tensor | None] = [None] * (2 * size)
    for r, s in enumerate(shards):
        first, second = s.chunk(2, dim=dim)
        a, b = _chunk_ids(r, size)
        slots[a], slots[b] = first, second
    chunks = [c for c in slots if c is not None]
    assert len(chunks) == len(slots)  # the ranks' chunk ids cover 0..2cp-1
    return torch.cat(chunks, dim=dim)


def cp_positions(
    seq_len: int, rank: int, size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Global position ids (T/cp,) of rank `rank`'s shard, for `model(tokens, positions)`."""
    return cp_shard(torch.arange(seq_len, device=device), rank, size, dim=0)


def attach_cp_positions(stage: nn.Module, rank: int, size: int) -> nn.Module:
    """Pipeline stages under cp: forwards called without positions (the schedule passes only
    the tensors it sends between stages) get those of this rank's load-balanced shard.

    Every stage of one cp rank holds the same chunks (r and 2cp-1-r) of every micro-batch, so
    the positions follow from (rank, size) and the global length: the input's length times cp
    (times tp when SP hands a later stage T/(cp*tp) rows: `input_seq_shards`). Sending them
    between stages would carry the same tensor every time. Size 1: a no-op.
    """
    if size == 1:
        return stage

    def fill_positions(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if len(args) != 1 or kwargs.get("positions") is not None:
            return None
        x = args[0]
        hidden = getattr(mod, "tok_embeddings", None) is None
        t = x.shape[1] * (getattr(mod, "input_seq_shards", 1) if hidden else 1) * size
        return args, {**kwargs, "positions": cp_positions(t, rank, size, device=x.device)}

    stage.register_forward_pre_hook(fill_positions, with_kwargs=True)
    return stage


# ---------------------------------------------------------------------------------------------
# per-block kernels: (out, lse) forward and (dq, dk, dv) backward on (B, nh, Tq/Tk, hd)


def _block_fwd(q, k, v, causal: bool, scale: float):
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, scale=scale
        )
        return out, upcast(lse)
    return _math_block_fwd(q, k, v, causal, scale)


def _math_block_fwd(q, k, v, causal: bool, scale: float, mask=None):
    # mask: optional (B, 1, Tq, Tk) bool, True = attend, replacing `causal`
    s = (upcast(q) @ upcast(k).transpose(-2, -1)) * scale  # (B, nh, Tq, Tk)
    if causal and mask is None:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (B, nh, Tq); -inf on a row that sees no key
    # such a row contributes nothing: out 0 (exp(-inf) = 0), and its -inf LSE weighs 0 in
    # `_merge` (every row sees at least its own key in the own block, merged first)
    out = torch.exp(s - lse.masked_fill(lse == float("-inf"), 0.0).unsqueeze(-1)) @ upcast(v)
    return out.to(q.dtype), lse


def _block_bwd(dout, q, k, v, out, lse, causal: bool, scale: float):
    # out/lse are the *merged* (global) ones: the contributions of this block to dq, dk, dv
    # are then exact (see the module docstring).
    if q.device.type == "cpu":
        c = [t.contiguous() for t in (dout, q, k, v, out)]
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *c, lse.contiguous(), 0.0, causal, scale=scale
        )
    return _math_block_bwd(dout, q, k, v, out, lse, causal, scale)


def _math_block_bwd(dout, q, k, v, out, lse, causal: bool, scale: float, mask=None):
    qf, kf, vf, dof = upcast(q), upcast(k), upcast(v), upcast(dout)
    s = (qf @ kf.transpose(-2, -1)) * scale  # (B, nh, Tq, Tk)
    if causal and mask is None:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))
    dv = p.transpose(-2, -1) @ dof
    dp = dof @ vf.transpose(-2, -1)
    delta = (dof * upcast(out)).sum(-1, keepdim=True)  # rowsum(dO ∘ O), (B, nh, Tq, 1)
    ds = p * (dp - delta) * scale
    return (ds @ kf).to(q.dtype), (ds.transpose(-2, -1) @ qf).to(k.dtype), dv.to(v.dtype)


def _doc_mask(documents: torch.Tensor, rank: int, src: int, size: int) -> torch.Tensor:
    """(B, 1, Tq, Tk) bool: rank `rank`'s queries may see key shard `src` where the documents
    match and the key's global position is not after the query's."""
    t = documents.shape[1]
    qd, kd = cp_shard(documents, rank, size), cp_shard(documents, src, size)  # (B, T/cp)
    qp = cp_positions(t, rank, size, device=documents.device)
    kp = cp_positions(t, src, size, device=documents.device)
    causal = kp[None, :] <= qp[:, None]  # (Tq, Tk)
    return ((qd[:, :, None] == kd[:, None, :]) & causal).unsqueeze(1)


def _merge(out, lse, blk_out, blk_lse):
    """Exact online-softmax merge of two partial attentions over disjoint key sets (fp32)."""
    new_lse = torch.logaddexp(lse, blk_lse)
    out = out * torch.exp(lse - new_lse).unsqueeze(-1) + upcast(blk_out) * torch.exp(
        blk_lse - new_lse
    ).unsqueeze(-1)
    return out, new_lse


def _expand(x: torch.Tensor, num_rep: int) -> torch.Tensor:
    # (B, g, T, hd) -> (B, g*num_rep, T, hd): query head i reads KV head i // num_rep (GQA)
    return x if num_rep == 1 else x.repeat_interleave(num_rep, dim=1)


def _reduce_heads(dx: torch.Tensor, num_rep: int) -> torch.Tensor:
    # gradient of `_expand`: (B, g*num_rep, T, hd) -> (B, g, T, hd)
    if num_rep == 1:
        return dx
    b, h, t, d = dx.shape
    return dx.view(b, h // num_rep, num_rep, t, d).sum(2)


# ---------------------------------------------------------------------------------------------
# ring communication


class _Ring:
    """Send to rank+1 / receive from rank−1 of `group`, asynchronously."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        if group is None:
            group = dist.group.WORLD
            if group is None:
                raise RuntimeError(
                    "ring attention needs a process group: call "
                    "torch.distributed.init_process_group first"
                )
        self.group = group
        self.rank, self.size = dist.get_rank(self.group), dist.get_world_size(self.group)
        # P2POp takes global ranks
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.size)

    def shift(self, buf: torch.Tensor) -> tuple[torch.Tensor, list]:
        """Start sending `buf` forward; returns (receive buffer, works to wait on)."""
        recv = torch.empty_like(buf)
        ops = [
            dist.P2POp(dist.isend, buf, self.next, self.group),
            dist.P2POp(dist.irecv, recv, self.prev, self.group),
        ]
        return recv, dist.batch_isend_irecv(ops)


def _wait(works: list) -> None:
    for w in works:
        w.wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, documents):
        ring = _Ring(group)
        r, n = ring.rank, ring.size
        num_rep = q.shape[1] // k.shape[1]
        scale = 1.0 / math.sqrt(q.shape[-1])
        half = q.shape[2] // 2
        b, nh, t, hd = q.shape
        out = torch.zeros(b, nh, t, hd, dtype=acc_dtype(q.dtype), device=q.device)
        lse = torch.full((b, nh, t), float("-inf"), dtype=acc_dtype(q.dtype), device=q.device)
        kv = torch.stack([k, v]).contiguous()  # (2, B, nkv, T, hd): one message per hop
        for step in range(n):
            works = []
            if step < n - 1:
                nxt, works = ring.shift(kv)
            src = (r - step) % n
            kb, vb = _expand(kv[0], num_rep), _expand(kv[1], num_rep)
            if documents is not None:
                mask = _doc_mask(documents, r, src, n)
                if mask.any():
                    o, l = _math_block_fwd(q, kb, vb, False, scale, mask)
                    out, lse = _merge(out, lse, o, l)
            elif src == r:  # own block: local order is increasing in position -> causal
                o, l = _block_fwd(q, kb, vb, True, scale)
                out, lse = _merge(out, lse, o, l)
            elif src < r:  # queries see the KV block's first chunk only
                o, l = _block_fwd(q, kb[:, :, :half], vb[:, :, :half], False, scale)
                out, lse = _merge(out, lse, o, l)
            else:  # only the second query chunk sees this block, all of it
                o, l = _block_fwd(q[:, :, half:], kb, vb, False, scale)
                o2, l2 = _merge(out[:, :, half:], lse[:, :, half:], o, l)
                out = torch.cat([out[:, :, :half], o2], dim=2)
                lse = torch.cat([lse[:, :, :half], l2], dim=2)
            _wait(works)
            if step < n - 1:
                kv = nxt
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.documents = group, documents
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group)
        r, n = ring.rank, ring.size
        num_rep = q.shape[1] // k.shape[1]
        scale = 1.0 / math.sqrt(q.shape[-1])
        half = q.shape[2] // 2
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=acc_dtype(q.dtype))
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv, dtype=acc_dtype(kv.dtype))  # accumulator of the KV block held
        for step in range(n):
            kv_works, nxt_kv = [], None
            if step < n - 1:  # the next K/V block travels while this one is processed
                nxt_kv, kv_works = ring.shift(kv)
            src = (r - step) % n
            kb, vb = _expand(kv[0], num_rep), _expand(kv[1], num_rep)
            if ctx.documents is not None:
                mask = _doc_mask(ctx.documents, r, src, n)
                if mask.any():
                    gq, gk, gv = _math_block_bwd(dout, q, kb, vb, out, lse, False, scale, mask)
                    dq += gq
                    dkv[0] += _reduce_heads(gk, num_rep)
                    dkv[1] += _reduce_heads(gv, num_rep)
            elif src == r:
                gq, gk, gv = _block_bwd(dout, q, kb, vb, out, lse, True, scale)
                dq += gq
                dkv[0] += _reduce_heads(gk, num_rep)
                dkv[1] += _reduce_heads(gv, num_rep)
            elif src < r:
                gq, gk, gv = _block_bwd(
                    dout, q, kb[:, :, :half], vb[:, :, :half], out, lse, False, scale
                )
                dq += gq
                dkv[0, :, :, :half] += _reduce_heads(gk, num_rep)
                dkv[1, :, :, :half] += _reduce_heads(gv, num_rep)
            else:
                s = slice(half, None)
                gq, gk, gv = _block_bwd(
                    dout[:, :, s], q[:, :, s], kb, vb, out[:, :, s], lse[:, :, s], False, scale
                )
                dq[:, :, s] += gq
                dkv[0] += _reduce_heads(gk, num_rep)
                dkv[1] += _reduce_heads(gv, num_rep)
            # the accumulator follows its K/V; after n hops it is back home, complete
            nxt_dkv, dkv_works = ring.shift(dkv)
            _wait(kv_works)
            _wait(dkv_works)
            dkv = nxt_dkv
            if nxt_kv is not None:
                kv = nxt_kv
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    documents: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention over the whole sequence from each rank's load-balanced shard.

    q: (B, nh, T/cp, hd); k, v: (B, nkv, T/cp, hd), nh a multiple of nkv; shards laid out by
    `cp_shard`. documents: optional (B, T) document index of every token of the whole
    sequence (the same on every rank): attention then also stays inside each document.
    Returns this rank's (B, nh, T/cp, hd) output. Differentiable.
    """
    if q.shape[2] % 2:
        raise ValueError(f"local sequence length {q.shape[2]} must be even (2 chunks per rank)")
    if documents is not None and documents.shape != (
        q.shape[0],
        q.shape[2] * (dist.get_world_size(group) if dist.is_initialized() else 1),
    ):
        raise ValueError(
            f"documents {tuple(documents.shape)}: expected (B, T) of the whole "
            f"sequence, B={q.shape[0]}, T = local length {q.shape[2]} * cp"
        )
    return _RingAttention.apply(q, k, v, group, documents)


class RingAttentionCore(nn.Module):
    """Drop-in `Attention.core` computing ring attention over the cp group."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.group = group

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return ring_attention(q, k, v, self.group, documents)


def apply_cp(model: Transformer, cp_group_or_mesh) -> Transformer:
    """Swap every block's `attention.core` for ring attention over the cp group (in place).

    Degree 1 (or None) is a no-op. The caller shards tokens, targets and positions with
    `cp_shard` / `cp_positions` and averages the loss and gradients over the cp group (FSDP or
    DP over a mesh that includes the cp axis does the latter).
    """
    group = _as_group(cp_group_or_mesh)
    if group is None or dist.get_world_size(group) == 1:
        return model
    for block in model.blocks():
        block.attention.core = RingAttentionCore(group)
    return model
