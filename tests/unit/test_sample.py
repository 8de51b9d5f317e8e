"""Sampling draws only ids the tokenizer can decode, whatever the size of the model's head."""

from __future__ import annotations

import torch

from scaletrain.trainer.sample import generate


def _rows_past_vocab_win(vocab: int, rows: int):
    """(1, T) ids -> (1, T, rows) logits where every id at or past `vocab` is far likelier:
    an undertrained head padded past the tokenizer (nanoGPT's 65 characters over 128 rows)."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(1, x.shape[1], rows)
        logits[..., vocab:] = 10.0
        return logits

    return fn


def test_generate_never_samples_past_the_tokenizer_vocab():
    fn = _rows_past_vocab_win(vocab=5, rows=16)
    model = torch.nn.Identity()
    ids = generate(model, [0], num_tokens=64, context=8, top_k=0, logits_fn=fn, vocab=5)
    assert len(ids) == 64 and max(ids) < 5
    unrestricted = generate(model, [0], num_tokens=64, context=8, top_k=0, logits_fn=fn)
    assert max(unrestricted) >= 5  # the check above can fail: these logits favour rows >= 5
