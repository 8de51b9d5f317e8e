"""A published checkpoint's manifest check: every file listed with its size and sha256, the
step matching the directory's name (`verify_checkpoint`), and the newest checkpoint that
passes it (`latest_good`). What writes the manifest and publishes the directory: `dcp.py`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

__all__ = ["list_checkpoints", "verify_checkpoint", "latest_good"]

_PREFIX = "step_"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Published checkpoints, oldest first."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))


_REQUIRED = (".metadata", "trainer_state.json", "extra_rank0.pt")
"""Files every published checkpoint holds (DCP's index, rank 0's state and extras)."""


def verify_checkpoint(path: Path) -> str | None:
    """None if the checkpoint is complete and intact, else the reason it is not (one line).

    The manifest must be a JSON object whose `step` matches the directory's name and whose
    `files` list every required file by a plain name with its size and sha256; each listed file
    must exist with that size and checksum."""
    manifest = path / "manifest.json"
    if not manifest.is_file():
        return "no manifest.json (the write did not finish)"
    try:
        doc = json.loads(manifest.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"unreadable manifest.json ({type(e).__name__}: {' '.join(str(e).split())})"
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return "manifest.json has no 'files' object"
    step = doc.get("step")
    if (
        path.name.startswith(_PREFIX)
        and path.name[len(_PREFIX) :].isdigit()
        and (isinstance(step, bool) or step != int(path.name[len(_PREFIX) :]))
    ):
        return f"manifest.json says step {step!r}, the directory is {path.name}"
    for name in _REQUIRED:
        if name not in files:
            return f"manifest.json does not list {name}"
    for name, rec in files.items():
        if not isinstance(name, str) or Path(name).name != name or name in (".", ".."):
            return f"manifest.json lists {name!r}, not a file of this directory"
        if not (
            isinstance(rec, dict)
            and isinstance(rec.get("size"), int)
            and isinstance(rec.get("sha256"), str)
        ):
            return f"manifest.json entry for {name} lacks an integer size and a sha256"
        f = path / name
        if not f.is_file():
            return f"missing file {name}"
        if f.stat().st_size != rec["size"]:
            return f"{name} has {f.stat().st_size} bytes, manifest says {rec['size']}"
        if _sha256(f) != rec["sha256"]:
            return f"{name} checksum mismatch (corrupted)"
    return None


def latest_good(ckpt_dir: str | Path, *, log: Any = print) -> Path | None:
    """Newest checkpoint that verifies; torn or corrupted ones are reported and skipped."""
    for path in reversed(list_checkpoints(ckpt_dir)):
        reason = verify_checkpoint(path)
        if reason is None:
            return path
        log(f"checkpoint {path} is unusable: {reason}; trying the previous one")
    return None
