"""A sequence beyond the model's context (issue 37 item 7): plan/explain/dryrun extend a RoPE
model's context with a printed note; learned positions and `train` refuse in one line."""

from __future__ import annotations

import pytest

from scaletrain.cli import main
from scaletrain.config import ConfigError, load_config


def test_plan_extends_a_rope_context_and_says_so(capsys):
    args = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--global-batch", "8"]
    assert main(["plan", *args, "--seq-len", "16384"]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "model.max_seq_len = 16384 (derived: batch.seq_len 16384 is beyond" in text
    assert "8192-token context" in text


def test_the_extended_context_is_the_model_with_its_context_given():
    """The derived model is exactly the model asked with max_seq_len set (so plan, explain and
    dryrun plan what `train --model.max_seq_len=...` runs); given, nothing is derived."""
    from scaletrain.cli._job import resolve_job

    asked = {"model": {"name": "llama3-8b"}, "batch": {"seq_len": 16384}}
    extended = resolve_job(None, asked, real_model_defaults=True)
    given = {**asked, "model": {"name": "llama3-8b", "max_seq_len": 16384}}
    explicit = resolve_job(None, given, real_model_defaults=True)
    assert extended.job.model == explicit.job.model
    assert [d.field for d in extended.derived].count("model.max_seq_len") == 1
    assert not any(d.field == "model.max_seq_len" for d in explicit.derived)
    with pytest.raises(ConfigError, match="set model.max_seq_len"):
        resolve_job(None, asked)  # train's resolution: no extension


def test_learned_positions_cannot_be_extended(capsys):
    args = ["--model", "gpt2-124m", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "2048"]
    assert main(["plan", *args, "--global-batch", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--seq-len" in err and "learned position table" in err


@pytest.mark.parametrize(
    ("model", "words"),
    [("tiny-llama", "set model.max_seq_len"), ("gpt-mini", "learned position table")],
)
def test_train_refuses_beyond_the_context_naming_the_way(model, words):
    """train extends nothing by itself: one line, with the fix for each position kind."""
    with pytest.raises(ConfigError, match=words) as e:
        load_config(None, [f"--model.name={model}", "--batch.seq_len=1024"])
    assert e.value.field == "batch.seq_len"
