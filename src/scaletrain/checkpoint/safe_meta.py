"""DCP's `.metadata` index read through a restricted unpickler: nothing loaded can run code.

torch.distributed.checkpoint stores its index (which tensor lives in which shard, at which
offsets) as a pickle, and `FileSystemReader.read_metadata` reads it with `pickle.load`, which
calls any importable callable the file names. A checkpoint directory is data someone else may
have written (a shared run directory, a downloaded run), and the manifest's checksums do not
help: whoever writes the `.metadata` also writes the manifest. `SafeFileSystemReader` refuses
every global except the few classes DCP itself pickles into the index (found by reading the
globals of a real torch 2.13 checkpoint's index: its dataclasses, `torch.Size`, dtypes, the
layout helper and `pathlib` paths). Every load path passes it as DCP's `storage_reader`.

The allowed classes still carry data that decides what is read: each shard's
`_StorageInfo.relative_path`, which DCP joins to the checkpoint directory. An absolute path or
`..` there would make a load read any local file (an audit resumed a run from a file outside the
checkpoint this way), so `SafeFileSystemReader` also refuses an index whose shards name anything
but a plain file of the checkpoint directory, and, where the directory has a manifest, one that
the manifest does not list (the manifest's checksums then cover every byte a load reads).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

__all__ = [
    "SafeFileSystemReader",
    "UnsafeMetadataError",
    "ALLOWED_GLOBALS",
    "check_storage_paths",
    "safe_load_metadata",
]

_DCP_META = "torch.distributed.checkpoint.metadata"
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        (_DCP_META, "Metadata"),
        (_DCP_META, "MetadataIndex"),
        (_DCP_META, "StorageMeta"),
        (_DCP_META, "ChunkStorageMetadata"),
        (_DCP_META, "TensorStorageMetadata"),
        (_DCP_META, "BytesStorageMetadata"),
        (_DCP_META, "TensorProperties"),
        (_DCP_META, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        # takes a layout's name and looks it up among torch's layouts (no other effect)
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "PureWindowsPath"),
        ("pathlib", "Path"),
        ("collections", "OrderedDict"),
    }
)
"""(module, name) pairs the index may name. torch dtypes (`torch.float32`, ...) are allowed
separately: any `torch.<name>` that is a `torch.dtype` instance (a value, not a callable)."""


class UnsafeMetadataError(pickle.UnpicklingError):
    """The index names a global outside the allowlist (or is not a pickle of DCP's Metadata)."""


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeMetadataError(
            f"it names {module}.{name}, which is not one of DCP's metadata classes"
        )


def safe_load_metadata(path: str | Path) -> Metadata:
    """Unpickle a DCP `.metadata` file allowing DCP's own classes only.

    Raises `UnsafeMetadataError` (naming the file and the refused global) on anything else.
    """
    try:
        with open(path, "rb") as f:
            meta = _Restricted(f).load()
    except UnsafeMetadataError as e:
        raise UnsafeMetadataError(
            f"{path} was not loaded: {e}; a checkpoint index holds only "
            "DCP's metadata, so this file was not written by DCP "
            "(delete the checkpoint or resume from another)"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise UnsafeMetadataError(
            f"{path} is not a readable DCP index ({type(e).__name__}: "
            f"{e}); delete the checkpoint or resume from another"
        ) from None
    if not isinstance(meta, Metadata):
        raise UnsafeMetadataError(
            f"{path} holds a {type(meta).__name__}, not DCP's Metadata; "
            "delete the checkpoint or resume from another"
        )
    return meta


def _manifest_files(directory: Path) -> set[str] | None:
    """The file names `directory`'s manifest.json lists (None without a readable one: the
    manifest's own checks, `manifest.verify_checkpoint`, report that before a load)."""
    try:
        doc = json.loads((directory / "manifest.json").read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    files = doc.get("files") if isinstance(doc, dict) else None
    return {str(name) for name in files} if isinstance(files, dict) else None


def check_storage_paths(metadata: Metadata, directory: str | Path) -> None:
    """Every shard file the index names is a plain file name inside `directory` (no absolute
    path, no separator, no `.`/`..`) and, where `directory` has a manifest, one it lists."""
    directory = Path(directory)
    listed = _manifest_files(directory)
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        name = str(getattr(info, "relative_path", ""))
        if not name or name in (".", "..") or Path(name).name != name or "\\" in name:
            raise UnsafeMetadataError(
                f"{directory / '.metadata'} was not loaded: it points a shard at {name[:200]!r}, "
                "outside the checkpoint directory; delete the checkpoint or resume from another"
            )
        if listed is not None and name not in listed:
            raise UnsafeMetadataError(
                f"{directory / '.metadata'} was not loaded: its shard file {name!r} is not "
                "listed (nor checksummed) in manifest.json; delete the checkpoint or resume "
                "from another"
            )


class SafeFileSystemReader(FileSystemReader):
    """`FileSystemReader` whose `read_metadata` uses `safe_load_metadata` and
    `check_storage_paths` (same result otherwise: the storage meta and load id DCP's own
    reader sets)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        metadata = safe_load_metadata(str(path))
        check_storage_paths(metadata, Path(str(path)).parent)
        storage = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage.load_id = self.load_id
        metadata.storage_meta = storage
        return metadata
