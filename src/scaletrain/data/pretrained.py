"""A pretrained tokenizer: a Hugging Face `tokenizer.json` (the `tokenizers` library).

`data.tokenizer` names the file itself or a directory holding it. Beside it, an optional
`tokenizer_config.json` gives the special tokens: `bos_token`, `eos_token` (a string or an
`{"content": ...}` object, transformers' two spellings) and `add_bos_token`. Without one, the
end-of-document token is the first of the usual spellings the vocabulary contains.
Nothing here runs code from disk: both files are JSON.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from scaletrain.config import ConfigError
from scaletrain.config.sources import pretrained_vocab_size, resolve_tokenizer_file

from .tokenizer import TokenizersBacked

__all__ = ["PretrainedTokenizer", "resolve_tokenizer_file"]

_FIELD = "data.tokenizer"
_EOS_GUESSES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class PretrainedTokenizer(TokenizersBacked):
    """`tokenizers.Tokenizer.from_file` with BOS/EOS ids; saved beside the shards it made."""

    name = "pretrained"
    _FILE = "tokenizer.json"
    _CONFIG = "tokenizer_config.json"

    def __init__(self, tokenizer_file: Path):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # noqa: BLE001 - the library raises a bare Exception
            raise ConfigError(
                _FIELD, str(tokenizer_file), f"give a valid tokenizer.json ({e})"
            ) from e
        self._file = tokenizer_file
        self.vocab_size = max(
            pretrained_vocab_size(str(tokenizer_file)),
            self._tok.get_vocab_size(with_added_tokens=True),
        )
        conf_path = tokenizer_file.parent / self._CONFIG
        conf: dict[str, Any] = {}
        if conf_path.is_file():
            try:
                conf = json.loads(conf_path.read_text(encoding="utf-8"))
            except ValueError as e:  # (UnicodeDecodeError included)
                raise ConfigError(_FIELD, str(conf_path), f"fix its JSON ({e})") from e
            if not isinstance(conf, dict):
                raise ConfigError(
                    _FIELD,
                    str(conf_path),
                    f"it holds a JSON {type(conf).__name__}, not an object: fix or remove it",
                )
        self._conf_path = conf_path if conf_path.is_file() else None
        self.eos_id = self._id_of(_token_text(conf.get("eos_token")), guesses=_EOS_GUESSES)
        self.bos_id = self._id_of(_token_text(conf.get("bos_token")), guesses=())
        self.add_bos = bool(conf.get("add_bos_token", False)) and self.bos_id is not None
        self.chat_template = self._chat_template(conf, tokenizer_file.parent)

    def _chat_template(self, conf: dict[str, Any], directory: Path) -> tuple[str, str] | None:
        """(template source, where it came from): chat_template.jinja beside the tokenizer
        (transformers' newer layout) first, else tokenizer_config.json's `chat_template` (a
        string, or a list of named templates of which 'default' is used)."""
        jinja = directory / "chat_template.jinja"
        if jinja.is_file():
            try:
                return jinja.read_text(encoding="utf-8"), str(jinja)
            except UnicodeDecodeError as e:
                raise ConfigError(
                    "data.chat_template",
                    str(jinja),
                    f"not UTF-8 text (byte {e.start}): fix or remove it",
                ) from None
        value = conf.get("chat_template")
        if isinstance(value, list):
            value = next(
                (
                    t.get("template")
                    for t in value
                    if isinstance(t, dict) and t.get("name") == "default"
                ),
                None,
            )
        if value is None:
            return None
        if not isinstance(value, str):
            raise ConfigError(
                _FIELD, str(self._conf_path), "chat_template must be a string (or named templates)"
            )
        return value, f"{self._conf_path}:chat_template"

    def _id_of(self, token: str | None, *, guesses: tuple[str, ...]) -> int | None:
        for t in (token,) if token else guesses:
            tid = self._tok.token_to_id(t)
            if tid is not None:
                return int(tid)
        return None

    def save(self, directory: Path) -> None:
        shutil.copyfile(self._file, directory / self._FILE)
        if self._conf_path is not None:
            shutil.copyfile(self._conf_path, directory / self._CONFIG)
        jinja = self._file.parent / "chat_template.jinja"
        if jinja.is_file():
            shutil.copyfile(jinja, directory / jinja.name)

    @classmethod
    def load(cls, directory: Path) -> PretrainedTokenizer:
        return cls(directory / cls._FILE)
