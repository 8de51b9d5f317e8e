"""The planner's fine-tuning levers (issue #36): LoRA's adapter-only states, a quantized base's
bytes per value against the tensors the trainer stores, activation offload's host bytes, and
the host RAM check in plan / search / explain. (Planner against the dry-run:
benchmarks/planner_accuracy.py FINETUNE_CASES, tests/planner/test_accuracy.py.)"""

from __future__ import annotations

import pytest

from scaletrain.cli import main
from scaletrain.config import Layout, hardware_preset, model_preset
from scaletrain.config.lora import ROW_PARALLEL, projection_shapes
from scaletrain.planner import estimate
from scaletrain.planner.memory.lora import lora_terms, stored_bytes_per_value
from scaletrain.planner.memory.rank_terms import ModelTerms
from scaletrain.planner.memory.states import OPTIMIZER_BYTES
from scaletrain.planner.time.flops import lora_flops
from scaletrain.planner.time.step_time import model_flops
from scaletrain.planner.types import PlanInput

LLAMA3 = model_preset("llama3-8b")
ATTN = ("wq", "wk", "wv", "wo")


def _plan(**kw) -> PlanInput:
    base = {
        "model": LLAMA3,
        "hardware": hardware_preset("h100-sxm"),
        "num_gpus": 1,
        "layout": Layout(),
        "seq_len": 2048,
        "global_batch": 4,
        "micro_batch": 1,
        "precision": "bf16",
    }
    return PlanInput(**{**base, **kw})


@pytest.mark.parametrize("base_dtype", ["bf16", "int8", "nf4"])
def test_stored_bytes_per_value_are_the_trainers_tensors(base_dtype):
    """The planner's bytes per value of every Llama-3-8B projection equal the bytes of the
    tensors `models.quantized` stores for it (built on meta: shapes and dtypes only)."""
    torch = pytest.importorskip("torch")
    from scaletrain.dtensor import local_bytes
    from scaletrain.models.quantized import quantize_weight

    for rows, cols in projection_shapes(LLAMA3).values():
        stored = quantize_weight(torch.empty(rows, cols, device="meta"), base_dtype)
        real = sum(local_bytes(t) for t in stored.values())
        assert real == pytest.approx(rows * cols * stored_bytes_per_value(base_dtype, rows, cols))


def test_nf4_is_qloras_4_127_bits_per_value():
    """QLoRA (Dettmers et al. 2023, sec. 3): 4-bit codes + 8/64 + 32/(64 x 256) bits of
    double-quantized constants = 4.127 bits per value."""
    bits = 8 * stored_bytes_per_value("nf4", 4096, 4096)
    assert bits == pytest.approx(4 + 8 / 64 + 32 / (64 * 256), abs=1e-3)


def test_lora_grads_and_optimizer_states_are_the_adapters_only():
    terms = lora_terms(LLAMA3, 16, ATTN, "nf4", "bf16")
    assert terms.adapters == sum(
        16 * (r + c) for n, (r, c) in projection_shapes(LLAMA3).items() if n in ATTN
    )
    est = estimate(_plan(lora_rank=16, lora_targets=ATTN, lora_base="nf4"))
    adapters = LLAMA3.num_layers * terms.adapters
    mem = est.memory
    assert mem.grads - mem.detail["grads.in_flight"] == pytest.approx(4 * adapters)
    assert mem.optimizer == pytest.approx(OPTIMIZER_BYTES["adamw"] * adapters)
    full = estimate(_plan()).memory
    # the frozen base: 7.0e9 projection values at 0.516 B instead of the fp32 master's 4 B
    assert full.params - mem.params > 3 * LLAMA3.num_layers * terms.frozen


ALL = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_lora_terms_are_per_tp_rank_as_the_trainer_splits_them(tp):
    """Under tp each adapter is split with its base (parallel/tensor_parallel_lora.py): B with
    a column-parallel W's rows, A with a row-parallel W's (wo, w2) columns, the other half
    whole; the frozen projections are W's shards."""
    t = lora_terms(LLAMA3, 16, ALL, "auto", "bf16", tp=tp)
    shapes = projection_shapes(LLAMA3)
    want = sum(
        16 * (out + inp / tp) if n in ROW_PARALLEL else 16 * (out / tp + inp)
        for n, (out, inp) in shapes.items()
    )
    assert t.adapters == want
    assert t.frozen == sum(out * inp for out, inp in shapes.values()) / tp
    assert t.stored == 4 * t.frozen and t.gathered == 2 * t.frozen
    whole = lora_terms(LLAMA3, 16, ALL, "auto", "bf16")
    assert whole.adapters / tp < t.adapters < whole.adapters  # each adapter's half is whole


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_lora_params_at_rest_under_tp_are_the_ranks_shards(tp):
    """DDP + tp: a rank holds its shards of the frozen projections, the embedding and the head
    (vocab-parallel), the whole norms, and its adapter shards, all fp32 (an 'auto' base). The
    planner once took whole-block sizes from a per-rank count: negative 'other' parameters
    at tp = 8."""
    plan = _plan(
        num_gpus=tp,
        layout=Layout(tp=tp),
        lora_rank=16,
        lora_targets=ALL,
        global_batch=1,
    )
    mem = estimate(plan).memory
    pc = LLAMA3.param_counts()
    t = lora_terms(LLAMA3, 16, ALL, "auto", "bf16", tp=tp)
    n = LLAMA3.num_layers
    rest = (
        (pc.embedding + pc.head) / tp + n * pc.norms + pc.final_norm + n * (t.frozen + t.adapters)
    )
    assert mem.params - mem.detail["params.in_flight"] == pytest.approx(4 * rest)
    # the in-flight casts: the adapters' (autocast caches them); the frozen projections'
    # casts are made per forward and counted with the activations
    assert mem.detail["params.in_flight"] == pytest.approx(2 * n * t.adapters)


def test_lora_flops_count_the_halves_tp_keeps_whole():
    """Per-rank hardware FLOPs under tp: A beside a column-parallel projection and B beside a
    row-parallel one run whole on every rank (forward + weight and input gradients: 3 x
    2 x rank x width), on top of the counted FLOPs divided by tp; model FLOPs (MFU) count
    each adapter once."""
    shapes = projection_shapes(LLAMA3)
    lf = lora_flops(LLAMA3, 16, ATTN)
    whole = sum(
        16 * (out if n in ROW_PARALLEL else inp) for n, (out, inp) in shapes.items() if n in ATTN
    )
    assert lf.replicated_forward == 2 * whole
    assert lf.replicated_hardware(1) == 0.0
    assert lf.replicated_hardware(4) == 3 * 3 * 2 * whole
    assert lf.replicated_hardware(4, "full") == 3 * 4 * 2 * whole
    lora = (16, ATTN, "auto")
    one = model_flops(ModelTerms(LLAMA3), 2048, True, "none", lora)
    four = model_flops(ModelTerms(LLAMA3), 2048, True, "none", lora, tp=4)
    assert four.block_hardware - one.block_hardware == pytest.approx(3 * 3 * 2 * whole)
    assert four.model == one.model


def test_activation_offload_moves_the_activations_to_the_host():
    plain = estimate(_plan()).memory
    off = estimate(_plan(offload="activations")).memory
    assert off.host > 0 and plain.host == 0
    assert off.detail["host.activations"] > plain.activations - off.activations > 0
    assert off.total < plain.total


def _cli(capsys, *args: str) -> tuple[int, str]:
    try:
        rc = main(["plan", "--model", "llama2-13b", "--gpu", "rtx3090", "--gpus", "2",
                   "--seq-len", "512", "--global-batch", "2", *args])  # fmt: skip
    except SystemExit as e:
        rc = int(e.code or 0)
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_plan_names_the_host_ram_a_layout_overflows(capsys):
    """The issue's example: a 13B model on 2 x RTX 3090 'fits' with FSDP2's parameter offload
    only while the host's RAM is not checked."""
    exact = ("--dp", "2", "--zero", "3", "--offload", "params", "--micro-batch", "1")
    rc, out = _cli(capsys, *exact)
    assert rc == 0 and " yes" in out
    rc, out = _cli(capsys, *exact, "--host-memory-gib", "64")
    assert "NO (host" in out and "> 64.0 GiB" in out


def test_search_refuses_when_no_layout_fits_the_host(capsys):
    rc, out = _cli(capsys, "--host-memory-gib", "64")
    assert rc != 0
    assert "--host-memory-gib" in out and "host's RAM" in out


def test_explain_shows_the_lora_and_host_terms(capsys):
    rc = main(["explain", "--model", "llama3-8b", "--gpu", "rtx4090", "--gpus", "1",
               "--seq-len", "2048", "--global-batch", "8", "--micro-batch", "1",
               "--lora-rank", "16", "--lora-base-dtype", "nf4", "--offload", "activations",
               "--host-memory-gib", "64"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "LoRA rank 16 on wq, wk, wv, wo" in out and "stored as nf4" in out
    assert "dequantization temporary" in out
    assert "host memory" in out and "vs host RAM 64.00 GiB -> fits" in out
    assert f"{LLAMA3.num_layers * lora_terms(LLAMA3, 16, ATTN, 'nf4', 'bf16').adapters:,.0f}" in out


def test_explain_shows_the_lora_terms_per_tp_rank(capsys):
    rc = main(["explain", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
               "--seq-len", "2048", "--global-batch", "8", "--micro-batch", "1",
               "--lora-rank", "16", "--dp", "2", "--tp", "4", "--sp", "--zero", "3"])  # fmt: skip
    out = " ".join(capsys.readouterr().out.split())  # (explain wraps its lines)
    assert rc == 0
    t = lora_terms(LLAMA3, 16, ATTN, "auto", "bf16", tp=4)
    assert "split with W over tp=4" in out and "per block per tp rank" in out
    assert f"= {LLAMA3.num_layers * t.adapters:,.0f} trainable params per tp rank" in out
    assert f"frozen projections {t.frozen:,.0f} per block per tp rank" in out


def test_host_capacity_comes_from_the_preset_or_the_config():
    assert hardware_preset("h100-sxm").host_memory_bytes == 2048 * 2**30
    assert hardware_preset("rtx3090").host_memory_bytes == 0  # unknown: not checked
    from scaletrain.config import load_config

    job = load_config(None, ["--hardware.gpu=rtx3090", "--hardware.host_memory_gib=64"])
    assert job.hardware_spec().host_memory_bytes == 64 * 2**30
