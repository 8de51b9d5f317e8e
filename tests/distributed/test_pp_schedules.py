"""Stage splitting rules. The schedules' training parity (every schedule, and pp x FSDP) is in
test_parity_matrix.py."""

import dataclasses
import json

import pytest

from scaletrain.config import resolve_model
from scaletrain.models import build_model
from scaletrain.parallel.pipeline import split_layers, split_stage, stage_ids


def test_split_layers_rule():
    assert split_layers(2, 2) == [range(0, 1), range(1, 2)]
    assert [len(r) for r in split_layers(32, 4)] == [7, 9, 9, 7]
    assert [len(r) for r in split_layers(4, 4)] == [0, 2, 2, 0]
    assert [len(r) for r in split_layers(5, 1)] == [5]
    for num_layers, num_stages in [(7, 3), (12, 8), (80, 16)]:
        parts = split_layers(num_layers, num_stages)
        assert [i for r in parts for i in r] == list(range(num_layers))
    with pytest.raises(ValueError, match="parallel.pp"):
        split_layers(2, 5)
    assert stage_ids(1, 4, 2) == [1, 5]


def test_split_stage_keeps_names_and_copies_tied_embeddings():
    model = build_model(resolve_model("tiny-llama"), device="meta")
    first, last = split_stage(model, 0, 2), split_stage(model, 1, 2)
    assert list(first.layers) == ["0"] and list(last.layers) == ["1"]
    assert first.output is None and first.norm is None and last.tok_embeddings is None
    names = {n for m in (first, last) for n, _ in m.named_parameters()}
    assert names == {n for n, _ in model.named_parameters()}
    # tied embeddings: the last stage gets its own head, the first keeps the embedding
    tied = build_model(resolve_model("tiny"), device="meta")
    first, last = split_stage(tied, 0, 2), split_stage(tied, 1, 2)
    assert first.output is None and first.tok_embeddings is not None
    assert last.output is not None and last.tok_embeddings is None
    assert last.output.weight.shape == tied.tok_embeddings.weight.shape


def test_dualpipev_holds_two_stages_per_rank_in_a_v():
    """rank r holds stages r and 2p-1-r (torch's style='v'): rank 0 the first and the last."""
    from torch.distributed.pipelining.schedules import generate_rank_to_stage_mapping

    for p in (2, 4):
        v = generate_rank_to_stage_mapping(p, 2 * p, style="v")
        assert [stage_ids(r, p, 2, schedule="dualpipev") for r in range(p)] == [
            list(v[r]) for r in range(p)
        ]
    assert stage_ids(0, 4, 2, schedule="dualpipev") == [0, 7]


def test_dualpipev_layout_rules():
    from scaletrain.config import ConfigError, Layout, check_layout, fused_head_loss

    untied = dataclasses.replace(resolve_model("tiny-llama"), num_layers=4)
    tied = dataclasses.replace(resolve_model("tiny"), num_layers=4)
    dpv = Layout(pp=2, pp_schedule="dualpipev", pp_virtual=2)
    check_layout(dpv, untied, world_size=2, global_batch=4, micro_batch=1, seq_len=16)
    assert not fused_head_loss(dpv)  # split backward, as zero-bubble
    cases = [
        (Layout(pp=2, pp_schedule="dualpipev", pp_virtual=1), untied, 4, "parallel.pp_virtual"),
        (dpv, untied, 2, "batch.global_batch"),  # 2 micro-batches < 4 stages
        (Layout(pp=2, pp_schedule="dualpipev", pp_virtual=2), tied, 4, "parallel.pp_schedule"),
    ]
    for layout, model, gb, field in cases:
        with pytest.raises(ConfigError) as e:
            check_layout(layout, model, world_size=2, global_batch=gb, micro_batch=1, seq_len=16)
        assert e.value.field == field, (layout, e.value)


def test_dualpipev_dry_run_runs_torchs_order_in_a_v(capsys):
    """The dry-run runs torch's DualPipeV order on the V's stages: rank 0 the embedding and
    the head (stages 0 and 3 of tiny-llama-4l: 0 layers each), rank 1 the four layers; the
    ranks' FLOPs add up to zero-bubble's (same stages' work, same split backward). The planner
    plans the V (its bubble here)."""
    from scaletrain.cli import main
    from scaletrain.config.loading import load_config
    from scaletrain.dryrun import dryrun

    flops = {}
    for sched in ("dualpipev", "zero-bubble"):
        job = load_config(
            None,
            [
                "--model.name=tiny-llama",
                "--model.num_layers=4",
                "--parallel.pp=2",
                f"--parallel.pp_schedule={sched}",
                "--parallel.pp_virtual=2",
                "--batch.global_batch=4",
                "--batch.micro_batch=1",
            ],
        )
        flops[sched] = [dryrun(job, world_size=2, rank=r).flops for r in (0, 1)]
    v = flops["dualpipev"]
    assert v[1] > 10 * v[0]  # rank 1 holds every layer
    assert sum(v) == sum(flops["zero-bubble"])
    # the planner plans the V itself: DualPipeV's bubble, (p-1)/(6m) of compute
    argv = ["plan", "--model", "llama3-8b", "--gpus", "16", "--pp", "4", "--json"]
    assert main([*argv, "--pp-schedule", "dualpipev", "--global-batch", "64"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["plan"]["pp_schedule"] == "dualpipev" and est["plan"]["pp_virtual"] == 2
    m = est["plan"]["grad_accum"]
    assert est["time"]["bubble_s"] == pytest.approx(3 / (6 * m) * est["time"]["compute_s"])
