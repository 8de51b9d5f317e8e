"""What `plan` recommends, the trainer runs: the top-5 of real searches build and dry-run.

Each layout the search returns for a table of models x clusters is checked by the trainer's
own legality (`JobConfig.layout`) and dry-run (the trainer's build and step under fake
tensors) at small widths: the model keeps its heads, KV heads, experts and activation, with a
4-wide head dimension, just enough layers for the pipeline, and the data-parallel degree cut
to what the composition needs (ep, or 2). What is tested is that the trainer builds and steps
the layout class; the numbers are the planner's (see planner_accuracy for those).
"""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import MODEL_PRESETS, Layout, ParallelConfig, hardware_preset, load_config
from scaletrain.dryrun import dryrun
from scaletrain.planner.search.layouts import search

pytestmark = pytest.mark.slow

CASES = [  # (model, GPUs, GPU, seq_len, global batch)
    ("mixtral-8x7b", 16, "h100-sxm", 4096, 64),
    ("gpt3-175b", 1024, "a100-80gb", 2048, 1536),
    ("llama3-405b", 16384, "h100-sxm", 8192, 2048),
]


def _small(layout: Layout) -> Layout:
    """The same composition with the fewest data-parallel ranks it needs (expert parallelism
    takes its ranks from dp x cp: keep dp x cp = ep)."""
    dp = layout.ep // layout.cp if layout.ep > 1 else min(layout.dp, 2)
    rep = min(layout.dp_replicate, 2) if dp % 2 == 0 else 1
    return dataclasses.replace(layout, dp=dp, dp_replicate=rep)


def _small_job(model_name: str, est, gpu: str):
    L = _small(est.plan.layout)
    model = MODEL_PRESETS[model_name]()
    small = dataclasses.replace(
        model,
        dim=model.num_heads * 4,
        ffn_dim=8 * L.tp,
        num_layers=L.pp * L.pp_virtual,
        vocab_size=64 * L.tp,
    )
    # the fewest micro-batches the schedule takes (interleaved / zero-bubble: a multiple of pp)
    m = L.pp if L.pp > 1 else 1
    seq = 8 * max(2 * L.cp, L.tp)  # CP splits a sequence in 2 x cp chunks: 8 tokens each
    job = load_config(
        None,
        {
            # the default model's 128 positions must not refuse a long-CP layout's sequence
            # (cp16: 256 tokens); the small model replaces it below
            "model": {"max_seq_len": max(128, seq)},
            "batch": {
                "seq_len": seq,
                "micro_batch": 1,
                "global_batch": m * L.dp,
            },
            "hardware": {"gpu": gpu},
            "memory": {"ac": est.plan.ac, "offload": "none"},
            "precision": {"dtype": est.plan.precision},
        },
    )
    return dataclasses.replace(job, model=small, parallel=ParallelConfig.from_layout(L)), L


@pytest.mark.parametrize(("model", "gpus", "gpu", "seq", "gb"), CASES, ids=[c[0] for c in CASES])
def test_top_layouts_build_and_dry_run(model, gpus, gpu, seq, gb):
    result = search(
        MODEL_PRESETS[model](), hardware_preset(gpu), gpus, seq_len=seq, global_batch=gb, top_k=5
    )
    assert result.top, f"no layout for {model} on {gpus} x {gpu}"
    seen = set()
    for est in result.top:
        job, small = _small_job(model, est, gpu)
        key = (small, job.memory.ac)
        if key in seen:
            continue
        seen.add(key)
        world = small.world_size
        job.layout(world)  # the trainer's legality (raises ConfigError naming the field)
        m = dryrun(job, world_size=world, rank=0, count_flops=False)
        assert m.memory.total > 0, small.label()
