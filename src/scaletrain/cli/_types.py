"""argparse `type=` callables shared by the commands' numeric flags (no torch)."""

from __future__ import annotations

import argparse
import json
import math
import re

from scaletrain.config import ConfigError

__all__ = ["finite_float", "given_numbers", "check_finite_output", "finite_json"]


def finite_float(text: str) -> float:
    """A float flag's value: a finite number. 'inf', 'nan' and overflowing literals such as
    '1e999' are refused here, so argparse prints one line naming the flag, before any work
    (every formula downstream assumes finite inputs; inf/nan would print as a result)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a finite number: give one such as 1.5 or 7e9"
        )
    return value


def given_numbers(args: argparse.Namespace) -> str:
    """The numeric flags as parsed (`--name=value ...`), for an error about their magnitudes."""
    return " ".join(
        f"--{k.replace('_', '-')}={v:g}"
        for k, v in vars(args).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    )


_NOT_FINITE = re.compile(r"(?<![\w.])-?(inf|nan)(?![\w])")
"""A number printed as inf or nan (`f"{x:g}"` of an overflow), not a word such as 'financing'."""


def check_finite_output(text: str, command: str, args: argparse.Namespace) -> None:
    """Refuse a report that would print inf or nan: finite flags whose arithmetic overflowed
    (e.g. --pue=1e308), one line naming the numeric flags, instead of a silent 'inf' result."""
    if _NOT_FINITE.search(text):
        raise ConfigError(
            command,
            given_numbers(args),
            "a result is not finite (inf or nan): give realistic magnitudes",
        )


def finite_json(obj: object, command: str, args: argparse.Namespace) -> str:
    """`obj` as JSON, refused like `check_finite_output` when a number in it is inf or nan
    (json.dumps would print the non-JSON tokens NaN/Infinity that strict parsers reject)."""
    try:
        return json.dumps(obj, indent=2, allow_nan=False)
    except ValueError:
        raise ConfigError(
            command,
            given_numbers(args),
            "a result is not finite (inf or nan), so no JSON: give realistic magnitudes",
        ) from None
