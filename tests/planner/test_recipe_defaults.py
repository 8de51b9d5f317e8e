"""Framework defaults for what a plan or a published run does not state (#39 items 1-2):
recipes/defaults.py, their use by the corpus and the CLI, and the framework mechanisms the
recipes model for the misses of issue 39 (Nanotron's gradient copies, Megatron-LM's overlap)."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from scaletrain.cli import main
from scaletrain.config import ConfigError, Layout, hardware_preset, model_preset
from scaletrain.planner import estimate
from scaletrain.planner.recipes.defaults import (
    DEFAULTED_FIELDS,
    KNOB_DEFAULTS,
    LAYOUT_DEFAULTS,
    apply_defaults,
)
from scaletrain.planner.recipes.memory import recipe_problems, recipe_rank_memory
from scaletrain.planner.recipes.published import load_runs, parse_runs, plan_input, refusals
from scaletrain.planner.recipes.registry import RECIPES, recipe_named
from scaletrain.planner.recipes.stages import recipe_stage_layers
from scaletrain.planner.types import PlanInput

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

_FILE = re.compile(r"[\w.-]+/[\w./-]+\.(py|sh|yaml|toml|md)\b")
"""A path in a framework's repository: every default names the file it is read from."""


def test_every_foreign_recipe_states_each_default_with_its_source() -> None:
    foreign = [n for n in RECIPES if n != "scaletrain"]
    assert set(LAYOUT_DEFAULTS) == set(foreign) and set(KNOB_DEFAULTS) == set(foreign)
    for name in foreign:
        r = RECIPES[name]
        # a framework without tensor / pipeline parallelism (llm-foundry) has no sp / schedule
        lacks = {"sp"} if not r.tp_available else set()
        lacks |= {"pp_schedule"} if not r.pp_schedules else set()
        fields = [d.field for d in LAYOUT_DEFAULTS[name]]
        assert sorted(fields) == sorted(set(DEFAULTED_FIELDS) - lacks), name
        for d in LAYOUT_DEFAULTS[name]:
            assert _FILE.search(d.source), (name, d.field, d.source)
        for k in KNOB_DEFAULTS[name]:
            assert _FILE.search(k.source), (name, k.name, k.source)
        # the framework runs what it defaults to (its own refusal rules agree)
        tp = 2 if r.tp_available else 1
        pp = 2 if r.pp_schedules else 1
        filled = apply_defaults(name, Layout(dp=2, tp=tp, pp=pp), None, ())
        assert not recipe_problems(name, filled.layout, ac=filled.ac), name
        assert len(filled.lines) == len(fields)


def test_given_fields_are_kept_and_degree_one_takes_no_default() -> None:
    base = Layout(dp=8)
    # sp means nothing at tp = 1, a schedule nothing at pp = 1: neither is assumed
    filled = apply_defaults("megatron", base, None, ())
    assert [line.split(" =")[0] for line in filled.lines] == ["zero", "ac"]
    assert filled.layout.zero == 1 and filled.ac == "none"
    kept = apply_defaults("megatron", base, "full", ("zero",))
    assert kept.layout == base and kept.ac == "full" and kept.lines == ()
    # the default recipe has no framework defaults: its unset fields are the job's
    own = apply_defaults("scaletrain", base, None, ())
    assert own.layout == base and own.lines == ()


def _row(**layout: Any) -> dict[str, Any]:
    """A Megatron-LM FP8 Llama 3 8B run on 8 H100 (examples/llama/README.md's shape)."""
    return {
        "name": "mlm-8b",
        "framework": "megatron-lm",
        "source": "https://example.org/table 1",
        "gpu": "h100-sxm",
        "num_gpus": 8,
        "seq_len": 8192,
        "model": {"preset": "llama3-8b"},
        "layout": {
            "dp": 4,
            "cp": 2,
            "micro_batch": 1,
            "global_batch": 128,
            "precision": "fp8",
            **layout,
        },
        "measured": {"tokens_per_s_per_gpu": 13812, "oom": False},
    }


def test_an_unstated_zero_stage_takes_the_distributed_optimizer() -> None:
    """Issue 39's first miss class: a Megatron fp8 run on 8 H100 that does not state its ZeRO
    stage ran; planned at stage 0 (16+ B/param unsharded) it is an OOM, with Megatron-LM's
    documented distributed optimizer it fits."""
    (unstated,) = parse_runs({"runs": [_row()]})
    (stage0,) = parse_runs({"runs": [_row(zero=0)]})
    p = plan_input(unstated, "megatron")
    assert p.layout.zero == 1 and not refusals(unstated, "megatron")
    assert any("--use-distributed-optimizer" in line for line in p.assumed)
    assert estimate(p).memory.fits
    p0 = plan_input(stage0, "megatron")
    assert p0.layout.zero == 0 and not any(line.startswith("zero") for line in p0.assumed)
    assert not estimate(p0).memory.fits
    # the default recipe (scaletrain's own allocations) takes Layout's own default, stage 0
    assert plan_input(unstated).layout.zero == 0 and plan_input(unstated).assumed == ()


def test_corpus_rows_without_a_stage_are_planned_with_the_framework_default() -> None:
    rows = {r.name: r for r in load_runs()}
    mlm = rows["megatron-h100-llama3-70b-64g-tp4-pp8-vp5-fp8"]
    assert "zero" not in mlm.layout.given and mlm.added_after
    p = plan_input(mlm, "megatron")
    assert (p.layout.zero, p.layout.sp, p.ac) == (1, True, "none")
    assert estimate(p).memory.fits


def test_plan_prints_and_explain_cites_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        *["--recipe", "nemo", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm"],
        *["--dp", "4", "--cp", "2", "--precision", "fp8", "--micro-batch", "1"],
        *["--global-batch", "128", "--seq-len", "8192"],
    ]
    assert main(["plan", *args]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "note: nemo defaults assumed for what was not given: zero = 1" in out
    assert "dp4 z1 cp2" in out
    assert main(["explain", *args]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "optim/adam.py distributed_fused_adam_with_cosine_annealing" in out
    assert "ac = none: no recompute" in out
    assert "framework settings the terms assume at their defaults" in out
    assert main(["plan", *args, "--zero", "0"]) == 0  # given: no default, and an OOM
    out = " ".join(capsys.readouterr().out.split())
    assert "given: ac = none" in out and "zero = 1" not in out  # only the AC is assumed
    assert "dp4 z0 cp2" in out and "NO (rank" in out


def _nanotron(layout: Layout, *, mb: int = 1, gb: int = 64) -> PlanInput:
    return PlanInput(
        model_preset("llama2-7b"),
        hardware_preset("h100-sxm"),
        layout.world_size,
        layout,
        4096,
        gb,
        mb,
        "bf16",
        recipe="nanotron",
    )


def test_nanotron_keeps_torch_ddps_bucket_copy_at_zero_0_only() -> None:
    """Nanotron wraps the model in torch DDP (without gradient_as_bucket_view) only at ZeRO-0
    with dp > 1 (trainer.py make_ddp): the reducer's bf16 copy of every gradient, 2 B/param."""
    r = recipe_named("nanotron")
    z0 = recipe_rank_memory(_nanotron(Layout(dp=8)), r, 0)
    P = z0.detail["params.count"]
    assert z0.buffer_terms["ddp_buckets"] == pytest.approx(2 * P)
    z1 = recipe_rank_memory(_nanotron(Layout(dp=8, zero=1)), r, 0)
    one = recipe_rank_memory(_nanotron(Layout(dp=1), gb=8), r, 0)
    assert "ddp_buckets" not in z1.buffer_terms and "ddp_buckets" not in one.buffer_terms


def test_nanotron_16_bit_grads_live_to_the_end_of_each_backward() -> None:
    """FP32GradientAccumulator.backward copies .grad into the fp32 buffer only after the whole
    backward: with a pipeline the other micro-batches' activations are still held then."""
    r = recipe_named("nanotron")
    p = _nanotron(Layout(dp=1, zero=0, pp=8, pp_schedule="1f1b"), gb=64)
    mem = recipe_rank_memory(p, r, 0)
    P, per_layer = mem.detail["params.count"], mem.detail["activations.per_layer"]
    # rank 0's layers by Nanotron's compute-cost split (recipes/stages.py): 5 of Llama-2 7B's 32
    layers, inflight = recipe_stage_layers(p, r)[0], mem.detail["activations.in_flight"]
    assert layers == 5
    assert mem.detail["grads.param_dtype_at_backward_end"] == pytest.approx(2 * P)
    states = mem.params + mem.grads + mem.optimizer
    end = (
        states
        + 2 * P
        + (inflight - 1) * layers * per_layer
        + sum(v for k, v in mem.buffer_terms.items() if k != "loss_backward_temp")
    )
    assert mem.total >= end * (1 - 1e-12)
    # an fp32 run has no 16-bit .grad beside the fp32 buffer
    fp32 = recipe_rank_memory(replace(p, precision="fp32"), r, 0)
    assert fp32.detail["grads.param_dtype_at_backward_end"] == 0


def test_megatron_overlaps_interleaved_sends_and_the_param_gather() -> None:
    """Megatron-LM's documented configuration: --overlap-param-gather (example scripts) and
    p2p overlap under the interleaved schedule only (arguments.py): exposure.exposed_by_family hides
    the pipeline sends behind compute for 'pp_p2p_interleaved' only when interleaved."""
    from scaletrain.planner.time.efficiency import COMM_OVERLAP
    from scaletrain.planner.time.exposure import ComputeWindow, exposed_by_family

    overlap = COMM_OVERLAP["megatron"]
    assert overlap == ("pp_p2p_interleaved", "dp_param_gather")
    window = ComputeWindow(microbatches=4, forward_s=1.0, backward_s=2.0, core_s=0.0, layers=4)
    terms = {"pp_p2p": (1e9, 0.5)}

    def exposed(sched: str, v: int, ov: tuple[str, ...]) -> float:
        lay = Layout(dp=1, pp=4, pp_schedule=sched, pp_virtual=v)
        plan = PlanInput(model_preset("llama2-7b"), hardware_preset("h100-sxm"), 4, lay, 4096, 8, 1)
        by_family = exposed_by_family(
            terms, plan, window, stage_params=1e9, gpus_per_node=8, overlap=ov
        )
        return sum(by_family.values())

    assert exposed("interleaved", 2, overlap) == 0.0  # hidden behind 4 x 3 s of compute
    assert exposed("1f1b", 1, overlap) == 0.5  # validate_args turns the overlap off
    assert exposed("interleaved", 2, ()) == 0.5  # a recipe without it charges the sends


def test_corpus_keys_added_after_and_pipeline_rank_are_checked() -> None:
    row = _row(zero=1)
    with pytest.raises(ConfigError, match="added_after"):
        parse_runs({"runs": [{**row, "added_after": ""}]})
    bad = {**row, "measured": {"memory_gib": 10.0, "memory_kind": "unknown", "pipeline_rank": -1}}
    with pytest.raises(ConfigError, match="pipeline_rank"):
        parse_runs({"runs": [bad]})
    (ok,) = parse_runs({"runs": [{**row, "added_after": "c1f5b3a"}]})
    assert ok.added_after == "c1f5b3a" and ok.held_out
    # a row a later change read is no longer held out
    with pytest.raises(ConfigError, match="tuned_after"):
        parse_runs({"runs": [{**row, "added_after": "c1f5b3a", "tuned_after": 5}]})
    (tuned,) = parse_runs({"runs": [{**row, "added_after": "c1f5b3a", "tuned_after": "bb07f57"}]})
    assert tuned.tuned_after == "bb07f57" and not tuned.held_out


def _nanotron_flops(L: int, h: int, a: int, f: int, v: int, s: int) -> float:
    """Nanotron's get_flops (src/nanotron/models/llama.py, kv heads = heads): 3 x forward, full
    s x s attention, the head once; per sequence."""
    d = h // a
    fwd = L * (2 * s * h * a * d * 3 + 2 * a * s * d * s * 2 + 2 * a * s * d * h)
    fwd += L * (4 * s * h * f + 2 * s * f * h) + 2 * s * h * v
    return 3.0 * fwd


def test_nanotron_rows_step_time_follows_from_their_mfu() -> None:
    """The nanotron rows state MFU (the figure's number) and the step time derived from it with
    nanotron's own FLOP count over 989 TFLOP/s per GPU (each row's `assumed`)."""
    rows = [r for r in load_runs() if r.framework == "nanotron"]
    assert len(rows) == 26
    for r in rows:
        m, L = r.model, r.layout
        assert r.added_after and r.measured.mfu is not None and r.measured.step_s is not None
        flops = _nanotron_flops(
            m.num_layers, m.dim, m.num_heads, m.ffn_dim, m.vocab_size, r.seq_len
        )
        step = flops * L.global_batch / (r.measured.mfu * 989e12 * r.num_gpus)
        assert r.measured.step_s == pytest.approx(step, rel=2e-3), r.name
        assert L.layout.world_size == r.num_gpus and L.global_batch == 256


def test_benchmark_reports_added_rows_apart() -> None:
    bench = pytest.importorskip("planner_vs_published")
    runs = [
        r
        for r in load_runs()
        if r.name in ("nemo-h100-llama2-7b-8g", "megatron-h100-llama3-8b-8g-cp2-fp8")
    ]
    s = bench.summarize(bench.evaluate(runs, peer=False))["recipe"]
    assert (s["tuned"]["rows"], s["added"]["rows"]) == (1, 1)
    assert s["tuned"]["step"]["n"] + s["added"]["step"]["n"] == s["all"]["step"]["n"]
    table = bench.summary_table(bench.summarize(bench.evaluate(runs, peer=False)))
    assert "*rows held out (added_after, no tuned_after)*" in table
