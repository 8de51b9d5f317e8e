"""Hugging Face hub ids (`org/name`) resolved from the local Hugging Face cache, never the network.

`--model`, `checkpoint.init_from` and `data.tokenizer` take a local path or a hub id such as
`Qwen/Qwen2.5-7B`. A path that exists wins (transformers' `from_pretrained` looks at the disk
first too); a name shaped `org/name` that is not on disk is looked up in the hub cache, in
huggingface_hub's layout (`models--org--name/refs/main` holding a commit hash,
`models--org--name/snapshots/<commit>/` the files) through its own reader,
`snapshot_download(local_files_only=True)`, which makes no request. A model that is not there
is one line naming the id, the cache searched and the command that fetches it. Nothing is
downloaded at run time.

The cache is found as huggingface_hub finds it (`huggingface_hub.constants`): `HF_HUB_CACHE`,
else the legacy `HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else
`$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`. It is read from the
environment at each call rather than from `huggingface_hub.constants`, which freezes it when
the library is first imported (transformers imports it early), so the place named in an error
is the place searched.

A hub id is checked by huggingface_hub's `validate_repo_id` (letters, digits, `-_.`, no `..` or
`--`, one `/`) before it becomes a folder name, and the snapshot folder the cache's ref names
must sit directly in the repository's `snapshots/` folder: neither an id such as `org/..` nor
a tampered `refs/main` reaches outside the cache.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ._errors import ConfigError

__all__ = ["hub_cache_dir", "is_hub_id", "hub_snapshot", "local_path"]

_HUB_SHAPE = re.compile(r"[^/\\]+/[^/\\]+")
"""`org/name`: two non-empty parts, one slash (an absolute path or a deeper one is a path)."""

_COMMIT = re.compile(r"[0-9a-f]{40}")
"""A git commit hash, what huggingface_hub writes in `refs/<branch>` and names snapshots by."""


def hub_cache_dir() -> Path:
    """The hub cache huggingface_hub would use in this environment (module docstring)."""
    env = os.environ
    spec = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not spec:
        home = env.get("HF_HOME") or os.path.join(
            env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
            "huggingface",
        )
        spec = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(spec)))


def is_hub_id(spec: str) -> bool:
    """Whether `spec` names a hub model rather than a local path: shaped `org/name` and not
    on disk. (Its characters are checked when it is resolved, `hub_snapshot`.)"""
    return bool(_HUB_SHAPE.fullmatch(spec)) and not os.path.lexists(spec)


def _fetch_hint(repo_id: str, cache: Path) -> str:
    return (
        f"download it first with `hf download {repo_id} --cache-dir {cache}` "
        "(nothing is fetched at run time)"
    )


def _read_ref(ref: Path) -> str | None:
    """The commit a `refs/<branch>` file names (None: no such file; "" when unreadable, which
    the caller refuses as a damaged entry)."""
    try:
        with open(ref, "rb") as f:
            return f.read(64).decode("ascii", errors="replace")
    except FileNotFoundError:
        return None
    except OSError:  # a directory, no permission
        return ""


def hub_snapshot(repo_id: str, field: str) -> Path:
    """The local snapshot folder of hub model `repo_id` (revision `main`) in the hub cache,
    without network; one ConfigError naming `field`, the id, the cache and the fix when the id
    is not a valid hub id or the model is not (completely) in the cache."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import (
            HFValidationError,
            LocalEntryNotFoundError,
            validate_repo_id,
        )
    except ImportError:
        raise ConfigError(
            field,
            repo_id,
            "reading a hub id from the local cache needs huggingface_hub: pip install "
            "huggingface_hub (or give a local directory)",
        ) from None
    try:
        validate_repo_id(repo_id)
        valid = "/" in repo_id
    except HFValidationError:
        valid = False
    if not valid:
        raise ConfigError(
            field,
            repo_id,
            "neither an existing path nor a Hugging Face hub id (org/name of letters, digits, "
            "'-', '_', '.', without '..' or '--'): give a local path or a hub id",
        )
    cache = hub_cache_dir()
    repo_dir = cache.resolve() / ("models--" + repo_id.replace("/", "--"))
    commit = _read_ref(repo_dir / "refs" / "main")
    if commit is not None and not _COMMIT.fullmatch(commit):
        raise ConfigError(
            field,
            repo_id,
            f"{repo_dir / 'refs' / 'main'} does not hold a commit hash: the cache entry is "
            f"damaged; delete {repo_dir} and {_fetch_hint(repo_id, cache)}",
        )
    try:
        folder = Path(
            snapshot_download(repo_id, cache_dir=cache, local_files_only=True, revision="main")
        )
    except LocalEntryNotFoundError as e:
        # (IncompleteSnapshotError, newer releases, is one: a download that did not finish)
        if type(e).__name__ == "IncompleteSnapshotError":
            why = f"the snapshot of {repo_id!r} in the hub cache {cache} is incomplete"
        else:
            why = (
                f"not a local path, and no snapshot of the Hugging Face model {repo_id!r} is "
                f"in the hub cache {cache} (HF_HUB_CACHE, HF_HOME)"
            )
        raise ConfigError(field, repo_id, f"{why}: {_fetch_hint(repo_id, cache)}") from None
    # (the ref is a commit hash, so this holds; checked so no future layout reads elsewhere)
    assert Path(os.path.normpath(folder)).parent == repo_dir / "snapshots", folder
    return folder


def local_path(spec: str, field: str) -> Path:
    """`spec` as a local path: itself when it is on disk or not shaped as a hub id, else the
    snapshot folder of hub model `spec` in the local cache (`hub_snapshot`)."""
    return hub_snapshot(spec, field) if is_hub_id(spec) else Path(spec)
