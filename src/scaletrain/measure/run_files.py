"""Reading a run directory's JSON files (config.json, measurement.json, run_info.json,
metrics.jsonl, heartbeats) for `verify`, `status` and `report`, whatever state they are in.

A run directory is written by a process that may be running, killed mid-write or from another
version, and may have been edited by hand: any file can be empty, truncated, not JSON, not
UTF-8, the wrong JSON type, a directory, or hold a field of the wrong type. The readers here
turn all of that into either one `ConfigError` naming the file (a file the command cannot do
without) or a documented fallback (a file it can do without: None, or the record skipped), so
no command shows a traceback for a damaged run directory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from scaletrain.config import ConfigError

__all__ = ["read_object", "read_records", "damage", "finite", "whole"]


def _why(path: Path) -> str | None:
    """None if `path` holds a JSON object, else what is wrong with it."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "missing"
    except IsADirectoryError:
        return "a directory, not a file"
    except UnicodeDecodeError as e:
        return f"not UTF-8 (byte {e.start})"
    except ValueError as e:
        return f"not JSON ({e})"
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    kinds = {
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }
    return (
        None
        if isinstance(value, dict)
        else f"{kinds.get(type(value), 'a value')}, not a JSON object"
    )


def read_object(path: Path, *, required: bool = False) -> dict[str, Any] | None:
    """The JSON object in `path`; when it is missing or damaged: None, or (required) one
    ConfigError naming the file and what is wrong."""
    why = _why(path)
    if why is None:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    if required:
        raise ConfigError(
            "run_dir",
            str(path),
            f"{why}: give the directory of a "
            "`scaletrain train` run whose files are intact (restore this one)",
        )
    return None


def damage(path: Path) -> str | None:
    """What is wrong with `path` if it is there but holds no JSON object (None when it is
    intact or absent): for a command that passes a damaged file over, to say so."""
    why = _why(path)
    return None if why in (None, "missing") else why


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON-object lines of a .jsonl file; a line that is not one (the line being written,
    a damaged one) is skipped; a missing or unreadable file is no records."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def finite(value: Any) -> float | None:
    """`value` as a float if it is a finite number (not a bool, a string, inf or nan)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def whole(value: Any) -> int | None:
    """`value` as an int if it is a finite whole number (1 or 1.0; not True, '1' or 1e999)."""
    v = finite(value)
    return int(v) if v is not None and v.is_integer() else None
