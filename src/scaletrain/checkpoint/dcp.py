"""Atomic, verified checkpoints with torch.distributed.checkpoint (DCP).

Layout of a run's checkpoints:
    RUN/checkpoints/step_00000100/      published (complete) checkpoint
        *.distcp, .metadata             DCP shards (model + optimizer, sharded or not)
        extra_rank{r}.pt                per-rank non-model state: tensors and plain data only
        trainer_state.json              step, scheduler, scaler, data position, model fingerprint
        manifest.json                   size + sha256 of every file above (written last)
    RUN/checkpoints/.tmp-step_.../      in-progress write; never loaded, removed at the next
                                        start (`clear_interrupted_saves`) and by the next save

A crash at any point leaves either the old set of published checkpoints or the old set plus a
new complete one: the directory is renamed into place only after every rank has written and the
manifest is complete. `latest_good()` verifies sizes and checksums and falls back to the previous
checkpoint when the newest is torn or corrupted. `AsyncCheckpointer` writes the same layout from
a background thread (`dcp.async_save`) and publishes it the same way once the write completed.

Loading never unpickles arbitrary objects: `extra_rank*.pt` is read with `weights_only=True`
(tensors, dicts, lists, numbers, strings only); JSON files are JSON. DCP's own `.metadata` index
is a pickle: every load reads it through `safe_meta.SafeFileSystemReader`, whose unpickler
accepts only DCP's metadata classes (a checksum proves nothing here: whoever writes the index
also writes the manifest), so a planted index is refused in one line and runs nothing.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.optim import ZeroRedundancyOptimizer

from scaletrain.config import byte_unit, fmt_bytes
from scaletrain.parallel.zero import load_zero1_local_state, zero1_local_state

from .manifest import _PREFIX, _sha256, latest_good, list_checkpoints, verify_checkpoint
from .safe_meta import SafeFileSystemReader, UnsafeMetadataError

__all__ = [
    "AsyncCheckpointer",
    "save_checkpoint",
    "load_checkpoint",
    "latest_good",
    "list_checkpoints",
    "verify_checkpoint",
    "CheckpointError",
    "clear_interrupted_saves",
]


class CheckpointError(RuntimeError):
    """A checkpoint is missing, torn, corrupted or belongs to another model."""


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(
    ckpt_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    trainer_state: dict[str, Any],
    extra: dict[str, Any],
    keep_last_n: int = 2,
) -> Path:
    """Collectively save model + optimizer (DCP, sharded as they are) + state; publish atomically.

    `trainer_state` must be JSON-serialisable and identical on every rank (rank 0 writes it);
    `extra` is per-rank (RNG states, data position) and may hold tensors.
    """
    ckpt_dir = Path(ckpt_dir)
    tmp, final = _begin(ckpt_dir, step)
    state, extra = _payload(model, optimizer, extra)
    with warnings.catch_warnings():  # single-process saves are intended, not a mistake
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp.save(state, checkpoint_id=str(tmp), no_dist=not dist.is_initialized())
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - classified below
            raise _storage_error(e, tmp, _state_bytes(state)) or e from None
    _write_local(tmp, extra, trainer_state)
    _barrier()
    if _rank() == 0:
        _publish(tmp, final, step=step, keep_last_n=keep_last_n)
    _barrier()
    return final


class AsyncCheckpointer:
    """Checkpoints written by a background thread (`dcp.async_save`) while training continues.

    `save()` copies the state to host memory (DCP's default stager deep-copies every tensor, so
    later optimizer steps cannot leak into the files), writes the small per-rank files, and
    returns; a thread writes the DCP shards. Only after that write completed does rank 0 add
    the manifest and rename the directory into place — the same publication as the synchronous
    path — so a crash mid-write leaves the previous checkpoint as the newest good one. At most
    one save is in flight: `save()` first waits for the previous one. Call `wait()` before
    anything reads the checkpoint directory (resume, rollback) and before the process exits.

    Constructing it is collective when torch.distributed is initialized: the background writes
    get their own gloo group, because collectives issued from two threads on one group could
    interleave with the training step's and mismatch across ranks.
    """

    def __init__(self, ckpt_dir: str | Path, *, keep_last_n: int = 2):
        self.ckpt_dir, self.keep_last_n = Path(ckpt_dir), keep_last_n
        self._group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-publish")
        self._pending: Future[Path] | None = None

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        trainer_state: dict[str, Any],
        extra: dict[str, Any],
    ) -> None:
        """Start saving `step` (collective); returns once the state is staged in host memory."""
        self.wait()
        tmp, final = _begin(self.ckpt_dir, step)
        state, extra = _payload(model, optimizer, extra)
        # written before the DCP write starts on this rank: DCP's collectives then order every
        # rank's small files before rank 0's manifest, which hashes them
        _write_local(tmp, extra, trainer_state)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            written = dcp.async_save(
                state,
                checkpoint_id=str(tmp),
                process_group=self._group,
                no_dist=not dist.is_initialized(),
            )
        if not isinstance(written, Future):  # a stager that stages in the background
            written = written.upload_completion
        self._pending = self._pool.submit(self._finish, written, tmp, final, step)

    def _finish(self, written: Future, tmp: Path, final: Path, step: int) -> Path:
        written.result()  # re-raises the write's error; nothing is published then
        # DCP's last step is an all-reduce after every rank wrote its shards, so when rank 0's
        # future completes the whole checkpoint is on disk
        if _rank() == 0:
            _publish(tmp, final, step=step, keep_last_n=self.keep_last_n)
        return final

    @property
    def in_flight(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def wait(self) -> Path | None:
        """Block until the save in flight (if any) is written and published; its path."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def close(self) -> Path | None:
        """Wait for the last save, then stop the background thread (and free its group)."""
        try:
            return self.wait()
        finally:
            self._pool.shutdown(wait=True)
            if self._group is not None:
                dist.destroy_process_group(self._group)
                self._group = None


def _begin(ckpt_dir: Path, step: int) -> tuple[Path, Path]:
    """Create the temporary directory of `step` (collective); (tmp, final) paths."""
    final = ckpt_dir / f"{_PREFIX}{step:08d}"
    tmp = ckpt_dir / f".tmp-{final.name}"
    if _rank() == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        # leftovers of writers that died (any step): no save is in flight when a new one starts
        for stale in ckpt_dir.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    _barrier()
    return tmp, final


def clear_interrupted_saves(ckpt_dir: Path) -> str | None:
    """Remove the `.tmp-*` folders of saves that were interrupted (a killed process, a lost
    node); a line saying what was removed, or None. For rank 0 at a run's start, holding the
    run directory's lock (`trainer.runlock`): no other training writes in this directory and
    this one has not saved yet, so none of them is a write in flight. Without this, a crash's
    leftover (as large as a checkpoint) stays until the next save, which a full disk may
    prevent."""
    try:
        stale = sorted(p for p in ckpt_dir.glob(".tmp-*") if p.is_dir() and not p.is_symlink())
    except OSError:
        return None
    if not stale:
        return None
    size = sum(f.stat().st_size for p in stale for f in p.rglob("*") if f.is_file())
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    kept = [p.name for p in stale if p.exists()]  # (permissions): said, not claimed removed
    line = (
        f"removed {len(stale)} unfinished checkpoint folder{'s' if len(stale) > 1 else ''} "
        f"({fmt_bytes(size)}) left in {ckpt_dir} by an interrupted save: "
        + ", ".join(p.name for p in stale)
    )
    if kept:
        line = (
            f"{len(kept)} unfinished checkpoint folder(s) in {ckpt_dir} left by an interrupted "
            f"save could not be removed: {', '.join(kept)}; delete them to free "
            f"{fmt_bytes(size)}"
        )
    return line


def _storage_error(e: BaseException, where: Path, needed: int) -> OSError | None:
    """The storage fault behind a failed save, as an OSError naming `where` (one line at the
    CLI), or None when it was something else. DCP wraps each rank's failure in a
    CheckpointException, and torch.save on a full disk fails as a RuntimeError of its zip
    writer ("unexpected pos"), so the filesystem itself is asked: read-only, or less free
    space than the tensors being saved (`needed` bytes, an upper bound of the shard)."""
    for failure in (getattr(e, "failures", None) or {}).values():
        exc = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(exc, OSError) and exc.errno is not None:
            return OSError(exc.errno, os.strerror(exc.errno), str(exc.filename or where))
    try:
        fs = os.statvfs(where if where.exists() else where.parent)
    except OSError:
        return None
    if fs.f_flag & os.ST_RDONLY:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), str(where))
    free = fs.f_bavail * fs.f_frsize
    if free < needed:
        u = byte_unit(needed)  # the two figures in one unit
        return OSError(
            errno.ENOSPC,
            f"{os.strerror(errno.ENOSPC)} ({fmt_bytes(free, unit=u)} free, the checkpoint "
            f"needs up to {fmt_bytes(needed, unit=u)})",
            str(where),
        )
    return None


def _state_bytes(state: Any) -> int:
    """Bytes of every tensor in a (nested) state dict: what its shards hold at most."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(_state_bytes(v) for v in state)
    return 0


def _payload(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, extra: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    state = _state_dicts(model, optimizer)
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        # ZeRO-1 keeps plain local state partitions that DCP cannot address: each rank writes
        # its own partition (the partitioning is a pure function of the world size)
        extra = {**extra, "optim_local": zero1_local_state(optimizer)}
    return state, extra


def _write_local(tmp: Path, extra: dict[str, Any], trainer_state: dict[str, Any]) -> None:
    torch.save(extra, tmp / f"extra_rank{_rank()}.pt")
    if _rank() == 0:
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1))


def _publish(tmp: Path, final: Path, *, step: int, keep_last_n: int) -> None:
    """Rank 0, after every rank wrote: manifest last, then one atomic rename, then retention."""
    files = {
        p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(tmp.iterdir())
        if p.is_file()
    }
    manifest = tmp / "manifest.json"
    manifest.write_text(json.dumps({"step": step, "files": files}, indent=1))
    # a killed process loses nothing the kernel already holds, but a lost node loses unflushed
    # pages: every file is on disk before the rename makes the checkpoint visible (DCP's
    # shards are fsynced by its writer already; this covers ours, and costs little for them)
    for f in sorted(tmp.iterdir()):
        if f.is_file():
            _fsync_path(f)
    _fsync_dir(tmp)
    if final.exists():
        if verify_checkpoint(final) is None:  # re-saving a good step (after a rollback)
            shutil.rmtree(final)
        else:  # an unusable one (resume=never over a damaged run): kept aside, not deleted
            os.replace(final, _aside(final))
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    _retain(final.parent, keep_last_n=keep_last_n)


def _aside(final: Path) -> Path:
    """A free name beside `final` for an unusable checkpoint a new save of its step replaces:
    `unusable-step_N` (-2, -3, ... if taken), outside the `step_` names that resume lists."""
    aside = final.with_name(f"unusable-{final.name}")
    n = 2
    while aside.exists():
        aside, n = final.with_name(f"unusable-{final.name}-{n}"), n + 1
    return aside


def _retain(ckpt_dir: Path, *, keep_last_n: int) -> None:
    """Keep the newest `keep_last_n` checkpoints that verify; delete what is older than them.

    Counting directories by name would let torn or corrupted higher-numbered ones push every
    good checkpoint out (each new good one deleted right after publishing); so only verified
    ones count, the newest good one is never deleted, and unusable newer ones are left for
    `latest_good` to skip (and for a person to inspect). Costs one checksum pass over the
    kept checkpoints per save.
    """
    good = 0
    for path in reversed(list_checkpoints(ckpt_dir)):
        if good >= keep_last_n:
            shutil.rmtree(path, ignore_errors=True)
        elif verify_checkpoint(path) is None:
            good += 1


def load_checkpoint(
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load a verified checkpoint into model and optimizer in place.

    Returns (trainer_state, this rank's extra). Raises CheckpointError when it does not verify.
    """
    path = Path(path)
    reason = verify_checkpoint(path)
    if reason is not None:
        raise CheckpointError(f"checkpoint {path} is unusable: {reason}")
    trainer_state, extra = _read_small_files(path)
    if isinstance(optimizer, ZeroRedundancyOptimizer) and "optim_local" not in extra:
        raise CheckpointError(
            f"{path} holds no ZeRO-1 partition for this rank: ZeRO-1 "
            "optimizer partitions cannot be resharded; resume with the world "
            "size it was written with, or with parallel.zero=2/3"
        )
    state = _state_dicts(model, optimizer)
    _check_saved_fqns(path, state)
    _load_states(path, state, model, optimizer, extra)
    return trainer_state, extra


def _read_small_files(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer_state.json, this rank's extra_rank*.pt), each checked to hold a mapping."""
    extra_path = path / f"extra_rank{_rank()}.pt"
    if not extra_path.is_file():
        # written with fewer ranks (a resharded resume): model and optimizer reshard through
        # DCP; per-rank extras (RNG) come from rank 0, fine for dropout-free models
        extra_path = path / "extra_rank0.pt"
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning: the error says it
            warnings.simplefilter("ignore")
            extra = torch.load(extra_path, weights_only=True)
    except pickle.UnpicklingError as e:  # torch's message would suggest weights_only=False
        refused = next(
            (ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln or "global" in ln), ""
        )
        raise CheckpointError(
            f"checkpoint {path} is unusable: {extra_path.name} names a Python object the "
            f"trainer never writes ({refused[:120] or 'not plain tensors and containers'}); "
            "it was not loaded (nothing in a checkpoint can run code): resume another "
            "checkpoint"
        ) from None
    except Exception as e:  # noqa: BLE001 - verified files that still do not parse
        raise CheckpointError(f"checkpoint {path} is unusable: {_first(e)}") from None
    try:
        trainer_state = json.loads((path / "trainer_state.json").read_text())
    except Exception as e:  # noqa: BLE001 - verified files that still do not parse
        raise CheckpointError(f"checkpoint {path} is unusable: {_first(e)}") from None
    if not isinstance(extra, dict) or not isinstance(trainer_state, dict):
        raise CheckpointError(
            f"checkpoint {path} is unusable: extra_rank*.pt and "
            "trainer_state.json must each hold a mapping"
        )
    return trainer_state, extra


def _check_saved_fqns(path: Path, state: dict[str, Any]) -> None:
    """Refuse, before anything loads, a checkpoint holding parameters this model lacks, or
    ZeRO-1 partitions where this optimizer expects a DCP optimizer state."""
    fqns = _saved_fqns(path)  # reads (safely) the index before anything is loaded
    saved = {k.split(".", 1)[0] for k in fqns}
    ours = {f"model.{k}" for k in state["model"]}
    # one process holds the whole model (a pipeline rank holds its stages only, and the
    # saved config is compared with the new one before any rank loads: resume_check)
    extra_params = (
        []
        if dist.is_initialized()
        else sorted(k for k in fqns if k.startswith("model.") and k not in ours)
    )
    if extra_params:  # DCP loads what the model asks for: the rest would vanish silently
        raise CheckpointError(
            f"checkpoint {path} holds {len(extra_params)} parameter(s) this "
            f"model does not have ({', '.join(extra_params[:3])}): resume it "
            "with the config it was written with, or start a new run_dir"
        )
    if "optim" in state and "optim" not in saved:
        raise CheckpointError(
            f"{path} was written by ZeRO-1 (per-rank optimizer partitions): "
            "resume it with parallel.zero=1 and the same world size"
        )


def _load_states(
    path: Path,
    state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
) -> None:
    """DCP-load `state` from `path`, then set it into model and optimizer (ZeRO-1: its
    local partition from `extra`, popped)."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(
                state,
                checkpoint_id=str(path),
                storage_reader=SafeFileSystemReader(str(path)),
                no_dist=not dist.is_initialized(),
            )
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            set_model_state_dict(model, state["model"], options=StateDictOptions(strict=True))
            load_zero1_local_state(optimizer, extra.pop("optim_local"))
        else:
            set_state_dict(
                model,
                optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
                options=StateDictOptions(strict=True),
            )
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - another model or format
        # (DCP's CheckpointException derives from BaseException)
        raise CheckpointError(
            f"checkpoint {path} does not load into this model "
            f"({_first(e)}): resume it with the config it was written "
            "with, or start a new run_dir"
        ) from None


def _first(e: BaseException) -> str:
    """`e` as one short line (DCP's errors carry per-rank tracebacks over many lines)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    for ln in lines:  # the innermost cause DCP wraps is the informative one
        if "Error" in ln or "size mismatch" in ln or "Missing key" in ln or "Unexpected" in ln:
            text = ln
    return f"{type(e).__name__}: {text[:300]}"


def _saved_fqns(path: Path) -> set[str]:
    """Every key stored in a DCP checkpoint ('model.w', 'optim.state.w.exp_avg', ...), its
    index read safely; an index that is not one is a CheckpointError."""
    try:
        meta = SafeFileSystemReader(str(path)).read_metadata()
    except UnsafeMetadataError as e:
        raise CheckpointError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - a truncated or foreign .metadata
        raise CheckpointError(
            f"checkpoint {path} is unusable: its .metadata does not read ({_first(e)})"
        ) from None
    return set(meta.state_dict_metadata)


def _state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)  # fsync flushes the file's dirty pages whatever the mode
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
