"""estimate(): FLOPs conventions, bubble ratios, every preset runs, throughput sanity, cost
napkin math (seed 004's 7B carbon example), JSON schema, and the no-torch import rule.

Not used as test vectors (docs/DESIGN.md §5): seed 004's GPT-2 throughput/cost examples that exceed
the hardware's peak FLOP/s.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from scaletrain.config import MODEL_PRESETS, Layout, ModelConfig, hardware_preset, resolve_model
from scaletrain.planner import (
    CommInputs,
    PlanInput,
    Site,
    bubble_fraction,
    comm_volumes,
    estimate,
    flops_per_token,
    napkin_cost,
    training_cost,
)

H100 = hardware_preset("h100-sxm")


@pytest.mark.parametrize(
    "h,L,V,s", [(768, 12, 50257, 1024), (4096, 32, 32000, 4096), (12288, 96, 50257, 2048)]
)
def test_flops_match_narayanan(h, L, V, s):
    m = ModelConfig(vocab_size=V, dim=h, num_layers=L, num_heads=h // 64, max_seq_len=s, bias=False)
    per_seq = 72 * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert flops_per_token(m, s, causal=False) * s == pytest.approx(per_seq)
    # full recompute: hardware FLOPs 96 instead of 72 for the blocks (the head is not redone)
    full = flops_per_token(m, s, causal=False, recompute="full")
    assert full * s == pytest.approx(per_seq + 24 * s * L * h**2 * (1 + s / (6 * h)))
    assert flops_per_token(m, s) < flops_per_token(m, s, causal=False)
    assert flops_per_token(m, s, recompute="selective") > flops_per_token(m, s)


def test_flops_6n_rule():
    m = resolve_model("llama2-7b")
    fpt = flops_per_token(m, 4096)
    assert fpt / (6 * m.num_params()) == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize(
    "schedule,p,m,v,expected",
    [
        ("gpipe", 4, 8, 1, 3 / 8),
        ("1f1b", 4, 8, 1, 3 / 8),
        ("interleaved", 4, 8, 2, 3 / 16),
        ("zero-bubble", 4, 8, 1, 3 / 24),
        ("1f1b", 1, 8, 1, 0.0),
    ],
)
def test_bubble_fraction(schedule, p, m, v, expected):
    # the package's one bubble formula (pipeline.py); zero-bubble = ZB-H1, torch's order
    assert bubble_fraction(schedule, p, m, v) == pytest.approx(expected)


def test_estimate_charges_the_zero_bubble_the_trainer_runs():
    model = resolve_model("llama2-7b")
    layout = Layout(dp=2, pp=4, pp_schedule="zero-bubble")
    plan = _plan(model, 8, layout, gb=2 * 8)  # m = 8 micro-batches
    est = estimate(plan)
    assert est.time.bubble_s == pytest.approx(3 / 24 * est.time.compute_s)
    ideal = estimate(plan, zero_bubble="h2")  # the idealised ZB-H2, an option only
    assert ideal.time.bubble_s == 0 and ideal.time.step_s < est.time.step_s


def _plan(model, gpus, layout, *, seq=2048, mb=1, gb=None, hw=H100, **kw):
    gb = gb or layout.dp * mb * max(1, layout.pp) * 2
    return PlanInput(
        model=model,
        hardware=hw,
        num_gpus=gpus,
        layout=layout,
        seq_len=seq,
        global_batch=gb,
        micro_batch=mb,
        **kw,
    )


LAYOUTS = [
    Layout(),
    Layout(dp=8, zero=3),
    Layout(dp=2, zero=1, tp=2, sp=True, pp=2),
    Layout(dp=2, tp=2, pp=2, pp_schedule="interleaved", pp_virtual=2, zero=2),
    Layout(dp=4, cp=2, zero=3),
    Layout(dp=2, pp=4, pp_schedule="zero-bubble"),
]


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_every_preset_runs(name):
    model = resolve_model(name)
    seq = min(model.max_seq_len, 2048)
    for layout in LAYOUTS:
        if layout.pp * layout.pp_virtual > model.num_layers:
            continue
        for ac in ("none", "full"):
            est = estimate(_plan(model, layout.world_size, layout, seq=seq, ac=ac))
            assert 0 < est.mfu <= 1 and est.tokens_per_s > 0
            assert est.memory.total > 0 and est.time.step_s >= est.time.compute_s
    moe = resolve_model("mixtral-8x7b")
    est = estimate(_plan(moe, 8, Layout(dp=8, zero=3, ep=8), seq=4096))
    assert "ep_all_to_all" in est.time.comm_terms and est.mfu <= 1


def test_mfu_bounded_and_dp_scaling():
    model = resolve_model("llama2-7b")
    # cheap communication: a network as fast as NVLink everywhere
    fast = dataclasses.replace(H100, inter_node_bw=H100.intra_node_bw)
    one = estimate(_plan(model, 8, Layout(dp=8, zero=3), mb=2, seq=4096, gb=128, hw=fast))
    four = estimate(_plan(model, 32, Layout(dp=32, zero=3), mb=2, seq=4096, gb=512, hw=fast))
    assert 0 < one.mfu <= 1 and 0 < four.mfu <= 1
    assert four.tokens_per_s / one.tokens_per_s == pytest.approx(4, rel=0.1)
    # the same job on the real (slower) inter-node network cannot be faster
    slow = estimate(_plan(model, 32, Layout(dp=32, zero=3), mb=2, seq=4096, gb=512))
    assert slow.tokens_per_s <= four.tokens_per_s


def test_comm_families_and_tiers():
    model = resolve_model("llama2-7b")
    kw = dict(
        hardware=H100,
        stage_params=1e9,
        layers=20,
        moe_layers=0,
        tokens=4096.0,
        hidden=5120,
        kv_dim=5120,
        experts_per_token=2,
        micro_batches=4,
    )
    ddp = comm_volumes(CommInputs(layout=Layout(dp=8), **kw))
    assert ddp["dp_allreduce"] == pytest.approx(2 * 7 / 8 * 4e9)
    z3 = comm_volumes(CommInputs(layout=Layout(dp=8, zero=3), **kw))
    assert z3["fsdp_all_gather"] == pytest.approx(2 * 4 * 7 / 8 * 2e9)
    # cp ranks replicate the parameters: their gradients are all-reduced even at dp = 1
    three_d = comm_volumes(CommInputs(layout=Layout(tp=2, sp=True, pp=2, cp=2), **kw))
    assert set(three_d) == {"tp", "pp_p2p", "cp_ring", "dp_allreduce"}
    act = 2 * 4096.0 * 5120  # bf16 activations of one micro-batch (tokens already per cp rank)
    # pp = 2: the first stage sends only activations, the last only gradients: m messages each
    assert three_d["pp_p2p"] == pytest.approx(4 * act / 2)  # SP: the message is 1/tp of it
    # ring attention: cp-1 K/V sends forward, cp-1 backward, the dK/dV accumulators a full turn
    kv = 2 * 2 * 4096.0 * 5120 / 2
    assert three_d["cp_ring"] == pytest.approx((3 * 2 - 2) * 20 * 4 * kv)
    # tp: 4 all-reduces per block plus the vocab-parallel embedding and the head, per micro-batch
    assert three_d["tp"] == pytest.approx((4 * 20 + 2) * 4 * 2 * (1 / 2) * act)
    # ZeRO-1 as the trainer runs it: DDP's all-reduce, then the fp32 partitions broadcast
    z1 = comm_volumes(CommInputs(layout=Layout(dp=8, zero=1), **kw))
    assert z1 == pytest.approx({"dp_allreduce": 2 * 7 / 8 * 4e9, "zero_all_gather": 7 / 8 * 4e9})
    # ZeRO-2 (FSDP2 without resharding after forward): one gather and one reduce-scatter per
    # micro-batch; HSDP reduces the shard across replicas after every micro-batch
    z2 = comm_volumes(CommInputs(layout=Layout(dp=8, zero=2), **kw))
    assert z2["zero_all_gather"] == pytest.approx(4 * 7 / 8 * 2e9)
    hsdp = comm_volumes(CommInputs(layout=Layout(dp=8, dp_replicate=2, zero=3), **kw))
    assert hsdp["hsdp_allreduce"] == pytest.approx(4 * 2 * (1 / 2) * 4e9 / 4)
    # inside a pipeline, torch's stages reduce (and ZeRO-2 gathers) once per step; ZeRO-3
    # re-gathers after every forward: m + 1 gathers (counted: benchmarks/comm_volume.py)
    pz2 = comm_volumes(CommInputs(layout=Layout(dp=8, pp=2, zero=2), **kw))
    assert pz2["zero_all_gather"] == pytest.approx(7 / 8 * 2e9)
    assert pz2["zero_reduce_scatter"] == pytest.approx(7 / 8 * 4e9)
    pz3 = comm_volumes(CommInputs(layout=Layout(dp=8, dp_replicate=2, pp=2, zero=3), **kw))
    assert pz3["fsdp_all_gather"] == pytest.approx((4 + 1) * 3 / 4 * 2e9)
    assert pz3["fsdp_reduce_scatter"] == pytest.approx(3 / 4 * 4e9)
    assert pz3["hsdp_allreduce"] == pytest.approx(2 * (1 / 2) * 4e9 / 4)
    # EP = dp: every rank owns distinct experts, their gradients are never all-reduced
    ep = comm_volumes(
        CommInputs(layout=Layout(dp=8, ep=8), **{**kw, "moe_layers": 20}, expert_params=6e8)
    )
    assert ep["dp_allreduce"] == pytest.approx(2 * 7 / 8 * 4 * (1e9 - 6e8))
    # tp across nodes (tp=16 > 8 GPUs per node) is slower than inside one
    intra = estimate(_plan(model, 8, Layout(tp=8, sp=True)))
    two_nodes = estimate(
        _plan(model, 16, Layout(tp=16, sp=False), hw=dataclasses.replace(H100, gpus_per_node=8))
    )
    # tp=16 spans two nodes: each all-reduce's ring leaves a node through its 8 NICs
    # (comm.py multi-rail rings: 8 x 50 GB/s < NVLink's 450 GB/s)
    assert two_nodes.time.comm_terms["tp"] > intra.time.comm_terms["tp"]


def test_training_cost_seed004_carbon():
    # 7B x 1T tokens ~ 4.2e22 FLOPs at 156 TFLOP/s sustained on 1024 A100s (400 W) plus 128
    # hosts x 200 W: ~73 h, 31,784.2 kWh, 0.43 kg/kWh.
    site = Site(power_w=400, host_power_w=200, num_hosts=128)
    c = napkin_cost(4.2e22, 1024, 156e12, site=site)
    assert c.seconds / 86400 == pytest.approx(3.04, abs=0.005)
    assert c.kwh == pytest.approx(31784.2, abs=0.5)
    assert c.kg_co2 / 1000 == pytest.approx(13.67, abs=0.01)
    est = estimate(_plan(resolve_model("gpt2-124m"), 8, Layout(dp=8), seq=1024, mb=8))
    tc = training_cost(est, 1e9)
    assert tc.seconds == pytest.approx(1e9 / est.tokens_per_s)
    assert tc.gpu_hours == pytest.approx(8 * tc.seconds / 3600)
    assert tc.kwh == pytest.approx(8 * 700 * tc.seconds / 3600 * 1.2 / 1000)


def test_json_schema():
    est = estimate(_plan(resolve_model("gpt2-124m"), 2, Layout(dp=2), seq=1024))
    j = est.to_json()
    assert set(j) == {"plan", "memory", "time", "flops_per_token", "tokens_per_s", "mfu"}
    assert set(j["memory"]) == {
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
        "host",
        "host_capacity",
    }
    assert set(j["time"]) == {"step_s", "compute_s", "comm_exposed_s", "bubble_s"}
    assert any("convention" in n for n in est.notes)


def test_cpu_has_no_runtime_context():
    est = estimate(
        _plan(
            resolve_model("tiny"),
            1,
            Layout(),
            seq=128,
            mb=4,
            hw=hardware_preset("cpu"),
            precision="fp32",
        )
    )
    assert est.memory.buffer_terms["runtime_context"] == 0 and est.memory.fits


def test_planner_import_does_not_import_torch():
    code = (
        "import sys, scaletrain.planner as p; "
        "assert 'torch' not in sys.modules, 'planner imported torch'; print(p.estimate)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_fp8_runs_only_the_converted_matmuls_at_the_fp8_rate():
    """precision/fp8.py converts the block linears and experts; SDPA and the head stay bf16.
    So fp8's matmuls beat bf16 by less than the hardware's fp8/bf16 ratio (H100: 2x, scaled by
    the efficiencies), and by less the larger the attention core's share (longer sequences).
    The casts (time/fp8_casts.py, memory bound) are taken off first: they are pinned apart
    (tests/planner/test_fp8_casts.py)."""
    from scaletrain.planner.time.fp8_casts import fp8_cast_s, fp8_weight_cast_s

    model = resolve_model("llama3-8b")

    def compute(precision, seq):
        plan = PlanInput(
            model=model,
            hardware=H100,
            num_gpus=8,
            layout=Layout(dp=8, zero=3),
            seq_len=seq,
            global_batch=64,
            micro_batch=1,
            precision=precision,
        )
        e = estimate(plan)
        m = plan.grad_accum
        casts = m * (
            seq * model.num_layers * fp8_cast_s(plan, None)
            + fp8_weight_cast_s(plan, None, layers=model.num_layers)
        )
        assert (casts > 0) == (precision == "fp8")
        return e.time.compute_s - casts, e.notes

    ratios = []
    for seq in (1024, 16384):
        bf16, fp8 = compute("bf16", seq)[0], compute("fp8", seq)[0]
        all_fp8 = bf16 * (H100.flops("bf16") / H100.flops("fp8"))  # every matmul in fp8 ...
        eff = [
            float(n.split("efficiency=")[1].split()[0])
            for p in ("bf16", "fp8")
            for n in compute(p, seq)[1]
            if "efficiency=" in n
        ]
        all_fp8 *= eff[0] / eff[1]  # ... at fp8's efficiency
        assert all_fp8 < fp8 < bf16, (seq, all_fp8, fp8, bf16)
        ratios.append(bf16 / fp8)
    assert ratios[0] > ratios[1] > 1.0


def test_fp8_all_gather_moves_the_fp8_linears_in_one_byte():
    """precision.fp8_all_gather: ZeRO-3's all-gather carries the q/k/v/o and MLP weights as
    E4M3 (1 byte) and the rest (embedding, head, norms) in bf16; measured on 2 gloo ranks
    (tiny-llama dp2 z3): bytes ratio with/without 0.6321, the planner's 0.6321."""
    from scaletrain.planner.time.comm import comm_volumes
    from scaletrain.planner.time.step_time import comm_arguments

    model = resolve_model("tiny-llama")
    pc = model.param_counts()
    base = PlanInput(
        model=model,
        hardware=hardware_preset("h100-sxm"),
        num_gpus=2,
        layout=Layout(dp=2, zero=3),
        seq_len=32,
        global_batch=8,
        micro_batch=2,
        precision="fp8",
    )
    vol = {
        flag: comm_volumes(
            comm_arguments(dataclasses.replace(base, fp8_all_gather=flag), model.num_params())
        )["fsdp_all_gather"]
        for flag in (False, True)
    }
    fp8 = model.num_layers * (pc.attention + pc.mlp)
    assert vol[True] / vol[False] == pytest.approx(
        (model.num_params() - fp8 / 2) / model.num_params()
    )
    assert vol[True] / vol[False] == pytest.approx(0.6321, abs=1e-4)
