"""Pipeline and MoE memory terms of the per-rank planner (torch-free): the schedule's backward
moments, the communication buffers of the micro-batches in flight and the MoE dispatch
tensors. The agreement with the dry-run itself is tests/planner/test_accuracy.py (QUICK_EXTRA)
and tests/unit/test_dryrun_pipeline_buffers.py."""

from __future__ import annotations

import itertools

import pytest

from scaletrain.config import Layout, hardware_preset, resolve_model
from scaletrain.planner import PlanInput
from scaletrain.planner.memory.activations import layer_activation_bytes
from scaletrain.planner.memory.buffers import pp_boundary_bytes
from scaletrain.planner.memory.pipeline_ranks import schedule_moments


def _flags(moments) -> set[tuple[int, int, bool, bool]]:
    """(stored layers, stored heads, grads exist, is loss) of each moment of a schedule
    without a split backward, whose moments have nothing past an input-gradient pass."""
    assert all(x[4:7] == (0, 0, False) for x in moments)
    return {x[:4] for x in moments}


def test_gpipe_first_backward_has_every_microbatch_and_no_grads():
    # 4 layers over 2 stages (+ embedding and head): 2 layers per rank; last rank = rank 1
    moments = schedule_moments("gpipe", 2, 4, 1, 1, 4)
    flags = _flags(moments)  # (stored layers, heads, grads exist, loss)
    # the first loss backward: all 4 micro-batches (2 layers each, and their head) stored,
    # no gradient allocated yet
    assert (8, 4, False, True) in flags
    # the second: 3 stored next to the gradients
    assert (6, 3, True, True) in flags
    assert max(lay for lay, _, g, *_ in moments if g) == 6


def test_one_f_one_b_last_rank_holds_one_microbatch():
    moments = _flags(schedule_moments("1f1b", 2, 4, 1, 1, 4))
    assert max(lay for lay, *_ in moments) == 2
    assert max(hd for _, hd, *_ in moments) == 1
    # rank 0 holds p - rank = 2 micro-batches at its backward
    assert max(lay for lay, *_ in schedule_moments("1f1b", 2, 4, 1, 0, 4)) == 4


def test_zero_bubble_keeps_the_graph_until_w():
    """Last rank: F0 I0 F1 I1 W0 ...: at I1 micro-batch 0 waits for its W past its I (its 2
    layers and its head counted apart: `memory.split_backward`), so two are stored; gradients
    exist only after the first W, whose moment (before it frees micro-batch 0) has both past
    their I."""
    moments = schedule_moments("zero-bubble", 2, 4, 1, 1, 4)
    split = {x[:7] for x in moments}  # without the cast-gradient marks (ZeRO-0/1 autocast)
    assert (4, 2, False, True, 2, 1, False) in split
    assert (4, 2, False, False, 4, 2, True) in split
    assert max(x.stored_layers for x in moments if x.is_loss) == 4
    one_f_one_b = schedule_moments("1f1b", 2, 4, 1, 1, 4)
    assert max(lay for lay, *_ in moments) > max(lay for lay, *_ in one_f_one_b)


def test_interleaved_weights_chunks_by_their_own_layers():
    """pp2 v2 over 4 layers: stages hold 1, 2, 1, 0 layers (embedding and head count as a unit
    each); rank 1 holds stages 1 (2 layers) and 3 (the head only)."""
    moments = _flags(schedule_moments("interleaved", 2, 4, 2, 1, 4))
    # at the third loss backward: stage 1 holds micro-batches 2 and 3 (2 x 2 layers)
    assert (4, 1, True, True) in {x[:4] for x in moments}
    for lay, *_ in moments:
        assert lay % 2 == 0  # only the 2-layer chunk stores block activations


def test_later_microbatches_mark_the_deferred_cast_gradients():
    """The end of a chunk's full backward of a micro-batch after the first that ran its
    forward carries the chunk's layers (their autocast casts' gradients wait for it) and, on
    stage 0, the embedding's backward; the first micro-batch's does not."""
    # 1F1B, rank 0 of 2 on 4 layers (stage 0: layers 0-1 and the embedding): F0 F1 B0 F2 B1
    # F3 B2 B3; after B1 micro-batch 2 is stored (2 layers), after B3 none; with one
    # micro-batch nothing is marked
    assert not any(
        x.deferred_layers or x.first_stage for x in schedule_moments("1f1b", 2, 1, 1, 0, 4)
    )
    moments = schedule_moments("1f1b", 2, 4, 1, 0, 4)
    marked = {(x.stored_layers, x.deferred_layers, x.first_stage) for x in moments if x.first_stage}
    assert marked == {(2, 2, True)}  # the largest kept: B1 and B2 (2 stored), not B3 (0)
    # the last rank: marked, not first stage
    last = schedule_moments("1f1b", 2, 4, 1, 1, 4)
    assert {x.deferred_layers for x in last if x.deferred_layers} == {2}
    assert not any(x.first_stage for x in last)
    # zero-bubble: torch's stage 0 runs its whole backward in W, marked; another stage's
    # weight-only W is not
    zb = schedule_moments("zero-bubble", 2, 4, 1, 0, 4)
    assert any(x.first_stage and x.deferred_layers == 2 for x in zb)
    assert not any(x.deferred_layers for x in schedule_moments("zero-bubble", 2, 4, 1, 1, 4))
    # interleaved v2 on 4 layers: rank 0 holds stage 0 (no block) and stage 2 (2 layers)
    il = schedule_moments("interleaved", 2, 4, 2, 0, 4)
    assert {x.deferred_layers for x in il if x.first_stage} == {0}
    assert {x.deferred_layers for x in il if x.deferred_layers} == {2}


def test_pipelined_autocast_first_stage_peaks_at_a_later_embedding_backward():
    """Issue #37's held-in layout, llama3-8b dp2 z1 pp4 1F1B, full AC, s2048, 8 micro-batches
    (dry-run, rank 0: 31.43 GiB, 9% over the old plan): rank 0 peaks at a later micro-batch's
    embedding backward, with the step's 16-bit casts of its 7 blocks and their gradients (the
    casts' backward runs after the embedding's), every fp32 gradient, three other
    micro-batches' 7 fp32 block inputs, the boundary tensors and the embedding's fp32
    gradient temporary, summed term by term here."""
    from scaletrain.planner.memory.rank import pipeline_rank_memory

    model = resolve_model("llama3-8b")
    layout = Layout(dp=2, zero=1, pp=4, pp_schedule="1f1b")
    plan = PlanInput(
        model, hardware_preset("h100-sxm"), 8, layout, 2048, 16, 1, precision="bf16", ac="full"
    )
    mem = pipeline_rank_memory(plan, 0)
    assert mem.moment == "embedding backward on the first stage"
    pc, blocks = model.param_counts(), 7
    linears = blocks * (pc.attention_per_tp(1) + pc.mlp)
    params = pc.embedding + linears + blocks * pc.norms
    casts = 2.0 * linears
    states = 4 * params + 4 * params + 8 * params / 2  # fp32 params, grads, ZeRO-1 AdamW
    stored = 3 * blocks * 4 * 2048 * model.dim  # fp32 stream, one input per block
    bufs = mem.buffer_terms
    assert bufs["embedding_backward_temp"] == 4 * pc.embedding
    expected = states + 2 * casts + stored + bufs["pp_p2p"] + bufs["rope_tables"]
    expected += bufs["embedding_backward_temp"] + bufs["runtime_context"]
    assert mem.total == pytest.approx(expected, rel=1e-12)


def _boundary(zero: int, pp: int, virtual: int, rank: int, m: int = 4, schedule: str = "") -> float:
    """pp_boundary_bytes of a gpt-mini plan, seq 512, micro-batch 1, m micro-batches."""
    schedule = schedule or ("interleaved" if virtual > 1 else "1f1b")
    layout = Layout(zero=zero, pp=pp, pp_virtual=virtual, pp_schedule=schedule)
    model = resolve_model("gpt-mini")
    plan = PlanInput(model, hardware_preset("h100-sxm"), pp, layout, 512, m, 1, precision="bf16")
    return pp_boundary_bytes(plan, rank=rank)


def test_boundary_buffers_follow_the_microbatches_in_flight():
    """The trainer's stages hold their sends' and receives' tensors for the micro-batches in
    flight (issue #37): the same at 4 and 64 micro-batches once the pipeline is full."""
    one = 512 * resolve_model("gpt-mini").dim * 4  # an fp32 (b, s, h) stream under autocast
    # 1F1B pp4: rank r < p - 1 keeps its p - r outputs in flight for their backward, and the
    # gradient it receives for the first of them; the last stage one receive buffer (its
    # outputs are losses, and a received activation is then its first block's stored input)
    assert [_boundary(0, 4, 1, r) / one for r in range(4)] == [5, 4, 3, 1]
    for r in range(4):
        assert _boundary(0, 4, 1, r, m=64) == _boundary(0, 4, 1, r, m=4)
    for sched, v in (("interleaved", 2), ("zero-bubble", 2), ("dualpipev", 2)):
        for r in range(2):
            assert _boundary(0, 2, v, r, 64, sched) == _boundary(0, 2, v, r, 8, sched) > 0
    # GPipe runs every forward before a backward: every micro-batch's output is kept
    assert _boundary(0, 2, 1, 0, m=64, schedule="gpipe") == 65 * one
    # FSDP2 (ZeRO-2/3) streams in the 16-bit compute dtype
    assert _boundary(3, 4, 1, 0) == _boundary(0, 4, 1, 0) / 2
    assert _boundary(3, 1, 1, 0) == 0.0


def test_moe_dispatch_terms():
    """The MoE block's dispatch tensors: three (N*k, h) copies and as many int64 (N*k,)
    indices, one more of each under expert parallelism."""
    m = resolve_model("tiny-moe")
    kw = dict(seq_len=128, micro_batch=2, precision="bf16")
    tok, k, h = 256, m.experts_per_token, m.dim
    one_copy = 8.0 * k * tok + 2 * k * tok * h
    assert layer_activation_bytes(m, ep=2, **kw) - layer_activation_bytes(m, **kw) == pytest.approx(
        one_copy
    )
    assert layer_activation_bytes(m, ep=4, **kw) == layer_activation_bytes(m, ep=2, **kw)


def test_expert_parallel_experts_are_not_fsdp_units():
    """FSDP2 ignores expert-parallel experts: ZeRO-2 keeps no gathered 16-bit copy of them."""
    from scaletrain.planner.memory.states import StageParams, model_state_bytes

    kw = dict(precision="bf16", zero=2, zero_shards=4, expert_shards=1)
    with_experts = model_state_bytes(StageParams(dense=5000.0, expert=1000.0), **kw)
    without = model_state_bytes(
        StageParams(dense=5000.0, expert=1000.0, experts_in_fsdp=False), **kw
    )
    assert with_experts["params.in_flight"] - without["params.in_flight"] == 2 * 1000.0
    # the states at rest do not change
    assert with_experts["optimizer"] == without["optimizer"]


@pytest.mark.parametrize(
    "schedule,virtual", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zero-bubble", 1)]
)
def test_each_pipeline_rank_has_its_memory_and_the_worst_is_one_of_them(schedule, virtual):
    """`pipeline_rank_memory` answers for one named rank (what a live rank compares itself
    with); the search's worst rank is the largest of them."""
    from scaletrain.config import Layout, hardware_preset
    from scaletrain.planner import estimate_memory, pipeline_rank_memory
    from scaletrain.planner.types import PlanInput

    plan = PlanInput(
        model=resolve_model("llama2-7b"),
        hardware=hardware_preset("h100-sxm"),
        num_gpus=4,
        layout=Layout(pp=4, pp_schedule=schedule, pp_virtual=virtual),
        seq_len=4096,
        global_batch=8,
        micro_batch=1,
        precision="bf16",
    )
    ranks = [pipeline_rank_memory(plan, r) for r in range(4)]
    assert [m.detail["pipeline_rank"] for m in ranks] == [0, 1, 2, 3]
    assert max(m.reserved for m in ranks) == pytest.approx(estimate_memory(plan).reserved)
    assert ranks[0].params != ranks[3].params  # embedding on the first, head on the last
    with pytest.raises(ValueError, match="pp_rank"):
        pipeline_rank_memory(plan, 4)


@pytest.mark.parametrize(
    "model,pp,virtual,schedule",
    [
        ("deepseek-v3", 32, 1, "1f1b"),  # rank 1: two dense blocks; rank 2: two MoE blocks
        ("deepseek-v3", 16, 1, "zero-bubble"),
        ("deepseek-v3", 8, 2, "interleaved"),
        ("deepseek-v2-lite", 8, 1, "1f1b"),
    ],
)
def test_worst_rank_of_a_model_with_dense_first_blocks(model, pp, virtual, schedule):
    """An MoE model's dense first blocks and its MoE blocks are not interchangeable: the worst
    rank the planner reports is the largest of every rank's memory (DeepSeek-V3 at pp 32 once
    reported its all-dense rank 1 at 50 GiB and dropped its MoE ranks, 285 GiB)."""
    from scaletrain.config import Layout, hardware_preset
    from scaletrain.planner import estimate_memory, pipeline_rank_memory
    from scaletrain.planner.types import PlanInput

    plan = PlanInput(
        model=resolve_model(model),
        hardware=hardware_preset("h800"),
        num_gpus=pp * 4,
        layout=Layout(dp=4, zero=1, pp=pp, pp_schedule=schedule, pp_virtual=virtual),
        seq_len=4096,
        global_batch=4 * 2 * pp,
        micro_batch=1,
        precision="bf16",
    )
    ranks = [pipeline_rank_memory(plan, r).reserved for r in range(pp)]
    assert estimate_memory(plan).reserved == pytest.approx(max(ranks), rel=1e-12)


@pytest.mark.parametrize("schedule", ["dualpipev", "interleaved", "zero-bubble", "1f1b"])
@pytest.mark.parametrize("model", ["llama-1024", "tiny-deepseek"])
def test_worst_rank_is_the_largest_of_every_rank_over_a_grid(schedule, model):
    """Brute force: the worst rank the planner reports (pruned by `rank_candidates`) is the
    largest of every pipeline rank's memory, over pp, block counts, micro-batches and ZeRO
    stages. Under dualpipev the pruning once compared ranks by their average micro-batches in
    flight and kept a middle rank that stores 15 blocks at its peak over one that stores 16:
    it missed the worst rank in 93 of 960 cases of a wider grid, and in 5 of the 24 dualpipev
    cases here, by up to 2.4%."""
    import dataclasses

    from scaletrain.planner import estimate_memory, pipeline_rank_memory

    base = resolve_model("tiny-deepseek" if model == "tiny-deepseek" else "tiny-llama")
    if model == "llama-1024":
        base = dataclasses.replace(
            base, vocab_size=32000, dim=1024, num_heads=16, num_kv_heads=4, ffn_dim=2816
        )
    virtual = 1 if schedule == "1f1b" else 2
    for layers, pp, zero, rounds in itertools.product((8, 17), (4, 8), (1, 3), (2, 3)):
        if layers < pp * virtual:
            continue
        m = rounds * pp
        plan = PlanInput(
            model=dataclasses.replace(base, num_layers=layers, max_seq_len=1024),
            hardware=hardware_preset("h100-sxm"),
            num_gpus=2 * pp,
            layout=Layout(dp=2, zero=zero, pp=pp, pp_schedule=schedule, pp_virtual=virtual),
            seq_len=1024,
            global_batch=2 * m,
            micro_batch=1,
            precision="bf16",
        )
        every = [pipeline_rank_memory(plan, r).reserved for r in range(pp)]
        case = (layers, pp, zero, m)
        assert estimate_memory(plan).reserved == pytest.approx(max(every), rel=1e-12), case


MOMENTS = {
    "forward/backward peak with activations stored",
    "optimizer step",
    "block backward under ZeRO-2/3",
    "pipeline stage backward, FSDP units gathered",
    "end of backward, root unit's reduce-scatter",
    "loss backward on the last stage",
    "head weight pass (W) on the last stage",
    "embedding backward on the first stage",
}


def test_each_rank_names_a_moment_it_has():
    """Only the last stage has a loss backward and only the first an embedding backward; the
    ZeRO-2/3 moments replace the plain forward/backward one."""
    from scaletrain.config import Layout, hardware_preset
    from scaletrain.planner import pipeline_rank_memory
    from scaletrain.planner.types import PlanInput

    for zero, plain in ((1, True), (3, False)):
        plan = PlanInput(
            model=resolve_model("llama2-7b"),
            hardware=hardware_preset("h100-sxm"),
            num_gpus=8,
            layout=Layout(dp=2, pp=4, zero=zero),
            seq_len=4096,
            global_batch=16,
            micro_batch=1,
            precision="bf16",
        )
        names = [pipeline_rank_memory(plan, r).moment for r in range(4)]
        assert set(names) <= MOMENTS, names
        assert "loss backward on the last stage" not in names[:3]
        assert "embedding backward on the first stage" not in names[1:]
        fwdbwd = "forward/backward peak with activations stored"
        assert plain or fwdbwd not in names, names


@pytest.mark.parametrize(
    "model,gpus,layout,seq,batch,offload,hw,moment",
    [
        # 7B on 8 GPUs, ZeRO-3, long sequences: a block's backward (gathered units + grads)
        (
            "llama2-7b",
            8,
            dict(dp=8, zero=3),
            4096,
            8,
            "none",
            "h100-sxm",
            "block backward under ZeRO-2/3",
        ),
        # 70B pp16 zero-bubble ZeRO-3, parameters offloaded: torch's stage keeps every unit
        # gathered with unsharded grads in backward (87.1 GB, over a block's backward 81.1 GB
        # and the last stage's loss backward 70.8 GB; llama2-70b: llama3's 128k vocabulary
        # makes the loss backward the peak since the 16-bit norms keep x alone)
        (
            "llama2-70b",
            64,
            dict(tp=2, sp=True, pp=16, pp_schedule="zero-bubble", zero=3),
            4096,
            64,
            "params",
            "h100-sxm",
            "pipeline stage backward, FSDP units gathered",
        ),
        # a tiny model in fp32 on CPUs, 8 sequences per micro-batch: the 256-token vocabulary's
        # loss backward outweighs two 64-wide blocks; with 1 sequence, the start of the last
        # block's backward (the dry-run of this layout peaks inside its w2 backward: both
        # blocks' activations, this block gathered and the next one's all-gather issued)
        ("tiny", 2, dict(dp=2, zero=3), 128, 16, "none", "cpu", "loss backward on the last stage"),
        ("tiny", 2, dict(dp=2, zero=3), 128, 2, "none", "cpu", "block backward under ZeRO-2/3"),
    ],
)
def test_explain_names_the_peak_moment(model, gpus, layout, seq, batch, offload, hw, moment):
    from scaletrain.config import Layout, hardware_preset
    from scaletrain.planner import estimate
    from scaletrain.planner.output.explain import explain
    from scaletrain.planner.types import PlanInput

    plan = PlanInput(
        model=resolve_model(model),
        hardware=hardware_preset(hw),
        num_gpus=gpus,
        layout=Layout(**layout),
        seq_len=seq,
        global_batch=batch,
        micro_batch=batch // gpus if hw == "cpu" else 1,
        precision="fp32" if hw == "cpu" else "bf16",
        offload=offload,
    )
    est = estimate(plan)
    assert est.memory.moment == moment
    assert f"peak moment: {moment}" in explain(est)


# (schedule, p, m, v) -> `boundary_tensors` of every rank, as the walk over Op records and
# per-rank sets of seen actions counted them before it was rewritten on flags (main at
# 806ebbe; equal on all 1,881 cases of p <= 16, every legal m up to 6 rounds, when rewritten)
PINNED_BOUNDARY = {
    ("zero-bubble", 8, 16, 1): (9, 13, 14, 15, 16, 17, 18, 3),
    ("zero-bubble", 4, 8, 2): (16, 13, 14, 15),
    ("interleaved", 8, 16, 2): (27, 26, 24, 22, 20, 18, 16, 16),
    ("interleaved", 4, 10, 4): (31, 25, 23, 23),
    ("interleaved", 3, 8, 2): (16, 12, 11),
    ("dualpipev", 8, 16, 2): (20, 22, 23, 23, 23, 23, 23, 14),
    ("dualpipev", 3, 8, 2): (10, 13, 7),
    ("1f1b", 4, 4, 1): (5, 4, 3, 1),
    ("gpipe", 4, 3, 1): (4, 4, 4, 3),
}


@pytest.mark.parametrize("key", list(PINNED_BOUNDARY), ids=str)
def test_boundary_counts_are_the_previous_walks(key: tuple[str, int, int, int]) -> None:
    """The lowering (torch's lock-step walk on flags), the sends' releases and the holding walk
    count what they counted before they were made faster (issue 34's search time), on every
    schedule, irregular rounds and both of DualPipeV's turns included."""
    from scaletrain.planner.time.pipeline_comms import boundary_tensors

    schedule, p, m, v = key
    assert tuple(boundary_tensors(schedule, p, m, v, r) for r in range(p)) == PINNED_BOUNDARY[key]


def _whole_walk(schedule: str, p: int, m: int, v: int) -> tuple[int, ...]:
    """`boundary_tensors` of every rank without its shortcut: the whole step walked."""
    from scaletrain.planner.time import pipeline_comms as pc

    if schedule in pc.SINGLE_STAGE:
        return tuple(pc._most_held_single_stage(schedule, p, m, r) for r in range(p))
    return pc._most_held_per_rank(schedule, p, m, v)


def _legal_microbatches(schedule: str, p: int, *, irregular_every: int) -> list[int]:
    """The m up to 12 rounds of p that torch runs for `schedule` (dualpipev: m >= 2p; the
    interleaved ones: a whole number of rounds): every m up to 2p, the multiples of p, and of
    the others those divisible by `irregular_every` (a sample)."""
    from scaletrain.planner.time.pipeline import microbatches_per_round

    out = []
    for m in range(1, 12 * p + 1):
        if schedule == "dualpipev" and m < 2 * p:
            continue
        if schedule in ("interleaved", "zero-bubble"):
            try:
                microbatches_per_round(p, m)
            except ValueError:
                continue  # not a whole number of rounds: torch refuses it
        if m % p and m > 2 * p and m % irregular_every:
            continue
        out.append(m)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "schedule,v",
    [("1f1b", 1), ("interleaved", 2), ("interleaved", 4), ("zero-bubble", 1), ("zero-bubble", 2)]
    + [("zero-bubble", 3), ("dualpipev", 2)],
)
def test_boundary_walk_shortcut_equals_the_whole_step(schedule: str, v: int) -> None:
    """`boundary_tensors` walks a few rounds past the warm-up (the steady state repeats); on
    the legal m up to 12 rounds of p = 2, 3, 4, 6, 8 (multiples of p and of 5, and every m up
    to 2p) it equals the whole step's walk."""
    from scaletrain.planner.time.pipeline_comms import boundary_tensors

    checked = 0
    for p in (2, 3, 4, 6, 8):
        for m in _legal_microbatches(schedule, p, irregular_every=5):
            short = tuple(boundary_tensors(schedule, p, m, v, r) for r in range(p))
            assert short == _whole_walk(schedule, p, m, v), (schedule, p, m, v)
            checked += 1
    assert checked > 40


@pytest.mark.slow
@pytest.mark.parametrize(
    "schedule,v",
    [("1f1b", 1), ("interleaved", 2), ("interleaved", 3), ("zero-bubble", 1), ("zero-bubble", 4)]
    + [("dualpipev", 2)],
)
def test_schedule_moments_shortcut_equals_the_whole_step(schedule: str, v: int) -> None:
    """`schedule_moments` walks a few rounds past the warm-up; on the legal m up to 12 rounds of
    p = 2, 3, 5, 8 (every rank, two layer counts: even and uneven stages) its moments equal the
    whole step's, without FSDP2's state and with all of it (gradients and gathered units: a
    state it carries less of is a projection of these), and GPipe's are walked whole."""
    from scaletrain.planner.memory.pipeline_ranks import _walk_moments

    whole = _walk_moments.__wrapped__  # uncached, walking the m it is given
    checked = 0
    for p in (2, 3, 5, 8):
        for m in _legal_microbatches(schedule, p, irregular_every=7):
            for layers in (p * v, 2 * p * v + 3):
                for r in range(p):
                    for fsdp in ("off", "grads_and_units"):
                        short = schedule_moments(schedule, p, m, v, r, layers, fsdp)
                        expected = whole(schedule, p, m, v, r, layers, fsdp)
                        assert short == expected, (schedule, p, m, v, r, fsdp)
                        checked += 1
    assert checked > 400
    assert schedule_moments("gpipe", 2, 64, 1, 0, 4)[-1].stored_layers == 64 * 2
