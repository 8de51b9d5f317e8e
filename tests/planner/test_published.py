"""The published-runs corpus (planner/data/published_runs.toml), its loader, and the summary of
benchmarks/planner_vs_published.py on a slice of it."""

from __future__ import annotations

import copy
import math
import statistics
import sys
import tomllib
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from scaletrain.config import ConfigError, hardware_preset
from scaletrain.planner import estimate
from scaletrain.planner.recipes.published import CORPUS, load_runs, parse_runs, plan_input, refusals

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

GENERATION = {
    "v100-32gb": "Volta",
    "v100-16gb": "Volta",
    "a100-40gb": "Ampere",
    "a100-80gb": "Ampere",
    "h100-sxm": "Hopper",
    "h100-hbm2e-500w": "Hopper",
    "h100-pcie": "Hopper",
    "h200": "Hopper (H200)",
    "mi300x": "CDNA3 (AMD)",
    "rtx3090": "Ampere",
    "rtx4090": "Ada",
    "b200": "Blackwell",
}
"""GPU generations; H200 counted apart from H100 only for its memory (same Hopper SMs)."""


@pytest.fixture(scope="module")
def runs():
    return load_runs()


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return tomllib.loads(resources.files("scaletrain.planner").joinpath(CORPUS).read_text())


def test_corpus_size_frameworks_and_generations(runs) -> None:
    assert len(runs) >= 45
    assert len({r.framework for r in runs}) >= 5
    arch = {GENERATION[r.gpu].split()[0] for r in runs}
    assert {"Volta", "Ampere", "Hopper"} <= arch
    assert len({r.name for r in runs}) == len(runs)


def test_every_row_cites_a_source_and_measures_something(runs) -> None:
    for r in runs:
        assert r.source.startswith("https://") and len(r.source.split()) >= 2, r.name
        m = r.measured
        assert any(
            v is not None for v in (m.memory_gib, m.tokens_per_s_per_gpu, m.step_s, m.mfu, m.oom)
        ), r.name
        if m.memory_gib is not None:
            assert m.memory_kind in ("allocated", "reserved", "unknown"), r.name
    # published memory, throughput and OOM all present somewhere in the corpus
    assert sum(r.measured.memory_gib is not None for r in runs) >= 15
    assert sum(r.measured_step_s() is not None for r in runs) >= 40
    assert any(r.measured.oom for r in runs)


def test_measured_step_from_tokens_per_second(runs) -> None:
    r = next(r for r in runs if r.name == "tt-h100-l31-8b-fsdp8")
    # 16 sequences x 8192 tokens / (5762 tokens/s/GPU x 8 GPUs)
    assert r.measured_step_s() == pytest.approx(16 * 8192 / (5762 * 8), rel=1e-12)
    b = next(r for r in runs if r.name == "ds-a100-bloom176b-gbs2048")
    assert b.measured_step_s() == 104.70


def test_every_row_is_accepted_or_refused_with_a_reason(runs) -> None:
    accepted = 0
    for r in runs:
        why = refusals(r)
        if why:
            assert all("=" in w and "invalid" in w and "\n" not in w for w in why), why
            continue
        e = estimate(plan_input(r))
        assert e.memory.reserved > 0 and math.isfinite(e.memory.reserved), r.name
        assert 0 < e.time.step_s < math.inf and 0 < e.mfu < 1, r.name
        accepted += 1
    assert accepted >= 45


def test_plan_input_carries_the_row(runs) -> None:
    r = next(r for r in runs if r.name == "tt-h100-l31-405b-3d-interleaved")
    p = plan_input(r)
    assert (p.layout.dp, p.layout.tp, p.layout.pp, p.layout.pp_virtual) == (8, 8, 8, 2)
    assert (p.num_gpus, p.seq_len, p.global_batch, p.micro_batch) == (512, 8192, 256, 4)
    assert p.grad_accum == 8 and p.precision == "fp8" and p.ac == "full"
    # the Grand Teton card's own preset, not the 80 GB one
    assert p.hardware == hardware_preset("h100-hbm2e-500w")
    mpt = next(r for r in runs if r.name == "foundry-a100-80g-mpt7b-8g-noac")
    # learned positions sized to the run's sequence; no biases, tied head
    assert mpt.model.max_seq_len == 2048 and not mpt.model.bias and mpt.model.tie_embeddings


def _bad(raw: dict[str, Any], edit) -> str:
    data = copy.deepcopy(raw)
    edit(data["runs"][3])
    with pytest.raises(ConfigError) as ei:
        parse_runs(data, "corpus.toml")
    return str(ei.value)


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda r: r.pop("source"), "source"),
        (lambda r: r.__setitem__("source", "arXiv 2104.04473 Table 1"), "source"),
        (lambda r: r.__setitem__("gpu", "h100"), "gpu"),
        (lambda r: r.__setitem__("colour", "red"), "colour"),
        (lambda r: r["layout"].__setitem__("dp", 3), "layout"),
        (lambda r: r["layout"].__setitem__("ac", "some"), "layout.ac"),
        (lambda r: r["layout"].__setitem__("zero", 4), "layout.zero"),
        (lambda r: r["layout"].__setitem__("pp_schedule", "1F1B"), "layout.pp_schedule"),
        (lambda r: r["layout"].__setitem__("tp", 0), "layout.tp"),
        (lambda r: r["layout"].__setitem__("micro_batch", True), "layout.micro_batch"),
        (lambda r: r["layout"].__setitem__("sp", 1.5), "layout.sp"),
        (lambda r: r["layout"].pop("global_batch"), "layout.global_batch"),
        (lambda r: r["layout"].__setitem__("comm_overlap", ["tensor"]), "layout.comm_overlap"),
        (lambda r: r["layout"].__setitem__("comm_overlap", "tp"), "layout.comm_overlap"),
        (lambda r: r["layout"].__setitem__("comm_overlap", ["tp", "tp"]), "layout.comm_overlap"),
        (lambda r: r.__setitem__("hardware", {"nvlink_links": 2}), "hardware"),
        (lambda r: r.__setitem__("hardware", {"gpus_per_node": -4}), "hardware"),
        (lambda r: r.__setitem__("step_not_comparable", ""), "step_not_comparable"),
        (lambda r: r.__setitem__("step_not_comparable", True), "step_not_comparable"),
        (lambda r: r["measured"].__setitem__("mfu", 42.0), "measured.mfu"),
        (lambda r: r["measured"].pop("memory_kind"), "measured.memory_kind"),
        (lambda r: r.__setitem__("measured", {}), "measured"),
        (lambda r: r["model"].__setitem__("layer", 3), "model.layer"),
        (lambda r: r["model"].__setitem__("tie", "yes"), "model.tie"),
        (lambda r: r.__setitem__("model", {"preset": "llama9-1t"}), "model.preset"),
        (lambda r: r.__setitem__("lora", {"rank": 0, "targets": ["wq"]}), "lora.rank"),
        (lambda r: r.__setitem__("lora", {"rank": 8}), "lora.targets"),
        (lambda r: r.__setitem__("lora", {"rank": 8, "targets": "wq,wv"}), "lora.targets"),
        (lambda r: r.__setitem__("lora", {"rank": 8, "targets": ["q_proj"]}), "lora.targets"),
        (
            lambda r: r.__setitem__("lora", {"rank": 8, "targets": ["wq"], "base_dtype": "nf8"}),
            "lora.base_dtype",
        ),
        (
            lambda r: r.__setitem__("lora", {"rank": 8, "targets": ["wq"], "alpha": 16}),
            "lora.alpha",
        ),
        (
            lambda r: r.__setitem__("model", {"layers": 2, "hidden": 100, "heads": 3, "vocab": 10}),
            "model.num_heads",
        ),
    ],
)
def test_bad_rows_give_one_line_naming_row_and_field(raw, edit, field) -> None:
    msg = _bad(raw, edit)
    name = raw["runs"][3]["name"]
    assert "\n" not in msg
    assert msg.startswith(f"corpus.toml runs[3] ({name}).{field}"), msg
    assert "invalid" in msg


def test_lora_row_plans_adapters_over_a_frozen_base(runs, raw) -> None:
    q = next(r for r in runs if r.name == "tune-4090-l31-8b-qlora-r8-all")
    p = plan_input(q)
    assert (p.lora_rank, p.lora_base) == (8, "nf4")
    assert p.lora_targets == ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
    # the same row trained in full holds every weight's gradient and AdamW states
    full = replace(q, lora=None)
    assert plan_input(full).lora_rank == 0
    assert estimate(p).memory.reserved < estimate(plan_input(full)).memory.reserved / 3
    # rows without a `lora` table train every parameter
    assert all(plan_input(r).lora_rank == 0 for r in runs if r.lora is None)
    # a model LoRA cannot adapt (GPT-2's fused qkv) is refused on load, naming the row's lora
    data = copy.deepcopy(raw)
    i = next(i for i, r in enumerate(data["runs"]) if r["model"].get("preset") == "gpt2-350m")
    data["runs"][i]["lora"] = {"rank": 8, "targets": ["wq", "wv"]}
    with pytest.raises(ConfigError, match=rf"runs\[{i}\] \(.*\)\.lora\.rank = 8 is invalid"):
        parse_runs(data, "corpus.toml")


def test_duplicate_names_and_bad_toml(raw, tmp_path) -> None:
    data = copy.deepcopy(raw)
    data["runs"][5]["name"] = data["runs"][4]["name"]
    with pytest.raises(ConfigError, match=r"runs\[5\].*\.name = .*unique"):
        parse_runs(data, "corpus.toml")
    p = tmp_path / "bad.toml"
    p.write_text("[[runs]]\nname = \n")
    with pytest.raises(ConfigError) as ei:
        load_runs(p)
    assert str(ei.value).startswith(str(p)) and "\n" not in str(ei.value)


def test_benchmark_summary_is_consistent_on_a_slice(runs) -> None:
    bench = pytest.importorskip("planner_vs_published")
    pick = [
        "tt-h100-l31-8b-fsdp8",
        "tt-h100-l31-8b-fsdp128",
        "tt-a100-l2-70b-sel-op-b2-oom",
        "foundry-h100-mpt7b-8g-noac",
        "ds-a100-bloom176b-gbs16",
        "nemo-h100-llama2-7b-8g",
    ]
    sl = [r for r in runs if r.name in pick]
    rows = bench.evaluate(sl, peer=False)
    s = bench.summarize(rows)["scaletrain"]
    # recompute every statistic from the rows and from predict() directly
    mem, step, fit = [], [], []
    for r, run in zip(rows, sl):
        if refusals(run):
            assert "refused" in r["scaletrain"]
            continue
        m, t, fits = bench.predict(run)
        if run.measured.memory_gib is not None:
            mem.append((m - run.measured.memory_gib) / run.measured.memory_gib)
        if run.measured_step_s() is not None:
            step.append((t - run.measured_step_s()) / run.measured_step_s())
        if run.measured.oom is not None:
            fit.append(fits == (not run.measured.oom))
    assert s["all"]["refused"] == 1 and s["all"]["predicted"] == 5
    assert s["all"]["memory"]["n"] == len(mem) == 2
    assert s["all"]["memory"]["median"] == pytest.approx(statistics.median(map(abs, mem)))
    assert s["all"]["memory"]["max"] == pytest.approx(max(map(abs, mem)))
    assert s["all"]["step"]["n"] == len(step) == 4
    assert s["all"]["step"]["median"] == pytest.approx(statistics.median(map(abs, step)))
    assert s["all"]["step"]["over"] + s["all"]["step"]["under"] == len(step)
    assert s["all"]["fit"]["n"] == len(fit) and s["all"]["fit"]["correct"] == sum(fit)
    assert s["all"]["fit"]["oom_rows"] == 1
    # per-framework counts add up to the overall ones
    fw = [k for k in s if k not in ("all", "common", "tuned", "added")]
    assert sorted(fw) == ["deepspeed", "llm-foundry", "nemo", "torchtitan"]
    # rows of the corpus the model was built against vs rows added after it (added_after)
    assert s["tuned"]["rows"] == 6 and s["added"]["rows"] == 0
    for key in ("rows", "predicted", "refused"):
        assert sum(s[k][key] for k in fw) == s["all"][key]
    assert sum(s[k]["step"]["n"] for k in fw) == s["all"]["step"]["n"]
    table = bench.summary_table(bench.summarize(rows))
    assert table.count("\n") == 3 + len(fw) and "**overall**" in table
    assert s["common"]["rows"] == 0  # --no-peer: llm-analysis predicts no row
    md = bench.markdown(rows, bench.summarize(rows))
    assert all(f"| {name} |" in md for name in pick)
    assert "ds-a100-bloom176b-gbs16 (batch.global_batch" in md  # the refusal and its reason
    # every listed miss names a cause
    for key in ("err_memory", "err_step"):
        for r in bench.worst(rows, key):
            assert bench.cause(r, key) and bench.cause(r, key) in md


def test_llm_analysis_peer_on_a_row(runs) -> None:
    pytest.importorskip("llm_analysis")
    bench = pytest.importorskip("planner_vs_published")
    r = next(r for r in runs if r.name == "foundry-h100-mpt7b-8g-noac")
    pred, why = bench.predict_llm_analysis(r)
    assert why == "" and pred is not None
    mem, step, fits = pred
    assert 0 < mem < 1000 and 0 < step < 100 and isinstance(fits, bool)
    cp = next(r for r in runs if r.name == "tt-h100-l31-8b-fsdp4-cp2-64k")
    assert bench.predict_llm_analysis(cp) == (None, "no context parallelism")


def test_cause_names_the_term_from_the_row_numbers() -> None:
    bench = pytest.importorskip("planner_vs_published")
    terms = {
        "logits": 20.0,
        "buffer_terms": {"pp_p2p": 16.0, "ddp_buckets": 1.0},
        "activations": 3.0,
        "comm_exposed_s": 0.0,
        "bubble_s": 0.0,
        "step_s": 10.0,
        "compute_s": 10.0,
        "mfu": 0.5,
        "mfu_measured": 0.25,
    }

    def row(mem_pred: float, mem_meas: float) -> dict[str, Any]:
        return {
            "measured": {"memory_gib": mem_meas},
            "scaletrain": {
                "memory_gib": mem_pred,
                "terms": terms,
                "err_memory": (mem_pred - mem_meas) / mem_meas,
                "err_step": -0.5,
            },
        }

    # 50 GiB short, 20 GiB of it an unfused loss's logits: 40% of the gap
    assert bench.cause(row(30.0, 80.0), "err_memory").startswith(
        "loss: an unfused loss keeps 20.0 GiB"
    )
    assert "40% of the 50.0 GiB gap" in bench.cause(row(30.0, 80.0), "err_memory")
    # 20 GiB over, 16 of them one buffer term (pp_p2p has no excuse of its own since the
    # trainer's pipeline buffers follow the micro-batches in flight: issue #37)
    assert bench.cause(row(30.0, 10.0), "err_memory") == (
        "buffer term pp_p2p (16.0 GiB) over-predicted"
    )
    terms["buffer_terms"] = {"ddp_buckets": 16.0}
    assert bench.cause(row(30.0, 10.0), "err_memory") == (
        "buffer term ddp_buckets (16.0 GiB) over-predicted"
    )
    # half the measured MFU: the efficiency constant
    assert bench.cause(row(30.0, 10.0), "err_step").startswith("efficiency: measured MFU 25%")


def test_plan_input_carries_loss_compile_and_fused_norm(runs) -> None:
    """The Dec-2024 torchtitan rows say their loss was not compiled (train.py at 9dec370), the
    April-2024 A100 Llama-2 13B rows that their RMSNorm was the fused kernel; rows that say
    nothing leave the recipe's rule (None) and the eager norm."""
    dec = plan_input(
        next(r for r in runs if r.name == "tt-h100-l31-8b-fsdp8-compile"), "torchtitan"
    )
    assert dec.compile and dec.compile_loss is False
    jun = plan_input(next(r for r in runs if r.name == "tt-h200-l31-8b-fsdp32-fp8"), "torchtitan")
    assert jun.compile and jun.compile_loss is None and not jun.fused_norm
    apr = plan_input(next(r for r in runs if r.name == "tt-a100-l2-13b-noac"), "torchtitan")
    assert apr.fused_norm


def test_benchmark_lists_recipe_memory_and_wrong_fit_calls(runs) -> None:
    """The results file lists every row's framework-recipe memory error (largest first) and
    each fit/OOM call the recipe gets wrong."""
    bench = pytest.importorskip("planner_vs_published")
    pick = ["tt-h100-l31-8b-fsdp8", "ds-v100-32g-1b3-tp1-pp2-dp4-mb1", "nemo-h100-llama2-7b-8g"]
    rows = bench.evaluate([r for r in runs if r.name in pick], peer=False)
    lines = bench._recipe_memory_section(rows)
    listed = [ln for ln in lines if ln.startswith("| tt-") or ln.startswith("| ds-")]
    errs = [
        abs(r["recipe"]["err_memory"]) for r in rows if r["recipe"].get("err_memory") is not None
    ]
    assert len(listed) == len(errs) == 2
    first = max(rows, key=lambda r: abs(r["recipe"].get("err_memory") or 0.0))
    assert listed[0].startswith(f"| {first['name']} |")
    wrong = [r["name"] for r in rows if r["recipe"].get("fit_correct") is False]
    assert sum(ln.startswith("- ") for ln in lines) == max(1, len(wrong))


def test_measured_cuda_context_replaces_the_recipe_constant(runs) -> None:
    """BigScience's rows carry the 1113 MiB context their page measured on V100; it replaces
    the recipe's constant in runtime_context and moves the reserved peak by exactly the
    difference (the allocator's overhead is on the bytes above the context)."""
    from scaletrain.planner.recipes.memory import recipe_rank_memory
    from scaletrain.planner.recipes.registry import recipe_named

    run = next(r for r in runs if r.name == "ds-v100-32g-1b3-tp1-pp1-dp8-mb1")
    assert run.cuda_context_mib == 1113
    p = plan_input(run, "deepspeed")
    assert p.runtime_context_bytes == 1113 * 2**20
    r = recipe_named("deepspeed")
    with_ctx = recipe_rank_memory(p, r, 0)
    without = recipe_rank_memory(replace(p, runtime_context_bytes=None), r, 0)
    diff = 1113 * 2**20 - r.cuda_context_bytes
    assert with_ctx.buffer_terms["runtime_context"] == 1113 * 2**20
    assert math.isclose(with_ctx.reserved - without.reserved, diff, rel_tol=1e-12)


def test_rank_range_for_rows_of_unstated_rank(runs) -> None:
    """Rows whose source does not say which GPU it read get the recipe's min..max over
    pipeline ranks (the max is the worst-rank prediction) and an error of 0 inside it, the
    distance to the nearer end outside; pp = 1 rows and stated kinds get none."""
    bench = pytest.importorskip("planner_vs_published")
    pp = next(r for r in runs if r.name == "ds-v100-32g-1b3-tp1-pp4-dp2-mb8")
    lo, hi = bench.predict_rank_range(pp, "deepspeed")
    assert lo < hi
    assert math.isclose(hi, bench.predict(pp, "deepspeed")[0], rel_tol=1e-12)
    assert (
        bench.predict_rank_range(
            next(r for r in runs if r.name == "ds-v100-32g-1b3-tp1-pp1-dp8-mb1"), "deepspeed"
        )
        is None
    )
    assert (
        bench.predict_rank_range(
            next(r for r in runs if r.name == "tt-h100-l31-405b-3d-1f1b"), "torchtitan"
        )
        is None
    )
    assert bench._range_err((8.0, 12.0), 10.0) == 0.0
    assert math.isclose(bench._range_err((8.0, 12.0), 16.0), -0.25)
    assert math.isclose(bench._range_err((8.0, 12.0), 4.0), 1.0)


def test_row_hardware_table_describes_the_runs_nodes(runs) -> None:
    """BigScience's 1B3 rows ran on 2 Jean Zay nodes of 4 V100s, every pair joined by 2
    NVLink2 links: the row's hardware table gives the preset those figures, so a tp = 2 pair
    all-reduces over its 2 links (40 GB/s at NCCL's 20 of 25 GB/s per link), dp = 8 crosses
    the 2 nodes, and every other figure stays the preset's."""
    from scaletrain.planner.time.comm import axis_link

    run = next(r for r in runs if r.name == "ds-v100-32g-1b3-tp2-pp1-dp4-mb1")
    hw = run.hardware()
    assert hw.gpus_per_node == 4 and hw.intra_node_pair_bw == 50e9
    assert replace(hw, gpus_per_node=8, intra_node_pair_bw=0.0) == hardware_preset("v100-32gb")
    p = plan_input(run)
    bw, _, inter = axis_link(p.layout, p.hardware, "tp")
    assert not inter and math.isclose(bw, 2 * 20e9)
    dp8 = next(r for r in runs if r.name == "ds-v100-32g-1b3-tp1-pp1-dp8-mb1")
    q = plan_input(dp8)
    assert axis_link(q.layout, q.hardware, "dp")[2]
    # explain names the TP term's bandwidth, its source and the node's wiring
    from scaletrain.planner import estimate
    from scaletrain.planner.output.explain import explain

    text = explain(estimate(plan_input(run, "deepspeed-0.4")))
    assert "TP: every all-reduce exposed, inside a node at 40 GB/s" in text
    assert "megatron/mpu/mappings.py _reduce" in text
    assert "40 GB/s for a pair" in text


def test_step_not_comparable_drops_the_step_but_keeps_memory_and_fit(runs, raw) -> None:
    """A row whose source says its cards ran power-capped (torchao's B200 table: '8xB200 GPUs
    limited to 750W', torchao d8bb51f) has no measured step to hold against the planner: no
    step error, while its memory and fit are still compared; the same row without the field
    gives its tokens/s back as a step."""
    bench = pytest.importorskip("planner_vs_published")
    capped = [r for r in runs if r.name.startswith("tao-b200pl-")]
    assert len(capped) == 3
    for r in capped:
        assert "750" in r.step_not_comparable and r.measured.tokens_per_s_per_gpu
        assert r.measured_step_s() is None
        assert r.hardware().power_w == 750.0
        assert replace(r.hardware(), power_w=1000.0) == hardware_preset("b200")
        errs = bench._errors(bench.predict(r, "torchtitan"), r)
        assert errs["err_step"] is None and errs["err_memory"] is not None
        assert errs["fit_correct"] is True
        back = replace(r, step_not_comparable="")
        want = 8 * 8192 / (r.measured.tokens_per_s_per_gpu * 8)
        assert back.measured_step_s() == pytest.approx(want, rel=1e-12)
    # every other row keeps its step
    assert all(not r.step_not_comparable for r in runs if not r.name.startswith("tao-b200pl-"))
    # the field round-trips through the loader
    data = copy.deepcopy(raw)
    data["runs"][3]["step_not_comparable"] = "the cards ran at an unstated clock cap"
    row = parse_runs(data, "corpus.toml")[3]
    assert row.measured_step_s() is None and row.step_not_comparable.startswith("the cards")


def test_torchao_h100_rows_plan_on_metas_500w_h100(runs) -> None:
    """torchao's H100 float8 table ran on Meta's H100 variant (torchao roofline_utils.py at
    890e0ac8: 2.4 TB/s, 'custom to Meta's H100 variant'): the 96GB HBM2e 500 W preset, as
    torchtitan's own H100 benchmark rows."""
    rows = [r for r in runs if r.name.startswith("tao-h100-")]
    assert len(rows) == 3
    for r in rows:
        assert r.gpu == "h100-hbm2e-500w"
        assert r.hardware().memory_bw == 2400e9


def test_allocated_rows_compare_without_the_runtime_context(runs) -> None:
    """torch's max_memory_allocated() does not see the CUDA context, cuBLAS workspaces or NCCL
    buffers: a row publishing an allocated peak is compared with `total` less the context
    term, a reserved or unstated one with `reserved` (context in)."""
    from scaletrain.planner.recipes.published import published_peak_bytes

    run = next(r for r in runs if r.measured.memory_kind == "allocated")
    mem = estimate(plan_input(run, "scaletrain")).memory
    ctx = mem.buffer_terms["runtime_context"]
    assert ctx > 0
    assert published_peak_bytes(mem, "allocated") == mem.total - ctx
    assert published_peak_bytes(mem, "reserved") == mem.reserved
    assert published_peak_bytes(mem, "unknown") == mem.reserved
    assert mem.reserved > mem.total > published_peak_bytes(mem, "allocated")
