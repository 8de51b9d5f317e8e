"""A Hugging Face hub cache built on disk for tests, in the layout `huggingface_hub` writes
(`models--org--name/blobs/<hash>`, `snapshots/<commit>/<file>` links to the blobs,
`refs/main` holding the commit): what `hf download org/name` leaves behind, without a
network. huggingface_hub has no public writer for its cache apart from downloading."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def put_in_hub_cache(model_dir: Path, cache: Path, repo_id: str, *, commit: str = "") -> Path:
    """Copy every file of `model_dir` into `cache` as hub model `repo_id` (revision `main`);
    returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = commit or hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for f in sorted(model_dir.rglob("*")):
        if not f.is_file():
            continue
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / f.relative_to(model_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))  # relative, as huggingface_hub does
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)  # (no newline, as huggingface_hub writes it)
    return snapshot
