"""Strict parsing of one config value, and did-you-mean suggestions for unknown names.

TOML and the command line both reach a field through `coerce`: a value of the wrong kind is a
`ConfigError` naming the field, never a silent conversion (TOML's `steps = true` once trained
one step and `run_dir = [1, 2]` created a directory named "[1, 2]"). Every float must be
finite: `inf`, `nan` and `1e999` (which Python reads as inf) are refused at parse time instead
of ending a run late or silently.
"""

from __future__ import annotations

import difflib
import math
import types
from typing import Any

from ._errors import ConfigError, choice
from .choices import literal_names

__all__ = ["coerce", "did_you_mean", "scalar_type"]

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def did_you_mean(name: str, options: Any) -> str:
    """' (did you mean X?)' for the closest of `options`, or '' when none is close."""
    opts = {str(o).lower(): str(o) for o in options}  # case-insensitive: --TRAIN.steps
    key = str(name).lower()
    # a family name first: 'h100' -> 'h100-sxm' or 'h100-pcie', not the nearest string 'h200'
    family = [o for k, o in opts.items() if key and k != key and k.startswith(key)]
    if 1 <= len(family) <= 4:
        return f" (did you mean {' or '.join(repr(o) for o in family)}?)"
    close = difflib.get_close_matches(key, list(opts), n=1, cutoff=0.6)
    return f" (did you mean {opts[close[0]]!r}?)" if close else ""


_INT64 = 2**63


def _int(value: Any) -> int:
    out = _int_any(value)
    if not -_INT64 <= out < _INT64:  # every count must fit torch's and numpy's int64
        raise ValueError(value)
    return out


def _int_any(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("a boolean is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        if not value.isascii():  # Python's int() reads '٣' (Arabic-Indic three) as 3
            raise ValueError(value)
        try:
            return int(value)
        except ValueError:
            value = float(value)  # '1e3' is an integer written as a float
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    raise ValueError(value)


def _float(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float | str)
        or (isinstance(value, str) and not value.isascii())
    ):
        raise ValueError(value)
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(value)
    return out


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in (*_TRUE, *_FALSE):
        return value.lower() in _TRUE
    raise ValueError(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(value)
    return value


_PARSERS = {
    int: (_int, "an integer (not a boolean or a fraction)"),
    float: (_float, "a finite number (not inf, nan or beyond 1.8e308)"),
    bool: (_bool, "true or false"),
    str: (_str, "a string"),
}


def _not_none(typ: Any) -> Any:
    if isinstance(typ, types.UnionType):
        return next(t for t in typ.__args__ if t is not type(None))
    return typ


def scalar_type(typ: Any) -> Any:
    """The type a value of annotation `typ` is parsed as: `X | None` -> X, and a Literal
    alias (`config.choices`) -> the type of its names (`Literal[0, 1]` -> int)."""
    typ = _not_none(typ)
    options = literal_names(typ)
    return typ if options is None else type(options[0])


def coerce(name: str, value: Any, typ: Any) -> Any:
    """`value` (from TOML or the command line) as the field's declared type, or ConfigError;
    a Literal-typed field's value must also be one of the alias's names."""
    base = scalar_type(typ)
    if base not in _PARSERS:
        return value
    parse, expected = _PARSERS[base]
    try:
        out = parse(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(name, value, f"expected {expected}") from None
    options = literal_names(_not_none(typ))
    if options is not None:
        choice(name, out, options)
    return out
