"""ZeRO-2/3 under pipelining (torch-free): FSDP2's units and unsharded gradients as torch's
pipeline stage holds them (`planner.memory.pipeline_fsdp`, the FSDP2 state of
`pipeline_ranks.schedule_moments`). The agreement with the dry-run is
tests/planner/test_accuracy.py (`test_zero_pipelines_within_tolerance`) and the ZeRO pipeline
rows of benchmarks/planner_accuracy.py."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, fsdp_reshard_after_forward, hardware_preset, resolve_model
from scaletrain.planner import PlanInput, pipeline_rank_memory
from scaletrain.planner.memory.pipeline_ranks import fsdp_state, schedule_moments
from scaletrain.planner.time.comm import CommInputs, comm_volumes

MiB = 2**20
LLAMA = dataclasses.replace(  # planner_accuracy's llama-1024-L4
    resolve_model("tiny-llama"),
    num_layers=4,
    dim=1024,
    num_heads=16,
    num_kv_heads=4,
    ffn_dim=2816,
    vocab_size=32000,
    max_seq_len=4096,
    name="llama-1024-L4",
)


def _plan(zero: int, schedule: str = "zero-bubble", v: int = 1, precision: str = "bf16"):
    layout = Layout(dp=2, zero=zero, pp=2, pp_schedule=schedule, pp_virtual=v)
    return PlanInput(
        model=LLAMA,
        hardware=hardware_preset("h100-sxm"),
        num_gpus=4,
        layout=layout,
        seq_len=256,
        global_batch=16,
        micro_batch=2,
        precision=precision,
    )


def test_zero3_keeps_its_units_gathered_under_a_split_backward():
    """torch's weight pass finds the weights through the stage's registered parameters, so a
    split-backward pipeline's ZeRO-3 is not resharded after forward: it holds what ZeRO-2
    holds, on every rank; 1F1B's ZeRO-3 still reshards (and holds less)."""
    for schedule in ("zero-bubble", "dualpipev"):
        assert not fsdp_reshard_after_forward(Layout(dp=2, zero=3, pp=2, pp_schedule=schedule))
    assert fsdp_reshard_after_forward(Layout(dp=2, zero=3, pp=2))
    assert fsdp_reshard_after_forward(Layout(dp=2, zero=3))
    assert not fsdp_reshard_after_forward(Layout(dp=2, zero=2))
    for v in (1, 2):
        for rank in (0, 1):
            z2 = pipeline_rank_memory(_plan(2, v=v), rank)
            z3 = pipeline_rank_memory(_plan(3, v=v), rank)
            assert z3.total == z2.total and z3.moment == z2.moment
    assert pipeline_rank_memory(_plan(3, "1f1b"), 1).total < (
        pipeline_rank_memory(_plan(2, "1f1b"), 1).total
    )


def test_split_zero3_communicates_as_zero2():
    """Gathered once per step like ZeRO-2, not re-gathered after every forward."""
    kw = dict(
        hardware=hardware_preset("h100-sxm"),
        stage_params=1e9,
        layers=20,
        moe_layers=0,
        tokens=4096.0,
        hidden=5120,
        kv_dim=5120,
        experts_per_token=2,
        micro_batches=4,
    )
    zb3 = comm_volumes(
        CommInputs(layout=Layout(dp=8, pp=2, zero=3, pp_schedule="zero-bubble"), **kw)
    )
    zb2 = comm_volumes(
        CommInputs(layout=Layout(dp=8, pp=2, zero=2, pp_schedule="zero-bubble"), **kw)
    )
    assert zb3 == zb2
    one_f_one_b = comm_volumes(CommInputs(layout=Layout(dp=8, pp=2, zero=3), **kw))
    assert one_f_one_b["fsdp_all_gather"] == pytest.approx((4 + 1) * 7 / 8 * 2e9)


def test_weight_pass_gradients_wait_for_the_next_input_pass():
    """The last rank of pp2 zero-bubble runs F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3: W0's bf16
    gradients are folded into fp32 by I2's post-backward hooks, W1's wait through I3's loss
    backward (both dtypes at once), and W2 and W3's reach REDUCE_GRAD unfolded. The first
    rank's W is its whole backward (folded at once: never pending); 1F1B's B likewise."""
    last = 1 << 1
    moments = schedule_moments("zero-bubble", 2, 4, 1, 1, 4, "grads")
    losses = {(x.accumulated, x.pending) for x in moments if x.is_loss}
    assert losses == {(0, 0), (last, last)}
    assert [(x.accumulated, x.pending) for x in moments if x.reduce_stage == 1] == [(last, last)]
    first = schedule_moments("zero-bubble", 2, 4, 1, 0, 4, "grads")
    assert not any(x.pending for x in first)
    assert any(x.embedding_backward and x.accumulated == 1 for x in first)
    assert not any(
        x.pending for r in (0, 1) for x in schedule_moments("1f1b", 2, 4, 1, r, 4, "grads")
    )
    # ZeRO-0/1 read none of it: their moments are the ones they always had
    off = schedule_moments("zero-bubble", 2, 4, 1, 1, 4)
    assert not any(x.accumulated or x.pending or x.reduce_stage >= 0 for x in off)
    assert fsdp_state(Layout(dp=2, zero=1, pp=2)) == "off"
    assert fsdp_state(Layout(dp=2, zero=3, pp=2, pp_schedule="zero-bubble")) == "grads"
    assert fsdp_state(Layout(dp=2, zero=3, pp=2)) == "grads_and_units"


def test_last_rank_loss_backward_holds_fp32_and_bf16_gradients():
    """The dry-run's peak of the issue's layout, term by term (llama-1024-L4 dp2 z3 pp2
    zero-bubble bf16, last rank, 1089.0 MiB measured): the sharded states, every unit
    gathered in bf16, I3's loss backward with the fp32 gradients (W0's, folded at I2) and W1's
    bf16 ones of all the rank's parameters, the stored micro-batches and the loss
    temporaries. The old plan counted the fp32 ones only (-9.5%)."""
    mem = pipeline_rank_memory(_plan(3), 1)
    assert mem.moment == "loss backward on the last stage"
    n = mem.detail["params.count"]  # 2 blocks + final norm + head
    assert n == 2 * (LLAMA.param_counts().attention + LLAMA.param_counts().mlp + 2 * 1024) + (
        1024 + 32000 * 1024
    )
    sharded = 4 * n / 2 + 8 * n / 2  # fp32 parameters and AdamW states over 2 shards
    assert mem.params - mem.detail["params.in_flight"] == pytest.approx(4 * n / 2)
    assert mem.detail["params.in_flight"] == pytest.approx(2 * n)  # every unit gathered
    unsharded = (4 + 2) * n
    total = mem.total - mem.buffer_terms["runtime_context"]
    rest = total - sharded - 2 * n - unsharded
    # what is left: the stored micro-batches, the loss backward's two fp32 (tokens x V)
    # buffers, the boundary tensors and RoPE tables
    assert mem.buffer_terms["loss_backward_temp"] == pytest.approx(2 * 4 * 512 * 32000)
    assert rest == pytest.approx(
        mem.activations + mem.buffer_terms["loss_backward_temp"] + 5 * MiB, abs=0.1 * MiB
    )
    assert total / MiB == pytest.approx(1089.0, rel=0.01)


def test_first_rank_peaks_at_the_embedding_reduce_scatter():
    """llama-1024-L4 dp2 z2 pp2 zero-bubble bf16, first rank (760.1 MiB measured, 5.3%
    under with sharded gradients at the end of backward): REDUCE_GRAD's first reduce-scatter,
    the embedding's, copies its fp32 gradients into a reduce-scatter input beside the output
    shard, while every other unit is still gathered and every fp32 gradient unsharded."""
    mem = pipeline_rank_memory(_plan(2), 0)
    assert mem.moment == "a pipeline stage's gradient reduce-scatter (REDUCE_GRAD)"
    n = mem.detail["params.count"]
    emb = LLAMA.param_counts().embedding
    expected = (4 + 8) * n / 2 + 2 * (n - emb) + 4 * n + 4 * emb * 1.5
    expected += mem.buffer_terms["rope_tables"] + mem.buffer_terms["pp_p2p"]
    total = mem.total - mem.buffer_terms["runtime_context"]
    assert total == pytest.approx(expected, rel=1e-9)
    assert total / MiB == pytest.approx(760.1, rel=0.01)


@pytest.mark.parametrize(("zero", "schedule", "v"), [(2, "zero-bubble", 2), (3, "1f1b", 1)])
def test_a_search_reuses_a_ranks_fsdp_walk_with_the_same_answer(zero, schedule, v):
    """`pipeline_fsdp.fsdp_walk` keeps an FsdpRank's per-moment terms across the plans of one
    search (one `ModelTerms`): the plans below, planned in that order with shared terms, give
    the same worst rank, to the float, as each planned alone; the walks are kept by
    micro-batches per step (a micro-batch size changes the activations, not the walk)."""
    from scaletrain.planner.memory.rank import worst_rank
    from scaletrain.planner.memory.rank_terms import ModelTerms

    terms = ModelTerms(LLAMA)
    for micro_batch, global_batch in [(2, 16), (1, 16), (2, 32), (1, 8), (2, 16)]:
        plan = dataclasses.replace(
            _plan(zero, schedule, v), micro_batch=micro_batch, global_batch=global_batch
        )
        shared, shared_params = worst_rank(plan, terms=terms)
        alone, alone_params = worst_rank(plan, terms=ModelTerms(LLAMA))
        assert shared == alone and shared_params == alone_params
    ranks = [fr for fr in terms.fsdp.values() if fr is not None]
    assert ranks and all(fr.walks for fr in ranks)
    # global batch 16 at micro-batch 2 and 32 at 2 (or 16 at 1) walk 4 and 8 micro-batches
    assert any(len(fr.walks) > 1 for fr in ranks)
