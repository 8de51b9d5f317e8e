"""The sample at the end of a run: a char-level vocabulary that cannot spell the prompt ("The ":
an all-lowercase corpus has no 'T') samples from what it can encode, instead of a ValueError
traceback after training finished."""

from __future__ import annotations

import pytest

from scaletrain.data.tokenizer import ByteTokenizer, CharTokenizer
from scaletrain.trainer.sample import prompt_ids

from ._cli import no_traceback, scaletrain, tiny_job

pytestmark = pytest.mark.fault("run_end_sample")


def test_prompt_keeps_the_characters_the_vocabulary_has():
    tok = CharTokenizer("ahe ")
    assert prompt_ids(tok, "The ") == tok.encode("he ")
    assert prompt_ids(CharTokenizer("xyz"), "The ") == []  # generate starts from id 0
    assert prompt_ids(CharTokenizer("The "), "The ") == CharTokenizer("The ").encode("The ")
    assert prompt_ids(ByteTokenizer(), "The ") == list(b"The ")


@pytest.mark.slow
def test_char_run_on_a_lowercase_corpus_finishes_with_its_sample(tmp_path):
    corpus = tmp_path / "lower.txt"
    corpus.write_text("alpha beta gamma delta epsilon\n" * 400)
    p = scaletrain(
        "train",
        *tiny_job(tmp_path, "run", "--train.sample_tokens=12"),
        f"--data.source={corpus}",
        "--data.tokenizer=char",
    )
    assert p.returncode == 0 and no_traceback(p), p.stderr[-3000:]
    sample = (tmp_path / "run" / "sample.txt").read_text()
    assert len(sample) == 12 and set(sample) <= set("alphbetgmdsion \n"), sample
    assert sorted((tmp_path / "run" / "checkpoints").glob("step_*"))  # nothing lost
