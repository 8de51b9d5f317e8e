"""`data.source` syntax: files, directories, globs and weighted mixtures (pure Python).

    data.source = "corpus.jsonl"                         # one file
    data.source = "books/"                               # every supported file below a folder
    data.source = "web/*.jsonl.gz"                       # a glob (`**` recurses)
    data.source = "web/*.jsonl.gz@0.7, books/@0.3"       # a mixture: weight after `@`
    data.source = "web=crawl/*.ds@0.7, books=b/@0.3"     # named components (else from the path)

Supported files: `.txt` (one document per file), `.jsonl` / `.jsonl.gz` (one document per line,
the text in `data.text_field`), `.parquet` and `.arrow` (the `data.text_field` column; needs
pyarrow; a Hugging Face `datasets` directory written by `save_to_disk` is a folder of `.arrow`
shards, `data-00000-of-0000N.arrow`, read in name order) and
`.bin` (pre-tokenized flat ids as nanoGPT writes them, `data.token_dtype`, used as they are).
A `.bin` beside a `.idx` of the same name is a Megatron-LM indexed dataset (its documents kept:
`scaletrain.data.megatron`); such a dataset may also be named by its prefix, as Megatron's
`--data-path` names it (`data.source = "tok/corpus_text_document"`). A `.ds` file beside its
`.ds.index` is datatrove's tokenized output (`scaletrain.data.datatrove`).
A file named directly with another suffix is read as plain text.
A mixture's weights are the shares of training tokens each entry contributes (see
`scaletrain.data.corpus`); each component's validation part is also scored on its own
(`val_loss/<name>`, the name given before `=` or taken from the path).

`data.eval_sources` names held-out sets, each evaluated on its own (loss and perplexity):

    data.eval_sources = "wiki=eval/wiki.jsonl, code=eval/code/"   # name=file|folder|glob
"""

from __future__ import annotations

import glob
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ._errors import ConfigError
from .hub import local_path
from .user_files import MiB, read_user_file

__all__ = [
    "SourceEntry",
    "parse_sources",
    "SUFFIXES",
    "resolve_tokenizer_file",
    "pretrained_vocab_size",
    "EvalSource",
    "parse_eval_sources",
]

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".parquet", ".arrow", ".bin", ".ds")
_FIELD = "data.source"
_EVAL_NAME = re.compile(r"[A-Za-z0-9_.-]+")
"""A metric-safe name: of an eval source, or of a mixture component."""


@dataclass(frozen=True)
class SourceEntry:
    """One entry of `data.source`: its text, weight and the files it names (sorted)."""

    pattern: str
    weight: float
    files: tuple[Path, ...]
    name: str = ""
    """The component's name in metrics (`val_loss/<name>`): given as `name=path@w`, else
    taken from the path (`_default_name`)."""


def _supported(path: Path) -> bool:
    return path.name.endswith(SUFFIXES)


def _expand(pattern: str, field: str = _FIELD) -> tuple[Path, ...]:
    if any(c in pattern for c in "*?["):
        found = [Path(p) for p in sorted(glob.glob(pattern, recursive=True))]
        files = [p for p in found if p.is_file() and _supported(p)]
        if not files:
            raise ConfigError(field, pattern, f"the glob matches no {'/'.join(SUFFIXES)} file")
        return tuple(files)
    path = Path(pattern)
    megatron = Path(pattern + ".bin")
    if not path.exists() and megatron.is_file() and Path(pattern + ".idx").is_file():
        return (megatron,)  # a Megatron dataset named by its prefix
    if path.is_dir():
        # an empty folder is reported by the size check ("no text found"), with the numbers
        return tuple(sorted(p for p in path.rglob("*") if p.is_file() and _supported(p)))
    if not path.is_file():
        fix = (
            "give 'grammar', a file, a folder, a glob, or a mixture 'a.jsonl@0.7, b/@0.3'"
            if field == _FIELD
            else "give name=file, name=folder or name=glob entries"
        )
        what = (
            "not a regular file (a pipe, device or socket cannot be read as a corpus)"
            if path.exists()
            else "no such file or folder"
        )
        raise ConfigError(field, pattern, f"{what}: {fix}")
    return (path,)  # a named file of another suffix is read as plain text


def _default_name(pattern: str) -> str:
    """A metric-safe name for a mixture component from its path: the last component without
    glob characters, its suffixes dropped ('web/*.jsonl.gz' -> 'web', 'books/' -> 'books',
    'tok/corpus_text_document' -> 'corpus_text_document')."""
    for piece in reversed(Path(pattern).parts):
        if not any(c in piece for c in "*?["):
            stem = piece.split(".")[0] if not piece.startswith(".") else piece
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_")
            if name:
                return name
    return "source"


def _named(part: str) -> tuple[str, str]:
    """('name', 'path@w') of a `name=path@w` entry; ('', part) when the text before '=' is not
    a name or the whole entry is an existing path holding '='."""
    name, sep, rest = part.partition("=")
    head, at, _ = part.rpartition("@")
    whole = Path((head if at else part).strip())  # the entry read as one path
    if sep and _EVAL_NAME.fullmatch(name.strip()) and not whole.exists():
        return name.strip(), rest.strip()
    return "", part


def parse_sources(spec: str) -> list[SourceEntry]:
    """The entries of a non-grammar `data.source` (weights default to 1; all checked > 0;
    names unique: a repeated default name gets its entry's position appended)."""
    entries: list[SourceEntry] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, part = _named(part)
        pattern, weight = part, 1.0
        head, sep, tail = part.rpartition("@")
        if sep:
            try:
                pattern, weight = head.strip(), float(tail)
            except ValueError:
                pattern = part  # an '@' inside a path, not a weight
        if not weight > 0:
            raise ConfigError(_FIELD, part, "a mixture weight must be a positive number")
        if name and any(e.name == name for e in entries):
            raise ConfigError(
                _FIELD, part, f"the name {name!r} is used twice: give each component its own"
            )
        entries.append(SourceEntry(pattern, weight, _expand(pattern), name))
    if not entries:
        raise ConfigError(_FIELD, spec, "give 'grammar', a file, a folder or a glob")
    taken = {e.name for e in entries if e.name}
    out = []
    for i, e in enumerate(entries):
        if not e.name:
            name = _default_name(e.pattern)
            name = name if name not in taken else f"{name}-{i}"
            taken.add(name)
            e = SourceEntry(e.pattern, e.weight, e.files, name)
        out.append(e)
    return out


_EVAL_FIELD = "data.eval_sources"


@dataclass(frozen=True)
class EvalSource:
    """One held-out set of `data.eval_sources`: its name (in metric names: `val_loss/<name>`,
    `ppl/<name>`), its text and the files it names (sorted)."""

    name: str
    pattern: str
    files: tuple[Path, ...]


def parse_eval_sources(spec: str) -> list[EvalSource]:
    """The entries of `data.eval_sources` ('' = none): names unique and metric-safe, every
    entry naming at least one existing, non-empty file."""
    out: list[EvalSource] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, pattern = (x.strip() for x in part.partition("="))
        if not sep or not pattern:
            raise ConfigError(
                _EVAL_FIELD,
                part,
                "write each entry as name=path (a file, folder "
                "or glob), e.g. 'wiki=eval/wiki.jsonl, code=eval/code/'",
            )
        if not _EVAL_NAME.fullmatch(name):
            raise ConfigError(
                _EVAL_FIELD,
                part,
                f"the name {name!r} must be letters, digits, "
                "'_', '-' or '.' (it becomes the metric val_loss/<name>)",
            )
        if any(e.name == name for e in out):
            raise ConfigError(
                _EVAL_FIELD,
                part,
                f"the name {name!r} is used twice: give each eval source its own name",
            )
        files = _expand(pattern, _EVAL_FIELD)
        if not files:
            raise ConfigError(
                _EVAL_FIELD,
                part,
                f"the folder holds no {'/'.join(SUFFIXES)} file: give held-out text to evaluate on",
            )
        if sum(f.stat().st_size for f in files) == 0:
            raise ConfigError(
                _EVAL_FIELD, part, "empty (0 bytes): give held-out text to evaluate on"
            )
        out.append(EvalSource(name, pattern, files))
    if spec.strip() and not out:
        raise ConfigError(_EVAL_FIELD, spec, "give name=path entries, or '' for none")
    return out


def resolve_tokenizer_file(spec: str) -> Path:
    """The tokenizer.json a `data.tokenizer` path names (the file, or one in the directory;
    a hub id: its snapshot directory in the local Hugging Face cache)."""
    path = local_path(spec, "data.tokenizer")
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(
            "data.tokenizer",
            spec,
            "give byte, char, bpe, a tokenizer.json file or a directory (or a cached hub "
            "model) holding one",
        )
    return path


def pretrained_vocab_size(spec: str) -> int:
    """Ids the tokenizer can emit (base vocabulary plus added tokens), read from the JSON alone
    so configuration checks need no tokenizer library."""
    path = resolve_tokenizer_file(spec)
    try:
        text = read_user_file(
            path, "data.tokenizer", what="a tokenizer.json", max_bytes=256 * MiB
        ).decode("utf-8")
        raw = json.loads(text)
        ids = (
            list(raw["model"]["vocab"].values())
            if isinstance(raw["model"].get("vocab"), dict)
            else []
        )
        if isinstance(raw["model"].get("vocab"), list):  # Unigram: [[piece, score], ...]
            ids = [len(raw["model"]["vocab"]) - 1]
        ids += [t["id"] for t in raw.get("added_tokens") or []]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError("data.tokenizer", str(path), f"give a valid tokenizer.json ({e})") from e
    return max(ids) + 1 if ids else 0
