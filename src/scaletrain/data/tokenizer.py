"""Tokenizers: byte-level (256 ids), char-level (the corpus' characters), BPE (trained locally).

All three are lossless on the text they accept: byte-level and BPE (byte-level pre-tokenization)
on any string, char-level on strings made of the characters it was built from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Tokenizer",
    "ByteTokenizer",
    "CharTokenizer",
    "BPETokenizer",
    "load_tokenizer",
    "save_hf_tokenizer",
]


@runtime_checkable
class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def save(self, directory: Path) -> None: ...

    def hf_tokenizer(self) -> Any:
        """The same mapping as a `tokenizers.Tokenizer` (ids identical on every string the
        tokenizer accepts), for the run directory and the Hugging Face export."""
        ...


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

    def hf_tokenizer(self) -> Any:
        # byte-level BPE with no merges: GPT-2's byte->symbol map, each symbol's id its byte
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers

        tok = HFTokenizer(models.BPE(vocab={s: b for b, s in _byte_symbols().items()}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        return tok


def _byte_symbols() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-symbol map (the one `tokenizers`' ByteLevel
    pre-tokenizer applies): printable Latin-1 bytes stand for themselves, the other 68 bytes
    map to U+0100 onwards in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    rest = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(0x100 + i) for i, b in enumerate(rest)}}


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
            raise ValueError(
                f"character {e.args[0]!r} is not in this char-level vocabulary "
                f"({self.vocab_size} characters)"
            ) from None

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def save(self, directory: Path) -> None:
        (directory / self._FILE).write_text(json.dumps(self.chars, ensure_ascii=False))

    def hf_tokenizer(self) -> Any:
        # one word per character (the split isolates every character, newlines included)
        from tokenizers import Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        tok = HFTokenizer(models.WordLevel(vocab=dict(self._index), unk_token=self.chars[0]))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        return tok

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

    def hf_tokenizer(self) -> Any:
        return self._tok


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
            vocab_size=vocab_size,
            special_tokens=[cls.SPECIAL],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
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


def save_hf_tokenizer(tok: Tokenizer, directory: Path) -> None:
    """`tokenizer.json` and `tokenizer_config.json` in `directory`, loadable by transformers'
    `AutoTokenizer.from_pretrained(directory)` with the ids this tokenizer gives. The end-of-text
    token (BPE, pretrained) is named as `eos_token`; the data pipeline adds BOS/EOS itself, so
    the tokenizer adds no special tokens."""
    if tok.name == "pretrained":
        tok.save(directory)  # the user's own files: special tokens, chat template as written
        if (directory / "tokenizer_config.json").is_file():
            return
    hf = tok.hf_tokenizer()
    hf.save(str(directory / "tokenizer.json"))
    conf: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1 << 30,
        "clean_up_tokenization_spaces": False,
    }
    for key in ("eos", "bos"):
        tid = getattr(tok, f"{key}_id", None)
        if tid is not None:
            conf[f"{key}_token"] = hf.id_to_token(tid)
    (directory / "tokenizer_config.json").write_text(json.dumps(conf, indent=2) + "\n")
