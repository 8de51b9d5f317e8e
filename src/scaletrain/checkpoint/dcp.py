"""Atomic, verified checkpoints with torch.distributed.checkpoint (DCP).

Layout of a run's checkpoints:
    RUN/checkpoints/step_00000100/      published (complete) checkpoint
        *.distcp, .metadata             DCP shards (model + optimizer, sharded or not)
        extra_rank{r}.pt                per-rank non-model state: tensors and plain data only
        trainer_state.json              step, scheduler, scaler, data position, model fingerprint
        manifest.json                   size + sha256 of every file above (written last)
    RUN/checkpoints/.tmp-step_.../      in-progress write; never loaded, removed on next save

A crash at any point leaves either the old set of published checkpoints or the old set plus a
new complete one: the directory is renamed into place only after every rank has written and the
manifest is complete. `latest_good()` verifies sizes and checksums and falls back to the previous
checkpoint when the newest is torn or corrupted.

Loading never unpickles arbitrary objects: `extra_rank*.pt` is read with `weights_only=True`
(tensors, dicts, lists, numbers, strings only); JSON files are JSON. DCP's own `.metadata` index
is read by DCP itself; we only load it after its checksum matched the manifest we wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.optim import ZeroRedundancyOptimizer

__all__ = ["save_checkpoint", "load_checkpoint", "latest_good", "list_checkpoints",
           "verify_checkpoint", "CheckpointError"]

_PREFIX = "step_"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, torn, corrupted or belongs to another model."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


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


def verify_checkpoint(path: Path) -> str | None:
    """None if the checkpoint is complete and intact, else the reason it is not."""
    manifest = path / "manifest.json"
    if not manifest.is_file():
        return "no manifest.json (the write did not finish)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError) as e:
        return f"unreadable manifest ({e})"
    for name, rec in files.items():
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


def save_checkpoint(ckpt_dir: str | Path, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, *, trainer_state: dict[str, Any],
                    extra: dict[str, Any], keep_last_n: int = 2) -> Path:
    """Collectively save model + optimizer (DCP, sharded as they are) + state; publish atomically.

    `trainer_state` must be JSON-serialisable and identical on every rank (rank 0 writes it);
    `extra` is per-rank (RNG states, data position) and may hold tensors.
    """
    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / f"{_PREFIX}{step:08d}"
    tmp = ckpt_dir / f".tmp-{final.name}"
    rank = _rank()
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier()
    state = _state_dicts(model, optimizer)
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        # ZeRO-1 keeps plain local state partitions that DCP cannot address: each rank writes
        # its own partition (the partitioning is a pure function of the world size)
        extra = {**extra, "optim_local": optimizer.optim.state_dict()}
    with warnings.catch_warnings():  # single-process saves are intended, not a mistake
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, checkpoint_id=str(tmp), no_dist=not dist.is_initialized())
    torch.save(extra, tmp / f"extra_rank{rank}.pt")
    if rank == 0:
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1))
    _barrier()
    if rank == 0:
        files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
                 for p in sorted(tmp.iterdir()) if p.is_file()}
        manifest = tmp / "manifest.json"
        manifest.write_text(json.dumps({"step": step, "files": files}, indent=1))
        _fsync_dir(tmp)
        if final.exists():  # re-saving the same step (e.g. after a rollback): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(ckpt_dir)
        for old in list_checkpoints(ckpt_dir)[:-keep_last_n]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def load_checkpoint(path: str | Path, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load a verified checkpoint into model and optimizer in place.

    Returns (trainer_state, this rank's extra). Raises CheckpointError when it does not verify.
    """
    path = Path(path)
    reason = verify_checkpoint(path)
    if reason is not None:
        raise CheckpointError(f"checkpoint {path} is unusable: {reason}")
    extra_path = path / f"extra_rank{_rank()}.pt"
    if not extra_path.is_file():
        # written with fewer ranks (a resharded resume): model and optimizer reshard through
        # DCP; per-rank extras (RNG) come from rank 0, fine for dropout-free models
        extra_path = path / "extra_rank0.pt"
    extra = torch.load(extra_path, weights_only=True)
    if isinstance(optimizer, ZeroRedundancyOptimizer) and "optim_local" not in extra:
        raise CheckpointError(f"{path} holds no ZeRO-1 partition for this rank: ZeRO-1 "
                              "optimizer partitions cannot be resharded; resume with the world "
                              "size it was written with, or with parallel.zero=2/3")
    state = _state_dicts(model, optimizer)
    if "optim" in state and "optim" not in _saved_keys(path):
        raise CheckpointError(f"{path} was written by ZeRO-1 (per-rank optimizer partitions): "
                              "resume it with parallel.zero=1 and the same world size")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        set_model_state_dict(model, state["model"], options=StateDictOptions(strict=True))
        optimizer.optim.load_state_dict(extra.pop("optim_local"))

    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=StateDictOptions(strict=True))
    trainer_state = json.loads((path / "trainer_state.json").read_text())
    return trainer_state, extra


def _saved_keys(path: Path) -> set[str]:
    """Top-level keys ('model', 'optim') stored in a DCP checkpoint."""
    meta = dcp.FileSystemReader(str(path)).read_metadata()
    return {k.split(".", 1)[0] for k in meta.state_dict_metadata}


def _state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
