"""Eval sources and a mixture's components on gloo ranks: dp2, tp2, pp2 and cp2 score each
held-out set, and each component's validation part, as one process does.

dp2 (micro-batch 2 per rank) evaluates the windows one process sees with a micro-batch of 4
(rank 0's rows first, the validation rule), so its per-source loss is the mean over the same
windows; tp2, pp2 (forward-only schedule over groups of grad_accum batches) and cp2 (each rank
its load-balanced chunks) evaluate the very batches one process does with micro-batch 2 (4
batches: a whole number of pipeline steps, which `val_batch_count` rounds up to)."""

from __future__ import annotations

import json

import pytest

from scaletrain.parallel.launch import spawn

from ._trainer_fns import small_job, train_evals

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_per_source_loss_matches_one_process(tmp_path):
    docs = [
        f"held-out sentence {i} about the {('red', 'blue', 'green')[i % 3]} fox." for i in range(60)
    ]
    (tmp_path / "held.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (tmp_path / "more.txt").write_text("a different register of text, lower case only. " * 40)
    # the training corpus: a mixture, each component also scored on its own validation part
    (tmp_path / "web.jsonl").write_text(
        "".join(
            json.dumps({"text": f"page {i}: the {i % 7} quick foxes."}) + "\n" for i in range(900)
        )
    )
    (tmp_path / "books.txt").write_text("Chapter one. It was a dark and stormy night. " * 400)
    mix = f"web={tmp_path / 'web.jsonl'}@2, books={tmp_path / 'books.txt'}@1"

    def job(run, micro, *extra):
        return small_job(
            tmp_path,
            run,
            "--batch.global_batch=4",
            f"--batch.micro_batch={micro}",
            "--train.steps=2",
            "--train.eval_every=1",
            "--train.eval_batches=4",
            f"--data.eval_sources=held={tmp_path / 'held.jsonl'}, more={tmp_path / 'more.txt'}",
            f"--data.source={mix}",
            *extra,
        )

    ref = train_evals({"micro4": job("ref4", 4), "micro2": job("ref2", 2)})
    par = spawn(
        train_evals,
        2,
        {
            "dp2": job("dp2", 2, "--parallel.dp=2"),
            "tp2": job("tp2", 2, "--parallel.tp=2"),
            "pp2": job("pp2", 2, "--parallel.pp=2"),
            "cp2": job("cp2", 2, "--parallel.cp=2"),
        },
    )
    for name, want in (("dp2", "micro4"), ("tp2", "micro2"), ("pp2", "micro2"), ("cp2", "micro2")):
        val, evals = ref[want]
        assert set(evals) == {"held", "more", "web", "books"}
        assert len(set(evals.values())) == 4  # four different sets
        for rank_out in par:
            got_val, got = rank_out[name]
            assert got_val == pytest.approx(val, abs=2e-5, rel=0)
            for k in evals:  # reduction order of the sharded sums: the val tolerance
                assert got[k] == pytest.approx(evals[k], abs=2e-5, rel=0), (name, k)
