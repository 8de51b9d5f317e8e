"""Tokenizers: byte-level (256 ids), char-level (the corpus' characters), BPE (trained locally).

All three are lossless on the text they accept: byte-level and BPE (byte-level pre-tokenization)
on any string, char-level on strings made of the characters it was built from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["Tokenizer", "ByteTokenizer", "CharTokenizer", "BPETokenizer", "load_tokenizer"]


@runtime_checkable
class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def save(self, directory: Path) -> None: ...


class ByteTokenizer:
    """UTF-8 bytes as ids: vocab 256, lossless on any string, nothing to train or save."""

    name = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # A window cut mid-character (e.g. a generated sample) decodes with U+FFFD, never raises.
        return bytes(ids).decode("utf-8", errors="replace")

    def save(self, directory: Path) -> None:
        pass


class CharTokenizer:
    """One id per distinct character of the corpus, in code-point order (saved as chars.json)."""

    name = "char"
    _FILE = "chars.json"

    def __init__(self, chars: Iterable[str]):
        self.chars = sorted(set(chars))
        self.vocab_size = len(self.chars)
        self._index = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def train(cls, pieces: Iterable[str]) -> CharTokenizer:
        seen: set[str] = set()
        for piece in pieces:
            seen.update(piece)
        return cls(seen)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._index[c] for c in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in this char-level vocabulary "
                             f"({self.vocab_size} characters)") from None

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def save(self, directory: Path) -> None:
        (directory / self._FILE).write_text(json.dumps(self.chars, ensure_ascii=False))

    @classmethod
    def load(cls, directory: Path) -> CharTokenizer:
        return cls(json.loads((directory / cls._FILE).read_text()))


class TokenizersBacked:
    """Encode/decode through a `tokenizers.Tokenizer` held as `self._tok` (no special tokens
    added or skipped: the data pipeline places BOS/EOS itself)."""

    _tok: Any

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


class BPETokenizer(TokenizersBacked):
    """Byte-level BPE from Hugging Face `tokenizers`, trained on the corpus (saved as bpe.json).

    Byte-level pre-tokenization maps every byte to a symbol first, so any string round-trips;
    merges are learned up to `vocab_size` (256 byte symbols + one end-of-text special + merges).
    """

    name = "bpe"
    _FILE = "bpe.json"
    SPECIAL = "<|endoftext|>"

    def __init__(self, hf_tokenizer):
        self._tok = hf_tokenizer
        self.vocab_size = hf_tokenizer.get_vocab_size()
        self.eos_id = hf_tokenizer.token_to_id(self.SPECIAL)

    @classmethod
    def train(cls, pieces: Iterator[str], vocab_size: int) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[cls.SPECIAL], show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(pieces, trainer=trainer)
        return cls(tok)

    def save(self, directory: Path) -> None:
        self._tok.save(str(directory / self._FILE))

    @classmethod
    def load(cls, directory: Path) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_file(str(directory / cls._FILE)))


def load_tokenizer(name: str, directory: Path) -> Tokenizer:
    """Reload the tokenizer saved next to a set of shards."""
    if name == "byte":
        return ByteTokenizer()
    if name == "char":
        return CharTokenizer.load(directory)
    if name == "bpe":
        return BPETokenizer.load(directory)
    if name == "pretrained":
        from .pretrained import PretrainedTokenizer

        return PretrainedTokenizer.load(directory)
    raise ValueError(f"unknown tokenizer {name!r}: expected 'byte', 'char' or 'bpe'")
