"""Document masking on gloo ranks: ZeRO-3, TP+SP, CP (ring attention masked with the whole
sequence's document ids), PP (every stage handed the document ids and positions; 1F1B and
zero-bubble's split backward), pp x cp and cp x tp+sp give the single-process losses; cp and pp
evaluate and sample as one process does."""

from __future__ import annotations

import json

import pytest
import torch

from scaletrain.parallel.launch import spawn

from ._trainer_fns import train_losses, train_many

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _args(tmp_path, run, *extra):
    return [
        "--model.name=tiny-llama",
        "--model.vocab_size=300",
        "--data.tokenizer=bpe",
        "--data.bpe_vocab_size=280",
        f"--data.source={tmp_path / 'c.jsonl'}",
        "--data.document_masking=true",
        "--batch.seq_len=32",
        "--batch.global_batch=4",
        "--batch.micro_batch=2",
        "--train.steps=3",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--guard.enabled=false",
        "--train.eval_every=1000",
        "--optim.warmup_steps=0",
        "--model.tie_embeddings=false",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / run}",
        *extra,
    ]


@pytest.mark.parametrize(
    "extra",
    [
        ["--parallel.dp=2", "--parallel.zero=3"],
        ["--parallel.tp=2", "--parallel.sp=true"],
        ["--parallel.cp=2"],
        ["--parallel.pp=2"],
        ["--parallel.pp=2", "--parallel.pp_schedule=zero-bubble"],
    ],
    ids=["zero3", "tp_sp", "cp", "pp", "pp_zero_bubble"],
)
def test_masked_training_matches_one_process(tmp_path, extra):
    _corpus(tmp_path)
    reference = train_losses(_args(tmp_path, "ref"))
    for losses in spawn(train_losses, 2, _args(tmp_path, "par", *extra)):
        assert losses == pytest.approx(reference, rel=2e-5)  # sharded-sum reduction order


@pytest.mark.parametrize("layout", ["--parallel.cp=2", "--parallel.pp=2"], ids=["cp", "pp"])
def test_masked_eval_and_sample_match_one_process(tmp_path, layout):
    """The cp (`local_batch`) and pp (`eval_loss`, `eval_logits`: the stages given the
    document ids) evaluation and generation paths mask too."""
    _corpus(tmp_path)
    extra = ["--train.eval_every=2", "--train.sample_tokens=6"]
    _, ref_val, ref_sample, _ = train_many({"ref": _args(tmp_path, "ref", *extra)})["ref"]
    for got in spawn(train_many, 2, {"par": _args(tmp_path, "par", layout, *extra)}):
        _, val, sample, _ = got["par"]
        assert val == pytest.approx(ref_val, rel=2e-5)  # as above
        assert len(ref_sample) > 0 and sample == ref_sample  # seeded, as test_trainer_layouts


def _corpus(tmp_path):
    words = ["red", "green", "blue", "cyan", "magenta", "yellow"]
    gen = torch.Generator().manual_seed(0)
    (tmp_path / "c.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "text": " ".join(
                        words[int(i)] for i in torch.randint(0, 6, (int(n),), generator=gen)
                    )
                }
            )
            + "\n"
            for n in torch.randint(2, 12, (600,), generator=gen)
        )
    )


def test_four_rank_layouts_match_one_process(tmp_path):
    """pp x cp (each stage's ring attention masked with the micro-batch's document ids) and
    cp x tp+sp on 4 ranks, one spawn for both."""
    _corpus(tmp_path)
    reference = train_losses(_args(tmp_path, "ref"))
    jobs = {
        "pp_cp": _args(tmp_path, "pp_cp", "--parallel.pp=2", "--parallel.cp=2"),
        "cp_tp": _args(
            tmp_path, "cp_tp", "--parallel.cp=2", "--parallel.tp=2", "--parallel.sp=true"
        ),
    }
    for rank_out in spawn(train_many, 4, jobs):
        for name in jobs:
            losses = rank_out[name][0]
            assert losses == pytest.approx(reference, rel=2e-5), name  # as above
