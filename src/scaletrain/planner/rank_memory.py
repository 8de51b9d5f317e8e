"""Memory of the worst pipeline rank of a plan: `estimate_memory(plan) -> MemoryBreakdown`.

The search's hot path (`worst_rank`) returns plain numbers; the breakdown dataclass is built
only for the layouts the planner reports. Both go through `_rank_memory`, so they agree: a
rank's peak is the largest of its named moments (`ForwardBackward`, `OptimizerStep`, the
ZeRO-2/3 moments, `LossBackward`, `EmbeddingBackward`), each a frozen dataclass of its byte
terms, and `RankMemory.moment` names the one that won.

Which ranks are evaluated: rank 0 (embedding), rank pp-1 (head), and the middle ranks no other
middle rank dominates: middle ranks hold the same per-block states, buffers and per-block
activations, so their memory grows with the layer count and with layers x in-flight
micro-batches; one with no more layers and no more in flight than another can never be the
worst. The set is exact, not sampled.
"""

from __future__ import annotations

import functools

from scaletrain.config import (
    ModelConfig,
    ParamCounts,
    ddp_reducer,
    expert_split,
    expert_zero_shards,
    fused_head_loss,
    stage_layer_ranges,
)

from .memory import (
    FRAGMENTATION,
    buffer_terms,
    embedding_backward_bytes,
    fp8_linear_params,
    head_activation_bytes,
    held_logits_bytes,
    layer_activation_bytes,
    loss_backward_bytes,
    mlp_backward_work_bytes,
    model_state_bytes,
    pp_recv_buffer_bytes,
    rope_table_bytes,
    selective_recompute_bytes,
    stage_layer_counts,
)
from .moments import (
    EmbeddingBackward,
    ForwardBackward,
    LossBackward,
    Moment,
    OptimizerStep,
    RankMemory,
    ZeroBlockBackward,
    ZeroEndOfBackward,
    ZeroStageBackward,
)
from .pipeline import inflight_per_rank, rank_order
from .types import MemoryBreakdown, PlanInput

__all__ = ["estimate_memory", "pipeline_rank_memory", "worst_rank", "rank_candidates",
           "schedule_moments", "RankMemory", "ModelTerms"]


@functools.lru_cache(maxsize=8192)
def rank_candidates(num_layers: int, pp: int, virtual: int, schedule: str,
                    m: int) -> tuple[tuple[int, int, float], ...]:
    """(pipeline rank, layers held, micro-batches in flight) of the ranks that can be the worst
    (see the module docstring); in-flight counts are `pipeline.inflight_microbatches`."""
    counts = stage_layer_counts(num_layers, pp, virtual)
    if pp == 1:
        return ((0, counts[0], 1.0),)
    inflight = inflight_per_rank(schedule, pp, m, virtual)
    best: dict[int, tuple[int, float]] = {}
    for r in range(1, pp - 1):
        c, f = counts[r], inflight[r]
        if c not in best or f > best[c][1]:
            best[c] = (r, f)
    # drop a middle rank another one dominates (at least as many layers and in flight)
    middle = [(r, c, f) for c, (r, f) in sorted(best.items())
              if not any(c2 >= c and f2 >= f and c2 != c for c2, (_, f2) in best.items())]
    return ((0, counts[0], inflight[0]), *middle, (pp - 1, counts[-1], inflight[-1]))


@functools.lru_cache(maxsize=8192)
def schedule_moments(schedule: str, p: int, m: int, v: int, rank: int, num_layers: int
                     ) -> tuple[tuple[int, int, bool, bool], ...]:
    """The backward moments of pipeline rank `rank`, walking its action order
    (`pipeline.pipeline_order`, torch's order): (layers x micro-batches whose activations are
    stored, micro-batches of the last stage stored (head and loss graph), whether the step's
    gradients exist yet, whether the moment is the last stage's loss backward).

    A micro-batch's activations of a stage are stored from its forward until its backward
    frees them; under zero-bubble until its weight pass (W): torch's input-gradient pass keeps
    the graph for W (measured with the dry-run, llama-1024-L4 pp2 zero-bubble rank 1: a
    micro-batch holds as much after B as before). Gradients are allocated by the rank's first
    backward (W under zero-bubble). Per backward two moments: as it starts (its own
    activations still stored) and after it (freed, gradients allocated). Interleaved chunks
    are weighted by their own layer counts (`stage_layer_ranges`), not the average: with
    pp2 v2 on 4 layers rank 1 holds a 2-layer chunk and a head-only one. GPipe: every forward
    precedes the first backward, whose moment has all m stored and no gradients; the second
    has m - 1 stored next to the gradients (the dry-run's peak, llama-1024-L4 pp2 gpipe).
    Dominated moments (same flags, no more layers and heads) are dropped."""
    n = p * v
    layers = [len(r) for r in stage_layer_ranges(num_layers, n)]
    zb = schedule == "zero-bubble"
    live: dict[tuple[int, int], tuple[int, int]] = {}
    grads = False
    out: set[tuple[int, int, bool, bool]] = set()

    def now(is_loss: bool) -> tuple[int, int, bool, bool]:
        return (sum(x[0] for x in live.values()), sum(x[1] for x in live.values()), grads,
                is_loss)

    for a in rank_order(schedule, p, m, v, rank):
        key = (a.stage, a.microbatch)
        if a.kind == "F":
            live[key] = (layers[a.stage], 1 if a.stage == n - 1 else 0)
        elif a.kind == "B":
            out.add(now(a.stage == n - 1))
            if not zb:
                live.pop(key, None)
                grads = True
                out.add(now(False))
        else:  # W: the deferred weight gradients, then the micro-batch's graph is freed
            live.pop(key, None)
            grads = True
            out.add(now(False))
    kept = []
    best: dict[tuple[bool, bool], int] = {}  # per flags, the most heads of a larger moment
    for x in sorted(out, key=lambda x: (-x[0], -x[1])):
        if x[1] > best.get(x[2:], -1):
            kept.append(x)
            best[x[2:]] = x[1]
    return tuple(sorted(kept))


class ModelTerms:
    """One model's memory terms, reused by every layout of a search: its parameter counts and,
    keyed by the layout fields each depends on, the rank states (`_rank_states`), activation
    terms (`_activation_terms`) and buffers (`_buffers`). `search.search` builds one per
    search; a caller that passes none gets a fresh one per call."""

    __slots__ = ("model", "counts", "states", "acts", "bufs")

    def __init__(self, model: ModelConfig) -> None:
        self.model = model
        self.counts: ParamCounts = model.param_counts()
        self.states: dict[tuple, tuple] = {}
        self.acts: dict[tuple, tuple[float, float, float, float]] = {}
        self.bufs: dict[tuple, tuple] = {}


def model_terms(plan: PlanInput, terms: ModelTerms | None) -> ModelTerms:
    """`terms` if it was built for the plan's model, else a fresh one."""
    return terms if terms is not None and terms.model is plan.model else ModelTerms(plan.model)


def _rank_states(plan: PlanInput, terms: ModelTerms, zs: int, first: bool, last: bool,
                 layers: int, convention: str) -> tuple:
    """(model-state dict, parameter count, largest FSDP unit, ZeRO-sharded count, params +
    optimizer bytes, backward terms), cached; backward terms = (root unit's unsharded bytes,
    head gradient held, one block's parameters, embedding-backward temporaries) for the
    ZeRO-2/3 and embedding moments of `_rank_memory`."""
    L, model = plan.layout, plan.model
    key = (L.tp, L.ep, L.zero, zs, L.pp > 1, first, last, layers, plan.precision,
           plan.optimizer, plan.offload, convention)
    hit = terms.states.get(key)
    if hit is not None:
        return hit
    pc = terms.counts
    tp, ep = L.tp, L.ep
    dense_mlp = 0 if model.is_moe else pc.mlp
    block = (pc.attention + dense_mlp) / tp + pc.norms + pc.router
    dense = layers * block
    # experts split tp ways (ep = 1) or ep ways (config.layout.expert_split)
    expert = layers * pc.mlp / expert_split(L) if model.is_moe else 0.0
    # FSDP2 ignores expert-parallel experts (parallel/parallelize.py): not in any unit
    experts_in_fsdp = not (model.is_moe and ep > 1 and L.zero >= 2)
    unit = block + (pc.mlp / expert_split(L) if model.is_moe and experts_in_fsdp else 0.0)
    # FSDP2's root unit (parallel/fsdp.py: fully_shard(model) after the blocks) holds all that
    # is not a block on this stage: embedding + positions and/or final norm + head, gathered as
    # ONE unit (the dry-run's unsharded root of llama2-7b is embedding + head).
    root = 0.0
    if first:
        dense += pc.embedding / tp + pc.position
        root += pc.embedding / tp + pc.position
    if last:
        head = pc.head or (pc.embedding if L.pp > 1 else 0)  # tied head: a copy on the last stage
        dense += pc.final_norm + head / tp
        root += pc.final_norm + head / tp
    unit = max(unit, root)
    st = model_state_bytes(dense, precision=plan.precision, optimizer=plan.optimizer,
                           zero=L.zero, zero_shards=zs, offload=plan.offload,
                           convention=convention, expert_params=expert,
                           expert_shards=expert_zero_shards(L), unit_params=unit,
                           largest_param=(pc.embedding / tp) if (first or last) else block,
                           # q/k/v/o, the dense MLP or local experts of this stage's blocks
                           fp8_params=fp8_linear_params(model, layers, tp) + expert,
                           experts_in_fsdp=experts_in_fsdp)
    sharded = (dense / zs + expert / expert_zero_shards(L)) if L.zero else dense + expert
    fixed = st["params"] + st["optimizer"]
    wc = 4 if plan.precision == "fp32" else 2
    root_live, head_held = _root_in_backward(plan, pc, first, last, wc)
    emb_tmp = 0.0
    if first:
        # the weight's dtype as used: FSDP2's 16-bit unit, or fp32 (also under autocast)
        grad_bytes = 2 if (L.zero >= 2 and plan.precision != "fp32") else 4
        emb_tmp = embedding_backward_bytes(model, tp=tp, grad_bytes=grad_bytes,
                                           tied=model.tie_embeddings and L.pp == 1)
    bwd_terms = (root_live, head_held, _block_params(plan, pc), emb_tmp)
    out = (st, dense + expert, unit, sharded, fixed, bwd_terms)
    terms.states[key] = out
    return out


def _activation_terms(plan: PlanInput, terms: ModelTerms, modern: bool
                      ) -> tuple[float, float, float, float]:
    """(stored bytes per block, what one block re-creates while it is recomputed in backward
    (full: its whole no-AC set; selective: `memory.selective_recompute_bytes`; none: 0), head
    bytes, logits the loop holds) per micro-batch, cached."""
    L, model = plan.layout, plan.model
    # autocast on fp32 params: DDP and ZeRO-1; ZeRO-2/3 are FSDP2 with 16-bit parameters
    residual_fp32 = plan.precision != "fp32" and L.zero < 2
    key = (plan.seq_len, plan.micro_batch, L.tp, L.sp, L.cp, L.ep, plan.ac, plan.precision,
           plan.compile, modern, residual_fp32)
    hit = terms.acts.get(key)
    if hit is not None:
        return hit
    s, b, p = plan.seq_len, plan.micro_batch, plan.precision
    per_layer = layer_activation_bytes(model, seq_len=s, micro_batch=b, tp=L.tp, sp=L.sp,
                                       cp=L.cp, ac=plan.ac, precision=p, modern=modern,
                                       compile=plan.compile, residual_fp32=residual_fp32,
                                       ep=L.ep)
    full = layer_activation_bytes(model, seq_len=s, micro_batch=b, tp=L.tp, sp=L.sp, cp=L.cp,
                                  ac="none", precision=p, modern=modern, compile=plan.compile,
                                  residual_fp32=residual_fp32, ep=L.ep)
    # the fused head + loss (models/loss.py) runs on the last stage, pipelined or not (a
    # pipeline's last stage is given the targets: parallel/pipeline.py), but zero-bubble
    fused = fused_head_loss(L)
    head = head_activation_bytes(model, seq_len=s, micro_batch=b, tp=L.tp, sp=L.sp, cp=L.cp,
                                 precision=p, residual_fp32=residual_fp32, fused=fused)
    held = held_logits_bytes(model, seq_len=s, micro_batch=b, tp=L.tp, cp=L.cp, precision=p,
                             fused=fused)
    if model.is_moe and L.ep > 1 and L.zero >= 2 and p not in ("fp32", "fp8"):
        # FSDP2 ignores the expert-parallel experts (parallel/parallelize.py): they stay fp32
        # and autocast casts each expert's weights to the compute dtype in every forward
        # (views, not leaves: no autocast cache); the linears save those casts for backward,
        # 2 bytes x the block's local expert parameters per micro-batch (dry-run, tiny-moe
        # dp2 z3 ep2: -3.0% total without this term). fp8 experts save no cast: they
        # re-quantize the fp32 weight in backward (precision/fp8.py).
        casts = 2.0 * terms.counts.mlp / expert_split(L)
        if plan.ac != "full":  # under full recompute only the block being recomputed has them
            per_layer += casts
        full += casts
    recompute = 0.0
    if plan.ac == "full":
        recompute = full
    elif plan.ac == "selective":
        recompute = selective_recompute_bytes(
            model, full=full, stored=per_layer, tokens=s / L.cp * b, tp=L.tp, sp=L.sp,
            e=4 if p == "fp32" else 2)
    out = (per_layer, recompute, head, held)
    terms.acts[key] = out
    return out


def _buffers(plan: PlanInput, terms: ModelTerms, zs: int, unit: float, device: str,
             count: float = 0.0) -> tuple:
    """(named buffer terms, their sum, runtime context, FSDP collectives' sum, fp8 quantization
    temporary), cached. count: the rank's parameters (DDP's bucket copy)."""
    L, model = plan.layout, plan.model
    tokens = plan.seq_len / L.cp * plan.micro_batch
    key = (tokens, plan.precision, L.zero, L.dp, L.tp, L.sp, L.pp, L.cp, L.ep, unit, zs, device,
           count)
    hit = terms.bufs.get(key)
    if hit is not None:
        return hit
    bufs = buffer_terms(hidden=model.dim, tokens=tokens, precision=plan.precision, zero=L.zero,
                        dp=L.dp, tp=L.tp, sp=L.sp, pp=L.pp, cp=L.cp, ep=L.ep,
                        kv_dim=model.kv_dim, experts_per_token=model.experts_per_token,
                        unit_params=unit, zero_shards=zs, device=device,
                        bucket_params=count, ffn_dim=model.ffn_dim, ddp=ddp_reducer(L))
    if model.position == "rope":
        bufs["rope_tables"] = rope_table_bytes(model)
    fsdp = sum(v for k, v in bufs.items() if k.startswith("fsdp_"))
    out = (bufs, sum(bufs.values()), bufs["runtime_context"], fsdp, bufs.get("fp8_quantize", 0.0))
    terms.bufs[key] = out
    return out


def _block_params(plan: PlanInput, pc: ParamCounts) -> float:
    """Parameters of one block on this rank (the FSDP unit of a block)."""
    model, L = plan.model, plan.layout
    if model.is_moe:
        # expert-parallel experts are not in the block's FSDP unit (FSDP2 ignores them)
        experts = 0.0 if (L.ep > 1 and L.zero >= 2) else pc.mlp / expert_split(L)
        return pc.attention / L.tp + pc.norms + pc.router + experts
    return (pc.attention + pc.mlp) / L.tp + pc.norms


def _root_in_backward(plan: PlanInput, pc: ParamCounts, first: bool, last: bool, wc: int
                      ) -> tuple[float, float]:
    """(root unit's unsharded parameters, head gradient held) through a ZeRO-3 backward.

    The root unit holds what is not a block on this stage (embedding + positions on the
    first, final norm + head on the last); FSDP2 gathers it again for the head's backward and
    reshards it only after its post-backward, the last of the step. Until then the head's
    gradient waits unsharded (untied head: a root parameter's grad) or, tied, as the head's
    contribution autograd holds until the embedding's arrives. Both in the compute dtype."""
    L = plan.layout
    root = 0.0
    if first:
        root += pc.embedding / L.tp + pc.position
    if last:
        root += pc.final_norm + (pc.head or (pc.embedding if L.pp > 1 else 0)) / L.tp
    head = 0.0
    if last:
        head = (pc.head or pc.embedding) / L.tp
    return wc * root, wc * head


def _embedding_moment(plan: PlanInput, pc: ParamCounts, st: dict, bufs: dict, count: float,
                      last: bool,
                      fixed: float, bwd_terms: tuple, held_logits: float, ctx: float
                      ) -> EmbeddingBackward:
    """Memory of the first stage when the token embedding's gradient is computed.

    It is the last gradient backward computes: every other gradient is complete, every
    activation is freed except the logits the loop still holds (last stage), and
    `memory.embedding_backward_bytes` is alive. ZeRO-2/3: only the root unit (embedding, and
    with pp = 1 the final norm and head) is still unsharded, with the untied head's unsharded
    gradient, and the last block's fp32 reduce-scatter input is still held (FSDP2 frees it when
    the next unit's reduce-scatter is issued); DDP's buckets persist. Source: measured with the
    dry-run, gpt2-124m-L2 dp2 z0 fp32 (-10.8% before this moment was modelled), gpt2-350m-L2
    dp4 z3 tp4 fp32 (-32%) and llama2-7b-L1 dp4 z3 tp2+sp (+12% with the old ZeRO-3 moment).
    """
    L, model = plan.layout, plan.model
    root_live, head_held, blk, tmp = bwd_terms
    grads_rest = st["grads"] - st["grads.in_flight"]
    states = fixed - st["params.in_flight"]
    if L.zero >= 2:
        # the root unit's gradients are reduce-scattered after this moment: none of the
        # root's sharded grads exist yet
        wc = 4 if plan.precision == "fp32" else 2
        other = 1.0 - root_live / wc / count if count else 0.0
        if model.tie_embeddings and L.pp == 1:
            head_held = 0.0  # the head's contribution is in `tmp`
        states += root_live + head_held + 4.0 * blk
    else:
        other = 1.0 - pc.embedding / L.tp / count if count else 0.0
        states += bufs.get("ddp_buckets", 0.0)
    states += bufs.get("rope_tables", 0.0)
    # + ctx: the runtime context is outside every moment's tensors
    return EmbeddingBackward(states, grads_rest * max(0.0, other),
                             held_logits if last else 0.0, tmp, ctx)


def _pipeline_buffers(plan: PlanInput, bufs: dict, buffers: float, rank: int, m: int
                      ) -> tuple[dict, float]:
    """The buffers of a pipeline rank: the receive buffers torch keeps per micro-batch, and
    each chunk's own rotary tables."""
    L = plan.layout
    recv = pp_recv_buffer_bytes(hidden=plan.model.dim, tokens=plan.seq_len / L.cp
                                * plan.micro_batch, precision=plan.precision,
                                zero=L.zero, tp=L.tp, sp=L.sp, pp=L.pp,
                                virtual=L.pp_virtual, rank=rank, microbatches=m)
    buffers += recv - bufs.get("pp_p2p", 0.0)
    bufs = dict(bufs, pp_p2p=recv)
    if "rope_tables" in bufs and L.pp_virtual > 1:
        # each chunk's stage module keeps its own cos/sin buffers (dry-run, interleaved
        # v2: 2 x 2.1 MB of module buffers on rank 1)
        buffers += (L.pp_virtual - 1) * bufs["rope_tables"]
        bufs["rope_tables"] *= L.pp_virtual
    return bufs, buffers


def _stored_activations(plan: PlanInput, moments: tuple, st: dict, layers: int,
                        in_flight: float, m: int, last: bool,
                        acts_terms: tuple[float, float, float, float]
                        ) -> tuple[float, float, float]:
    """(largest stored activations, the blocks' part of them, activations + the gradients that
    exist by then) of a rank; pipelines walk the schedule's own moments (`schedule_moments`:
    stored activations per chunk, whether the gradients exist yet)."""
    per_layer, recompute, head_acts, _ = acts_terms
    one_layer = per_layer
    extra = 0.0
    if recompute and layers:
        # the block being recomputed in backward: full's block input is part of its set,
        # selective keeps its stored tensors next to what the recompute re-creates
        one_layer = recompute if plan.ac == "full" else per_layer + recompute
        extra = recompute
    grads = st["grads"]
    if plan.layout.pp > 1:
        acts = fwdbwd = -1.0
        most = 0
        for lay, hd, g, _ in moments:
            stored = lay * per_layer + hd * head_acts
            with_grads = stored + (grads if g else 0.0)
            if stored > acts:
                acts = stored
            if with_grads > fwdbwd:
                fwdbwd = with_grads
            if lay > most:
                most = lay
        return acts + extra, most * per_layer, fwdbwd + extra
    acts = in_flight * layers * per_layer + extra + (head_acts if last else 0.0)
    block_stored = in_flight * layers * per_layer
    if m > 1:
        return acts, block_stored, acts + grads
    # one micro-batch, no pipeline: the backward trades activations for grads
    return acts, block_stored, max(acts + st["grads.in_flight"], grads + one_layer)


def _zero_moments(plan: PlanInput, pc: ParamCounts, st: dict, fixed: float, buffers: float,
                  bufs: dict,
                  fsdp: float, count: float, bwd_terms: tuple, layers: int, m: int,
                  block_stored: float, acts_terms: tuple[float, float, float, float],
                  rank: int) -> list[Moment]:
    """ZeRO-2/3's moments (FSDP2 as parallel/fsdp.py builds it; measured with the dry-run,
    llama2-7b-L1 dp8 z3: +12% and llama-1024-L4 dp4 z2 fp32: +6% before the block moment
    was modelled):

    - a block's backward: ZeRO-3 gathers the root unit (embedding and/or final norm + head)
      again for the head's backward and keeps it unsharded until its post-backward at the
      very end (ZeRO-2 keeps every unit gathered anyway), with the head's unsharded 16-bit
      gradient (untied) or the head's gradient contribution autograd holds for the tied
      embedding; ZeRO-3 gathers the block's unit (and prefetches the next one); its unsharded
      grads fill, then its fp32 reduce-scatter input is allocated after the unit's parameters
      are freed (the previous block's input is still held while the next block computes).
      The head's activations are freed by then, except the logits the loop holds.
    - pipelines: torch's pipeline stage turns FSDP2's gradient sync and reshard-after-backward
      off until the step's last backward: every unit of the stage stays gathered and its
      gradients accumulate unsharded, both in the compute dtype, next to the micro-batches'
      activations. Source: measured with the dry-run, llama-1024-L4 dp2 z3 pp2 1f1b (-12%
      without this).
    - the end of backward, the root unit's post-backward: its fp32 reduce-scatter input and
      output shard (which become its sharded grads: not counted twice), with one of its 16-bit
      unsharded grads (embedding or head) not yet freed and the logits the loop holds; ZeRO-3
      has resharded the root's parameters by then (ZeRO-2 keeps every unit gathered: counted
      in `rest`). Source: the dry-run's peak of llama-1024-L4 dp2 z3 (sharded grads of the
      blocks only, one bf16 root grad, no unsharded params: +18% with the root gathered and
      its shard counted twice). The embedding's gradient is `_embedding_moment`.
    """
    L = plan.layout
    per_layer, recompute, _, held_logits = acts_terms
    root_live, head_held, blk, _ = bwd_terms
    wc = 4 if plan.precision == "fp32" else 2
    rest = fixed - (st["params.in_flight"] if L.zero >= 3 else 0.0)
    grads_rest = st["grads"] - st["grads.in_flight"]
    more = 1.0 if layers > 1 else 0.0  # a next block to prefetch / a previous RS input
    if L.zero >= 3:
        compute = wc * blk * (1 + more) + wc * blk + 4.0 * blk * more
        reduce = wc * blk * more + wc * blk + 4.0 * blk
    else:
        root_live = 0.0  # counted in `fixed` with every other gathered unit
        compute, reduce = wc * blk + 4.0 * blk * more, wc * blk + 4.0 * blk
    held = held_logits if rank == L.pp - 1 else 0.0
    accumulated = grads_rest if (m > 1 or L.pp > 1) else 0.0
    if m > 1 or L.pp > 1:
        bwd = block_stored + grads_rest
    else:  # the last block to finish has every other block's grads and no activations
        bwd = max(block_stored - per_layer, grads_rest * (layers - 1) / layers)
    copies = max(compute, reduce)
    if plan.ac == "full":
        bwd += recompute  # the block being recomputed (its whole no-AC set)
    elif plan.ac == "selective" and layers:
        # The recompute's peak comes earlier than the copies': as the first block's backward
        # starts, it holds everything kept, what the recompute re-created and the MLP
        # backward's first gradients, and of the unit copies only the gathered parameters
        # (ZeRO-3: this block and the prefetched next). Dry-run: tiny-llama dp4 z2 b2x2
        # (-1.1%) and llama2-7b-L1 dp4 z3 tp2+sp (adding the recompute to the copies' moment
        # is 13% over: at 7B widths the block's gradient copies are not alive then).
        e = 4 if plan.precision == "fp32" else 2
        work = mlp_backward_work_bytes(plan.model, tokens=plan.seq_len / L.cp
                                       * plan.micro_batch, tp=L.tp, sp=L.sp, e=e,
                                       weight_bytes=wc)
        early = block_stored + accumulated + recompute + work
        early_copies = wc * blk * (1 + more) if L.zero >= 3 else 0.0
        if early + early_copies > bwd + copies:
            bwd, copies = early, early_copies
    out: list[Moment] = [ZeroBlockBackward(rest, buffers, fsdp, root_live, head_held,
                                           copies, bwd, held)]
    if L.pp > 1:
        out.append(ZeroStageBackward(fixed, st["params.in_flight"], buffers, fsdp, wc * count,
                                     block_stored, held))
    root_grad = end_held = root_grads = 0.0
    if L.zero >= 3 and root_live:
        root_grads = grads_rest * (root_live / wc) / count if count else 0.0
        embedding = wc * pc.embedding / L.tp if rank == 0 else 0.0
        root_grad, end_held = max(embedding, head_held), held
    out.append(ZeroEndOfBackward(rest, buffers, fsdp, bufs.get("fsdp_reduce_scatter", 0.0),
                                 grads_rest, root_grad, end_held, root_grads))
    return out


def _loss_moment(plan: PlanInput, st: dict, fixed: float, buffers: float, fsdp: float,
                 quant: float, count: float, m: int, stored: float, moments: tuple,
                 acts_terms: tuple[float, float, float, float], root_live: float,
                 layers: int, block: float) -> LossBackward:
    """The last stage's loss backward: every activation still stored plus the cross-entropy
    backward temporaries (`loss_backward_bytes`). FSDP2 has resharded every block (ZeRO-3),
    so in-flight ZeRO-3 copies and FSDP buffers are left out, except the last block's
    all-gather that the root's pre-backward prefetches (ZeRO-3, pp = 1; `block` = one
    block's parameters); accumulated grads (m > 1) are held. Pipelines: each loss backward
    of the schedule, with what is stored then and the gradients if they exist.

    Not counted, because not held: logits (the last stage runs the fused loss, pipelined or
    not, `config.fused_head_loss`; zero-bubble's logits of earlier micro-batches are not kept
    either: the trainer runs the schedule with return_outputs=False)."""
    L = plan.layout
    per_layer, _, head_acts, _ = acts_terms
    # the head weight the fused loss reads: FSDP2's 16-bit unsharded copy under ZeRO-2/3
    # with 16-bit compute, else the fp32 parameter
    weight_bytes = 2 if (L.zero >= 2 and plan.precision != "fp32") else 4
    loss_tmp = loss_backward_bytes(plan.model, seq_len=plan.seq_len,
                                   micro_batch=plan.micro_batch, tp=L.tp, cp=L.cp,
                                   fused=fused_head_loss(L), precision=plan.precision,
                                   weight_bytes=weight_bytes,
                                   chunk_tokens=plan.loss_chunk_tokens)
    resting = fixed - (st["params.in_flight"] if L.zero >= 3 else 0.0)
    held = st["grads"] - st["grads.in_flight"] if (m > 1 or L.pp > 1) else 0.0
    wc = 4 if plan.precision == "fp32" else 2
    if L.pp > 1 and L.zero >= 2:
        # the stage's units gathered and grads unsharded (see `_zero_moments`)
        resting = fixed - st["params.in_flight"] + wc * count
        # FSDP2 accumulates the unsharded gradients of the micro-batches in its reduce dtype
        # (fp32) while gradient sync is off (FSDPParam.to_accumulated_grad_if_needed); the
        # dry-run's loss backward, llama-1024-L4 dp2 z3 pp2 1f1b rank 2, holds the head's as
        # a (32000, 1024) fp32 tensor (-10% with the compute dtype)
        held = 4.0 * count
    if L.zero >= 3 and L.pp == 1:
        # the fused loss reads the head inside the root unit's forward: FSDP2 does not
        # reshard the root after forward, so its unsharded copy is alive (dry-run,
        # gpt2-124m-L2 dp8 z3: -15% without it)
        resting += root_live
        if layers:
            # the root's pre-backward hook (on the loss) prefetches the last block before
            # the loss backward runs (FSDP2's default backward prefetch, the reverse
            # post-forward order): its all-gather output, one block in the compute dtype,
            # is alive until that block's backward copies it out (dry-run, tiny dp2 z3:
            # 99,968 B = 2 x 49,984 block parameters, -4.2% total without it)
            resting += wc * block
    if L.pp == 1:
        return LossBackward(resting, buffers, fsdp, quant, stored, 0.0, held, loss_tmp)
    return max((LossBackward(resting, buffers, fsdp, quant, lay * per_layer, hd * head_acts,
                             held if g else 0.0, loss_tmp)
                for lay, hd, g, is_loss in moments if is_loss), key=_total)


def _total(moment: Moment) -> float:
    return moment.total


def _rank_memory(plan: PlanInput, terms: ModelTerms,
                 acts_terms: tuple[float, float, float, float], zs: int, rank: int, layers: int,
                 in_flight: float, m: int, convention: str, device: str) -> RankMemory:
    """Memory of pipeline rank `rank` holding `layers` blocks with `in_flight` micro-batches:
    the largest of its moments (calibrated against the dry-run, see
    benchmarks/results/planner_accuracy.md)."""
    L = plan.layout
    last = rank == L.pp - 1
    st, count, unit, sharded, fixed, bwd_terms = _rank_states(plan, terms, zs, rank == 0,
                                                              last, layers, convention)
    # fsdp: the FSDP collectives' buffers; quant: fp8's quantization temporary, which exists
    # only inside a converted linear's forward/backward: not during the optimizer step, nor
    # the (16-bit) head's loss backward
    bufs, buffers, ctx, fsdp, quant = _buffers(plan, terms, zs, unit, device, count)
    moments: tuple = ()
    if L.pp > 1:
        moments = schedule_moments(L.pp_schedule, L.pp, m, L.pp_virtual, rank,
                                   plan.model.num_layers)
        bufs, buffers = _pipeline_buffers(plan, bufs, buffers, rank, m)
    acts, block_stored, fwdbwd = _stored_activations(plan, moments, st, layers, in_flight, m,
                                                     last, acts_terms)
    # torch's foreach AdamW/SGD allocate an fp32 intermediate per parameter during step(); on a
    # GPU the trainer runs fused AdamW, which allocates none (the dry-run measures none).
    step_tmp = 0.0 if plan.offload != "none" or device != "cpu" else 4.0 * sharded
    step = OptimizerStep(fixed, st["params.in_flight"], buffers, fsdp, quant, st["grads"],
                         st["grads.in_flight"], step_tmp)
    cands: list[Moment]
    if L.zero >= 2 and layers and unit > 0:
        cands = [*_zero_moments(plan, terms.counts, st, fixed, buffers, bufs, fsdp, count,
                                bwd_terms, layers, m, block_stored, acts_terms, rank), step]
    else:  # states with the FSDP units in flight, every buffer, activations/grads
        cands = [ForwardBackward(fixed, buffers, fwdbwd), step]
    loss_tmp = emb_tmp = 0.0
    if last:
        extra = acts_terms[1] if layers else 0.0
        loss = _loss_moment(plan, st, fixed, buffers, fsdp, quant, count, m, acts - extra,
                            moments, acts_terms, bwd_terms[0], layers, bwd_terms[2])
        loss_tmp = loss.loss_temp
        bufs = dict(bufs, loss_backward_temp=loss_tmp)
        cands.append(loss)
    if rank == 0 and layers and plan.offload == "none":
        emb_tmp = bwd_terms[3]
        cands.append(_embedding_moment(plan, terms.counts, st, bufs, count, last, fixed, bwd_terms,
                                       acts_terms[3], ctx))
        bufs = dict(bufs, embedding_backward_temp=emb_tmp)
    peak = max(cands, key=_total)
    total = peak.total
    reserved = total + FRAGMENTATION * (total - ctx)
    return RankMemory(reserved, total, st, bufs, buffers + loss_tmp + emb_tmp, acts,
                      acts_terms[0], step_tmp, count, rank, in_flight, peak.name)


def worst_rank(plan: PlanInput, *, convention: str = "scaletrain", modern: bool = True,
               terms: ModelTerms | None = None) -> tuple[RankMemory, float]:
    """The worst rank's numbers (by reserved bytes) and the largest parameter count of any
    rank (what paces gradient synchronisation)."""
    L = plan.layout
    m = max(1, plan.grad_accum)
    device = "cpu" if plan.hardware.name == "cpu" else "gpu"
    zs = L.zero_shards
    terms = model_terms(plan, terms)
    acts_terms = _activation_terms(plan, terms, modern)
    worst = None
    max_params = 0.0
    for rank, layers, in_flight in rank_candidates(plan.model.num_layers, L.pp, L.pp_virtual,
                                                   L.pp_schedule, m):
        nums = _rank_memory(plan, terms, acts_terms, zs, rank, layers, in_flight, m, convention,
                            device)
        if worst is None or nums.reserved > worst.reserved:
            worst = nums
        if nums.params > max_params:
            max_params = nums.params
    assert worst is not None
    return worst, max_params


def breakdown(plan: PlanInput, nums: RankMemory) -> MemoryBreakdown:
    """The public MemoryBreakdown of a `RankMemory`."""
    L, st = plan.layout, nums.states
    cap = plan.hardware.memory_bytes
    return MemoryBreakdown(
        params=st["params"], grads=st["grads"], optimizer=st["optimizer"],
        activations=nums.activations, buffers=nums.buffers, total=nums.total,
        reserved=nums.reserved, capacity=cap, fits=nums.reserved <= cap,
        rank=nums.rank * L.tp * L.cp * L.dp, buffer_terms=dict(nums.buffer_terms),
        detail={"params.in_flight": st["params.in_flight"],
                "grads.in_flight": st["grads.in_flight"], "offloaded.cpu": st["offloaded"],
                "activations.per_layer": nums.per_layer,
                "activations.in_flight": nums.in_flight,
                "optimizer_step.temp": nums.step_temp,
                "allocator_reserve": nums.reserved - nums.total,
                "params.count": nums.params, "pipeline_rank": nums.rank},
        moment=nums.moment)


def pipeline_rank_memory(plan: PlanInput, pp_rank: int, *, convention: str = "scaletrain",
                         modern: bool = True) -> MemoryBreakdown:
    """Memory of pipeline rank `pp_rank` (not necessarily the worst): what a real rank of the
    run should compare itself with (the trainer's ledger, `verify` of a live run)."""
    L = plan.layout
    if not 0 <= pp_rank < L.pp:
        raise ValueError(f"pp_rank={pp_rank}: the layout has pp={L.pp} pipeline ranks")
    m = max(1, plan.grad_accum)
    layers = stage_layer_counts(plan.model.num_layers, L.pp, L.pp_virtual)[pp_rank]
    in_flight = (1.0 if L.pp == 1 else
                 inflight_per_rank(L.pp_schedule, L.pp, m, L.pp_virtual)[pp_rank])
    device = "cpu" if plan.hardware.name == "cpu" else "gpu"
    terms = ModelTerms(plan.model)
    nums = _rank_memory(plan, terms, _activation_terms(plan, terms, modern), L.zero_shards,
                        pp_rank, layers, in_flight, m, convention, device)
    return breakdown(plan, nums)


def estimate_memory(plan: PlanInput, *, convention: str = "scaletrain", modern: bool = True,
                    terms: ModelTerms | None = None) -> MemoryBreakdown:
    """Memory of the plan's worst rank without the time model (the search's first filter)."""
    return breakdown(plan, worst_rank(plan, convention=convention, modern=modern,
                                      terms=terms)[0])
