"""Dry-run (fake tensors + fake process group): exact state sizes, FLOPs, CLI JSON."""

from __future__ import annotations

import json
import math

import pytest
import torch.distributed as dist

from scaletrain.config import load_config
from scaletrain.dryrun import dryrun
from scaletrain.models import build_model
from scaletrain.planner.time.flops import attention_core_flops_per_token, flops_per_token

SEQ = 128


def _job(**parallel):
    world = parallel.pop("world")
    dp = world // (parallel.get("tp", 1) * parallel.get("cp", 1))
    return load_config(
        None,
        {
            "model": {"name": "gpt-mini"},
            "batch": {"seq_len": SEQ, "micro_batch": 1, "global_batch": dp},
            "parallel": parallel,
        },
    ), world


@pytest.fixture(scope="module")
def zero3_w8():
    job, world = _job(world=8, zero=3)
    return job, dryrun(job, world_size=world)


def _padded_shard_bytes(job, shards: int) -> int:
    """FSDP2 shards dim 0 of every parameter, padded to a multiple of the shard count."""
    model = build_model(job.model, device="meta")
    total = 0
    for p in model.parameters():
        rest = p.numel() // p.shape[0]
        total += math.ceil(p.shape[0] / shards) * rest * p.element_size()
    return total


@pytest.mark.slow
def test_zero3_states_are_exactly_sharded(zero3_w8):
    job, m = zero3_w8
    full = job.model.num_params() * 4
    params = m.memory.detail["state.params"]
    assert params == _padded_shard_bytes(job, 8)
    assert abs(params - full / 8) / (full / 8) < 0.01
    assert m.memory.detail["state.grads"] == params
    assert m.memory.detail["state.optimizer"] == 2 * params  # AdamW m and v, fp32
    assert m.memory.optimizer >= m.memory.detail["state.optimizer"]


@pytest.mark.slow
def test_peak_breakdown_adds_up_and_timeline_follows_blocks(zero3_w8):
    _, m = zero3_w8
    mem = m.memory
    parts = mem.params + mem.grads + mem.optimizer + mem.activations + mem.buffers
    assert parts == pytest.approx(mem.total)
    assert mem.activations > 0
    assert max(b for _, b in m.timeline) <= mem.total
    events = [e for e, _ in m.timeline]
    assert "fw_pre:layers.0" in events and "bw_pre:layers.0" in events
    assert events.index("fw_pre:layers.0") < events.index("bw_pre:layers.0")
    assert not dist.is_initialized()  # the fake process group was torn down


@pytest.mark.slow
def test_flops_match_the_planner_formula(zero3_w8):
    """FlopCounterMode counts matmuls only, attention over the full T x T matrix, and torch's
    flash-attention backward formula recomputes QK^T (5 bmm against the planner's 4): so
    measured = planner(causal=False) + L x (attention core forward / 2) per token, plus the
    fused head + loss's recomputed logits in backward (one more 2*V*h per token)."""
    job, m = zero3_w8
    cfg, tokens = job.model, SEQ  # one micro-batch of one sequence on this rank
    expected = tokens * (
        flops_per_token(cfg, SEQ, causal=False)
        + cfg.num_layers * attention_core_flops_per_token(cfg, SEQ, causal=False) / 2
        + 2.0 * cfg.vocab_size * cfg.dim
    )
    assert m.flops == pytest.approx(expected, rel=1e-3)


@pytest.mark.slow
def test_tp2_quarters_states_at_world_4():
    job, world = _job(world=4, zero=3, tp=2)
    m = dryrun(job, world_size=world)
    full = job.model.num_params() * 4
    # tp 2 splits the matrices, FSDP over dp 2 splits everything: 1/4 of the model, up to the
    # norm weights and row-parallel biases tp keeps replicated (< 1% of gpt-mini)
    assert abs(m.memory.detail["state.params"] - full / 4) / (full / 4) < 0.01
    assert m.memory.detail["state.optimizer"] == 2 * m.memory.detail["state.params"]


@pytest.mark.slow
def test_ddp_is_measured_with_its_buckets():
    job, world = _job(world=4, zero=0)
    m = dryrun(job, world_size=world)
    full = job.model.num_params() * 4
    assert m.memory.detail["state.params"] == full
    assert m.memory.buffer_terms["ddp_buckets"] == full
    assert m.memory.detail["state.optimizer"] == 2 * full


def test_pipeline_with_context_parallelism_holds_half_the_sequence():
    """pp2 x cp2: each stage runs its cp rank's half of the sequence: the per-token
    activations of the last pipeline rank halve, while ring attention keeps the K/V blocks it
    received for its backward (measured: 0.76 of pp2 alone at seq 128, dim 128)."""

    def job(**parallel):
        return load_config(
            None,
            {
                "model": {"name": "gpt-mini", "tie_embeddings": False},
                "batch": {"seq_len": SEQ, "micro_batch": 1, "global_batch": 4},
                "parallel": parallel,
            },
        )

    pp_cp = dryrun(job(pp=2, cp=2), world_size=4, rank=2, count_flops=False)
    pp = dryrun(job(pp=2), world_size=2, rank=1, count_flops=False)
    assert not dist.is_initialized()
    ratio = pp_cp.memory.activations / pp.memory.activations
    assert 0.5 < ratio < 0.85, ratio


@pytest.mark.slow
def test_cli_json_keys(capsys):
    from scaletrain.cli import main

    rc = main(
        ["dryrun", "--model", "gpt-mini", "--gpus", "2", "--zero", "3", "--seq-len", "64", "--json"]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert {"plan", "memory", "flops_per_step", "predicted"} <= set(out)
    assert {
        "params",
        "grads",
        "optimizer",
        "activations",
        "buffers",
        "total",
        "reserved",
        "capacity",
        "fits",
        "rank",
    } <= set(out["memory"])
    assert out["plan"]["dp"] == 2 and out["plan"]["zero"] == 3 and out["plan"]["seq_len"] == 64


@pytest.mark.slow
def test_zero1_with_accumulation_shards_only_the_optimizer():
    job = load_config(
        None,
        {
            "model": {"name": "gpt-mini"},
            "batch": {"seq_len": SEQ, "micro_batch": 1, "global_batch": 8},
            "parallel": {"zero": 1},
        },
    )
    m = dryrun(job, world_size=4)
    full = job.model.num_params() * 4
    assert m.plan["grad_accum"] == 2 and "2 of 2" in m.notes[0]
    assert m.memory.detail["state.params"] == full
    assert m.memory.detail["state.grads"] == full
    # ZeroRedundancyOptimizer partitions whole parameters: rank 0's share is ~1/4, not exact
    assert 0.5 * full / 4 < m.memory.detail["state.optimizer"] < 2 * 2 * full / 4


# ---- pipeline parallelism ---------------------------------------------------------------------


def _pp_job(schedule: str, pp: int, virtual: int = 1, accum: int = 4, dp: int = 1, **parallel):
    return load_config(
        None,
        {
            "model": {"name": "gpt-mini", "tie_embeddings": False},
            "batch": {"seq_len": SEQ, "micro_batch": 1, "global_batch": accum * dp},
            "parallel": {"pp": pp, "pp_schedule": schedule, "pp_virtual": virtual, **parallel},
        },
    )


def _stage_param_bytes(job, stage_ids: list[int], num_stages: int) -> int:
    """fp32 bytes of the parameters of the given stages, from the trainer's own split."""
    from scaletrain.parallel.pipeline import split_stage

    model = build_model(job.model, device="meta")
    return sum(
        p.numel() * 4 for sid in stage_ids for p in split_stage(model, sid, num_stages).parameters()
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("schedule", "pp", "virtual", "rank"),
    [
        ("gpipe", 2, 1, 1),
        ("gpipe", 4, 1, 3),
        ("1f1b", 4, 1, 2),
        ("zero-bubble", 2, 1, 0),
        ("interleaved", 2, 2, 0),
        ("zero-bubble", 2, 2, 1),
    ],
)
def test_pipeline_stage_holds_only_its_layers(schedule, pp, virtual, rank):
    from scaletrain.config import stage_ids

    job = _pp_job(schedule, pp, virtual)
    m = dryrun(job, world_size=pp, rank=rank, count_flops=False)
    ids = stage_ids(rank, pp, virtual)
    expected = _stage_param_bytes(job, ids, pp * virtual)
    assert m.memory.detail["state.params"] == expected
    assert m.memory.detail["state.grads"] == expected
    assert m.memory.detail["state.optimizer"] == 2 * expected
    assert expected < job.model.num_params() * 4  # a strict part of the model
    assert any(e.startswith("backward_done:") for e, _ in m.timeline)
    assert f"stages {ids}" in m.notes[-1]
    assert not dist.is_initialized()


@pytest.mark.slow
def test_1f1b_holds_fewer_activations_than_gpipe():
    """m = 8 micro-batches over p = 2 stages: GPipe keeps all 8 forwards' activations before
    the first backward, 1F1B at most p - rank = 2 on rank 0."""
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        m = dryrun(_pp_job(schedule, 2, accum=8), world_size=2, rank=0, count_flops=False)
        peaks[schedule] = m.memory
    assert peaks["1f1b"].activations < 0.5 * peaks["gpipe"].activations
    assert peaks["1f1b"].total < peaks["gpipe"].total
    # the states at rest are the same for both schedules
    assert peaks["1f1b"].detail["state.params"] == peaks["gpipe"].detail["state.params"]


@pytest.mark.slow
def test_pipeline_with_fsdp_and_tp_on_the_stage():
    job = _pp_job("1f1b", 2, accum=2, dp=2, tp=2, zero=3)
    m = dryrun(job, world_size=8, rank=7)  # pp rank 1 (the last stage), dp 2, tp 2
    stage = _stage_param_bytes(job, [1], 2)
    # FSDP over dp 2 and tp 2 quarter the stage (up to replicated norms and biases)
    assert abs(m.memory.detail["state.params"] - stage / 4) / (stage / 4) < 0.02
    assert m.flops > 0


# ---- mixture of experts -----------------------------------------------------------------------


def _moe_job(**parallel):
    world = parallel.pop("world")
    return load_config(
        None,
        {
            "model": {"name": "tiny-moe"},
            "batch": {"seq_len": 64, "micro_batch": 2, "global_batch": 2 * world},
            "parallel": parallel,
        },
    ), world


def _expert_bytes(job) -> int:
    model = build_model(job.model, device="meta")
    return sum(p.numel() * 4 for n, p in model.named_parameters() if ".experts." in n)


@pytest.mark.slow
def test_moe_runs_under_fake_tensors_with_balanced_dispatch():
    job, world = _moe_job(world=1, zero=0)
    m = dryrun(job, world_size=world)
    full = job.model.num_params() * 4
    assert m.memory.detail["state.params"] == full
    assert m.memory.activations > 0
    # every token goes through k experts whatever the (balanced) split, so the counted FLOPs
    # are the planner's (same convention as test_flops_match_the_planner_formula)
    cfg, t = job.model, 64
    # (+ the fused loss's recomputed logits, 2*V*h per token)
    expected = (
        2
        * t
        * (
            flops_per_token(cfg, t, causal=False)
            + cfg.num_layers * attention_core_flops_per_token(cfg, t, causal=False) / 2
            + 2.0 * cfg.vocab_size * cfg.dim
        )
    )
    assert m.flops == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow
def test_expert_parallel_splits_the_experts():
    job, world = _moe_job(world=2, ep=2, zero=0)
    m = dryrun(job, world_size=world, rank=1)
    full = job.model.num_params() * 4
    experts = _expert_bytes(job)
    assert m.memory.detail["state.params"] == full - experts // 2
    dense, _ = _moe_job(world=1, zero=0)
    # the same tokens per rank, so the same FLOPs as one rank holding every expert
    assert m.flops == pytest.approx(dryrun(dense, world_size=1).flops, rel=1e-6)


@pytest.mark.slow
def test_expert_parallel_over_part_of_the_data_parallel_ranks():
    """ep2 of dp4 with ZeRO-1: each rank holds half the experts (replicated on 2 ranks), their
    Adam states split again over those 2 replicas."""
    job, world = _moe_job(world=4, ep=2, zero=1)
    full, experts = job.model.num_params() * 4, _expert_bytes(job)
    ms = [dryrun(job, world_size=world, rank=r) for r in range(world)]
    for m in ms:
        assert m.memory.detail["state.params"] == full - experts // 2
    states = [m.memory.detail["state.optimizer"] for m in ms]
    # AdamW's m and v (fp32, 2 x the parameters): dense states partitioned over the 4 ranks,
    # each expert shard's over its 2 replicas (ranks e and e + 2): all 4 together hold exactly
    # one copy of everything, and no rank all of its own
    assert sum(states) == 2 * full
    assert max(states) < 2 * (full - experts // 2)


@pytest.mark.slow
def test_moe_under_tensor_parallelism_splits_the_experts(capsys):
    """MoE x TP at a fake world size, through the CLI: experts split over tp (ep = 1) or whole
    per tp rank under ep2; either way this rank holds half of them."""
    from scaletrain.cli import main

    held = {}
    for name, flags in (
        ("tp2", ["--gpus", "2", "--tp", "2"]),
        (
            "tp2+sp x dp4 ep2 zero1",
            ["--gpus", "8", "--tp", "2", "--sp", "--dp", "4", "--ep", "2", "--zero", "1"],
        ),
    ):
        rc = main(
            [
                "dryrun",
                "--model",
                "tiny-moe",
                "--seq-len",
                "64",
                "--micro-batch",
                "2",
                "--rank",
                "1",
                "--json",
                *flags,
            ]
        )
        assert rc == 0, name
        out = json.loads(capsys.readouterr().out)
        assert out["plan"]["tp"] == 2 and out["flops_per_step"] > 0
        held[name] = out["memory"]["detail"]["state.params"]
        assert out["predicted"]["memory"]["params"] > 0  # the planner priced the layout
    job, _ = _moe_job(world=1, zero=0)
    full, experts = job.model.num_params() * 4, _expert_bytes(job)
    model = build_model(job.model, device="meta")
    # tp splits attention, embedding and head too; norms and the router stay whole
    whole = sum(p.numel() * 4 for n, p in model.named_parameters() if "norm" in n or "router" in n)
    expected = whole + (full - whole) // 2
    assert held == {"tp2": expected, "tp2+sp x dp4 ep2 zero1": expected}, (held, experts)


def test_fsdp_tp_grad_norm_is_one_reduction_without_dtensor_warning():
    """ZeRO-3 x TP gradients are 2-D DTensors on (dp_shard_cp, tp); their norm used to be
    reduced by two all-reduces in a row, which DTensor warns about once per process
    ("While redistributing from (_NormPartial(2.0), _NormPartial(2.0)) to (Replicate(),
    Replicate()) ..."; it cut the llama3-70b tp8 row of benchmarks/memory_recipe.py). The
    flattened dp_shard_cp_tp mesh (parallel/dims.py) makes it one, and the warning goes."""
    import logging

    seen: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    log = logging.getLogger("torch.distributed.tensor._redistribute")
    grab = Grab(level=logging.WARNING)
    log.addHandler(grab)
    try:
        job, world = _job(world=4, zero=3, tp=2, sp=True)
        dryrun(job, world_size=world, count_flops=False)
    finally:
        log.removeHandler(grab)
    assert not [m for m in seen if "sequential all_reduce" in m], seen
