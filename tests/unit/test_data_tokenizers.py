"""Tokenizers round-trip; shards carry the per-token best loss for every tokenizer."""

from __future__ import annotations

import pytest

from scaletrain.config import DataConfig
from scaletrain.data import (
    BPETokenizer,
    ByteTokenizer,
    CharTokenizer,
    build_data,
    default_grammar,
    generate_text,
    load_tokenizer,
)

UNICODE = "héllo wörld — 漢字 🚀\n\ttabs, \x00 nul; Ωμέγα, עברית, emoji 👩‍👩‍👧"


def test_byte_round_trips_any_unicode():
    tok = ByteTokenizer()
    ids = tok.encode(UNICODE)
    assert tok.vocab_size == 256 and max(ids) < 256
    assert len(ids) == len(UNICODE.encode())
    assert tok.decode(ids) == UNICODE
    assert tok.decode(ids[:-1]).endswith("\ufffd")  # a cut character never raises


def test_char_round_trips_and_rejects_unseen(tmp_path):
    tok = CharTokenizer.train([UNICODE])
    assert tok.vocab_size == len(set(UNICODE))
    assert tok.decode(tok.encode(UNICODE)) == UNICODE
    tok.save(tmp_path)
    again = load_tokenizer("char", tmp_path)
    assert again.encode(UNICODE) == tok.encode(UNICODE)
    with pytest.raises(ValueError, match="not in this char-level vocabulary"):
        tok.encode("Z")


def test_bpe_trained_locally_round_trips_and_compresses(tmp_path):
    text = generate_text(50_000, 0)
    tok = BPETokenizer.train(iter([text]), vocab_size=400)
    assert 257 < tok.vocab_size <= 400
    ids = tok.encode(text[:5000])
    assert len(ids) < 5000 / 2  # merges learned: well under one token per byte
    assert tok.decode(ids) == text[:5000]
    assert tok.decode(tok.encode(UNICODE)) == UNICODE  # unseen characters: byte fallback
    tok.save(tmp_path)
    assert load_tokenizer("bpe", tmp_path).encode(UNICODE) == tok.encode(UNICODE)


@pytest.mark.parametrize("name", ["byte", "char", "bpe"])
def test_shards_decode_to_the_corpus_and_scale_best_loss(tmp_path, name):
    cfg = DataConfig(num_tokens=20_000, tokenizer=name, bpe_vocab_size=300, cache_dir=str(tmp_path))
    with build_data(cfg, seq_len=16, micro_batch=2) as bundle:
        shards = bundle._shards
        text = bundle.tokenizer.decode(list(shards.train) + list(shards.val))
        assert text == generate_text(20_000, cfg.seed)
        assert shards.train.dtype.name == "uint16"
        per_byte = default_grammar().entropy_per_byte()
        expected = per_byte * 20_000 / (bundle.num_train_tokens + bundle.num_val_tokens)
        assert bundle.best_loss_nats == pytest.approx(expected)
        assert bundle.num_val_tokens == int(
            0.05 * (bundle.num_train_tokens + bundle.num_val_tokens)
        )
        assert "best loss" in bundle.describe() and name in bundle.describe()


@pytest.mark.parametrize("kind", ["byte", "char", "bpe"])
def test_hf_tokenizer_files_give_our_ids_in_transformers(tmp_path, kind):
    """The run directory's and the HF export's tokenizer.json: transformers' AutoTokenizer
    encodes and decodes exactly as the tokenizer the model was trained with."""
    from scaletrain.data import save_hf_tokenizer

    transformers = pytest.importorskip("transformers")
    tok = {
        "byte": ByteTokenizer,
        "char": lambda: CharTokenizer.train([UNICODE]),
        "bpe": lambda: BPETokenizer.train(iter([UNICODE * 20]), vocab_size=300),
    }[kind]()
    save_hf_tokenizer(tok, tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ids = theirs.encode(UNICODE, add_special_tokens=False)
    assert ids == tok.encode(UNICODE)
    assert theirs.decode(ids) == UNICODE
    if kind == "bpe":
        assert theirs.eos_token == BPETokenizer.SPECIAL


def test_pretrained_tokenizer_files_are_copied_as_the_user_wrote_them(tmp_path):
    """A pretrained tokenizer goes into the export as its own tokenizer.json and
    tokenizer_config.json (special tokens, chat template untouched)."""
    import json

    from scaletrain.data import save_hf_tokenizer
    from scaletrain.data.pretrained import PretrainedTokenizer

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir(), out.mkdir()
    BPETokenizer.train(iter([UNICODE * 20]), vocab_size=300).hf_tokenizer().save(
        str(src / "tokenizer.json")
    )
    conf = {"eos_token": "<|endoftext|>", "chat_template": "{{ messages }}"}
    (src / "tokenizer_config.json").write_text(json.dumps(conf))
    save_hf_tokenizer(PretrainedTokenizer(src / "tokenizer.json"), out)
    assert json.loads((out / "tokenizer_config.json").read_text()) == conf
    assert (out / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
