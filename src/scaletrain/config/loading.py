"""Loading a JobConfig: a TOML file plus `--section.key=value` overrides (later wins), every
value parsed strictly as its field's declared type (`strict.coerce`) and every unknown
section or field named with a did-you-mean."""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any

from ._errors import ConfigError, require
from .job import SECTIONS, JobConfig
from .model import MODEL_FIELDS, ModelConfig, resolve_model
from .strict import coerce, did_you_mean, scalar_type
from .user_files import read_user_file

__all__ = [
    "load_config",
    "parse_overrides",
    "read_toml",
    "read_hardware_file",
    "split_overrides",
]


def _coerce(section: str, key: str, value: Any, typ: Any) -> Any:
    """Convert a TOML or command-line value to the field's declared type (strictly)."""
    return coerce(f"{section}.{key}", value, typ)


def _build(cls: type, section: str, values: dict[str, Any]) -> Any:
    known = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)  # resolves the postponed annotations, no eval of input
    for k in values:
        if k not in known:
            raise ConfigError(
                f"{section}.{k}",
                values[k],
                f"unknown field{did_you_mean(k, known)}; valid fields are {', '.join(known)}",
            )
    kwargs = {k: _coerce(section, k, v, hints[k]) for k, v in values.items()}
    return cls(**kwargs)


def _no_quoted_scalars(raw: dict[str, Any], path: Path) -> None:
    """TOML has types: a quoted "8" for a number or "true" for a boolean is a string, refused
    (command-line overrides are text and parsed instead)."""
    for section, values in raw.items():
        cls = ModelConfig if section == "model" else SECTIONS.get(section)
        if cls is None or not isinstance(values, dict):
            continue  # named by load_config's own checks
        hints = typing.get_type_hints(cls)
        for k, v in values.items():
            typ = scalar_type(hints.get(k))
            if typ in (int, float, bool) and isinstance(v, str):
                raise ConfigError(
                    f"{section}.{k}",
                    v,
                    f"{path.name} gives a string where a {typ.__name__} belongs: "
                    f"write it without quotes",
                )


def _is_override_key(arg: str) -> bool:
    return arg.startswith("--") and "." in arg.split("=")[0]


def _rejoin_split_lists(argv: list[str]) -> list[str]:
    """Put back together an override list the shell split at its spaces.

    `--data.source=a.jsonl@0.7, b/@0.3` typed without quotes reaches us as two arguments,
    `--data.source=a.jsonl@0.7,` and `b/@0.3`; the second was then taken for the config file.
    An override value that ends with a comma (or an argument after it that starts with one)
    continues in the next argument, unless that argument is a flag (`-...`) or a `.toml` file.
    The pieces are joined with a space, which every list syntax strips."""
    out: list[str] = []
    value_of_override = False  # is out[-1] an override's value (or `--s.k=value`)?
    for arg in argv:
        prev = out[-1] if out else ""
        if (
            value_of_override
            and (prev.endswith(",") or arg.startswith(","))
            and not arg.startswith("-")
            and not arg.endswith(".toml")
        ):
            out[-1] = f"{prev} {arg}"
            continue
        # `--s.k=v` carries its value; `--s.k` is followed by it
        value_of_override = ("=" in arg and _is_override_key(arg)) or (
            _is_override_key(prev) and "=" not in prev and not arg.startswith("-")
        )
        out.append(arg)
    return out


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the other arguments, the `--section.key[=]value` overrides) of a command line, each in
    its order, split lists joined back (`_rejoin_split_lists`).

    The overrides are taken out before argparse sees the line: argparse reads an argument
    holding a space as a positional, so `--data.source="a@0.7, b@0.3"` became the config file."""
    rest: list[str] = []
    overrides: list[str] = []
    args = _rejoin_split_lists(argv)
    i = 0
    while i < len(args):
        if _is_override_key(args[i]):
            take = 1 if "=" in args[i] else 2  # `--s.k value`: the value follows
            overrides += args[i : i + take]
            i += take
        else:
            rest.append(args[i])
            i += 1
    return rest, overrides


def parse_overrides(args: list[str]) -> dict[str, dict[str, str]]:
    """['--train.steps=10', '--model.name', 'tiny'] -> {'train': {'steps': '10'}, ...}.

    A list value the shell split at a space after a comma is joined back first
    (`_rejoin_split_lists`)."""
    args = _rejoin_split_lists(args)
    out: dict[str, dict[str, str]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not _is_override_key(arg):
            raise ConfigError("override", arg, "write overrides as --section.key=value")
        if "=" in arg:
            key, value = arg[2:].split("=", 1)
        else:
            if i + 1 >= len(args):
                raise ConfigError("override", arg, "give a value: --section.key=value")
            key, value = arg[2:], args[i + 1]
            i += 1
        section, name = key.split(".", 1)
        if not section or not name:
            raise ConfigError("override", arg, "write overrides as --section.key=value")
        out.setdefault(section, {})[name] = value
        i += 1
    return out


def read_toml(p: Path) -> dict[str, Any]:
    """The tables of the TOML job file `p`, or one ConfigError naming the file: missing, not a
    regular file, too large, not UTF-8, or not TOML."""
    require(p.is_file(), "config", str(p), "give the path of an existing .toml file")
    data = read_user_file(p, "config", what="a .toml job file")
    try:
        return tomllib.loads(data.decode("utf-8-sig"))  # (a BOM is harmless)
    except UnicodeDecodeError as e:
        raise ConfigError(
            "config",
            str(p),
            f"byte {e.start} is not UTF-8 ({e.reason}): save the file as UTF-8",
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", str(p), f"fix the TOML syntax: {e}") from e


def read_hardware_file(path: str | Path) -> dict[str, Any]:
    """The `[hardware]` table of a hardware file (`plan --hardware FILE.toml`): a device
    described in TOML (`config.hardware_toml`) or a preset's figures changed. Only that table
    may be there; its values are checked like a job file's (`_no_quoted_scalars`) and, once
    merged into the job, like every `[hardware]` field."""
    p = Path(path)
    raw = read_toml(p)
    hardware = raw.get("hardware")
    others = [k for k in raw if k != "hardware"]
    if others or not isinstance(hardware, dict):
        fields = {f.name for f in dataclasses.fields(SECTIONS["hardware"])}
        hint = (
            "put the figures under a [hardware] table"
            if any(k in fields for k in others) or not others
            else f"it holds {', '.join(repr(k) for k in others)}: a hardware file holds one "
            "[hardware] table (the job's other sections go in its --config file)"
        )
        raise ConfigError("--hardware", str(p), hint)
    _no_quoted_scalars({"hardware": hardware}, p)
    return dict(hardware)


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, dict[str, Any]] | list[str] | None = None,
    *,
    extend_rope: list[tuple[str, int, str]] | None = None,
) -> JobConfig:
    """Build a validated JobConfig from an optional TOML file plus overrides (later wins).

    `extend_rope` (plan, explain, dryrun): a RoPE model asked for a sequence longer than its
    `max_seq_len` (and not given one) is planned with its context raised to that sequence, and
    (field, value, why) saying so is appended to the list; `train` passes none and refuses
    (`JobConfig`). Learned positions cannot be extended: their table has max_seq_len rows."""
    raw: dict[str, dict[str, Any]] = {}
    if path is not None:
        p = Path(path)
        raw = read_toml(p)
        _no_quoted_scalars(raw, p)
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    for section, values in (overrides or {}).items():
        raw.setdefault(section, {}).update(values)
    for section, values in raw.items():
        if section not in (*SECTIONS, "model"):
            raise ConfigError(
                section,
                "...",
                f"unknown section"
                f"{did_you_mean(section, ('model', *SECTIONS))}; valid sections "
                f"are model, {', '.join(SECTIONS)}",
            )
        if not isinstance(values, dict):
            raise ConfigError(section, values, "a section must be a TOML table [section]")
    model_raw = dict(raw.get("model", {}))
    # a Hugging Face init directory brings its own architecture (config.json)
    init_from = str(raw.get("checkpoint", {}).get("init_from", "") or "")
    name = coerce("model.name", model_raw.pop("name", init_from or "gpt-mini"), str)
    for k in model_raw:
        if k not in MODEL_FIELDS:
            raise ConfigError(
                f"model.{k}",
                model_raw[k],
                f"unknown field{did_you_mean(k, MODEL_FIELDS)}; valid fields are "
                f"{', '.join(MODEL_FIELDS)}",
            )
    mhints = typing.get_type_hints(ModelConfig)
    model_kw = {k: _coerce("model", k, v, mhints[k]) for k, v in model_raw.items()}
    sections = {s: _build(cls, s, raw.get(s, {})) for s, cls in SECTIONS.items()}
    model = resolve_model(name, **model_kw)
    seq = sections["batch"].seq_len
    extend = extend_rope is not None and "max_seq_len" not in model_kw
    if extend and seq > model.max_seq_len and model.position == "rope":
        assert extend_rope is not None
        extend_rope.append(
            (
                "model.max_seq_len",
                seq,
                f"batch.seq_len {seq} is beyond {model.name}'s {model.max_seq_len}-token "
                "context; RoPE positions extend without new parameters, planned as the model "
                "would run them unscaled; train at it by setting model.max_seq_len",
            )
        )
        model = dataclasses.replace(model, max_seq_len=seq)
    return JobConfig(model=model, **sections)
