"""A planted DCP `.metadata` never runs: auto-resume, explicit resume, and the loader itself."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from scaletrain.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from scaletrain.checkpoint.safe_meta import UnsafeMetadataError, safe_load_metadata

from ._cli import digests, lost, no_traceback, one_line, scaletrain, tiny_job


class _Payload:
    """Unpickling this calls os.system, which creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(ckpt: Path, marker: Path) -> None:
    """Replace the index with the payload and rewrite the manifest to match (as an attacker
    who can write the checkpoint can)."""
    (ckpt / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    manifest = json.loads((ckpt / "manifest.json").read_text())
    data = (ckpt / ".metadata").read_bytes()
    manifest["files"][".metadata"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.fault("pickle_payload")
def test_payload_is_a_real_payload(tmp_path):
    # control: plain pickle does run it, so the tests below would see the marker if we did
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(_Payload(marker)))
    assert marker.exists()


def _saved(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    path = save_checkpoint(
        tmp_path / "ck", 1, model, opt, trainer_state={"step": 1}, extra={}, keep_last_n=2
    )
    return path, model, opt


@pytest.mark.fault("pickle_payload")
def test_real_index_loads_and_payload_is_refused(tmp_path):
    path, model, opt = _saved(tmp_path)
    assert safe_load_metadata(path / ".metadata").state_dict_metadata  # DCP's own index loads
    load_checkpoint(path, model, opt)
    marker = tmp_path / "ran"
    _plant(path, marker)
    with pytest.raises(CheckpointError, match=r"\.metadata was not loaded: it names posix"):
        load_checkpoint(path, model, opt)
    assert not marker.exists()


@pytest.mark.parametrize("payload", [b"", b"garbage", pickle.dumps([1, 2]), pickle.dumps({"a": 1})])
@pytest.mark.fault("pickle_payload")
def test_non_index_pickles_are_refused_in_one_line(tmp_path, payload):
    f = tmp_path / ".metadata"
    f.write_bytes(payload)
    with pytest.raises(UnsafeMetadataError) as e:
        safe_load_metadata(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["auto", "explicit"])
@pytest.mark.fault("pickle_payload")
def test_planted_metadata_never_executes_from_the_cli(tmp_path, how):
    first = scaletrain("train", *tiny_job(tmp_path, "run"))
    assert first.returncode == 0, first.stderr
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000002"
    marker = tmp_path / "ran"
    _plant(ckpt, marker)
    extra = ["--train.steps=4"]
    if how == "explicit":
        extra.append(f"--checkpoint.resume={ckpt}")
    p = scaletrain("train", *tiny_job(tmp_path, "run", *extra))
    assert not marker.exists()
    assert p.returncode != 0 and no_traceback(p), p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(ckpt / ".metadata") in lines[0], p.stderr


def _redirect_shards(ckpt: Path, to: str, *, relist: bool = True) -> None:
    """Rewrite the index so that every shard is read from `to` (only DCP's own classes in it),
    and, with `relist`, the manifest to match, as an attacker who can write the checkpoint can."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    meta = safe_load_metadata(ckpt / ".metadata")
    meta.storage_data = {
        k: _StorageInfo(to, v.offset, v.length) for k, v in meta.storage_data.items()
    }
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    manifest = json.loads((ckpt / "manifest.json").read_text())
    data = (ckpt / ".metadata").read_bytes()
    manifest["files"][".metadata"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _outside_copy(path: Path, tmp_path: Path) -> Path:
    """A copy of the checkpoint's shard outside it: what the redirected index would load."""
    shard = next(p for p in path.iterdir() if p.suffix == ".distcp")
    outside = tmp_path / "outside.distcp"
    outside.write_bytes(shard.read_bytes())
    return outside


@pytest.mark.parametrize("where", ["absolute", "dotdot", "unlisted"])
@pytest.mark.fault("path_escape")
def test_index_pointing_outside_the_checkpoint_is_refused(tmp_path, where):
    """Shard paths in `.metadata` name only files the checkpoint's manifest lists: an absolute
    path, a `..` path or an unlisted name is refused in one line before a tensor is read."""
    path, model, opt = _saved(tmp_path)
    outside = _outside_copy(path, tmp_path)
    target = {
        "absolute": str(outside),
        "dotdot": f"../../{outside.name}",
        "unlisted": "extra.distcp",
    }[where]
    if where == "unlisted":  # a file inside the directory that the manifest does not cover
        (path / "extra.distcp").write_bytes(outside.read_bytes())
    _redirect_shards(path, target)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # a load from anywhere would bring the saved values back
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, model, opt)
    msg = str(e.value)
    assert "\n" not in msg and ".metadata was not loaded" in msg
    assert ("outside the checkpoint" in msg) if where != "unlisted" else ("not listed" in msg)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n] + 1.0)  # nothing was loaded


@pytest.mark.fault("pickle_payload")
def test_planted_extra_file_is_refused_without_suggesting_unsafe_loading(tmp_path):
    """A payload in extra_rank0.pt (listed in a rewritten manifest): refused in one line that
    names the file and the global, never torch's hint to retry with weights_only=False."""
    path, model, opt = _saved(tmp_path)
    marker = tmp_path / "ran"
    torch.save({"rng": _Payload(marker)}, path / "extra_rank0.pt")
    manifest = json.loads((path / "manifest.json").read_text())
    data = (path / "extra_rank0.pt").read_bytes()
    manifest["files"]["extra_rank0.pt"] = {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, model, opt)
    msg = str(e.value)
    assert "\n" not in msg and "extra_rank0.pt" in msg and "system" in msg
    assert "weights_only" not in msg
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.fault("path_escape")
@pytest.mark.parametrize("where", ["absolute", "dotdot"])
def test_cli_resume_from_an_index_pointing_outside_is_one_line_and_keeps_the_run(tmp_path, where):
    """The audit's attack through the CLI: the step's index re-pointed at a file outside the
    checkpoint and the manifest re-signed. The resume is refused in one line naming the index
    (exit 3), before any tensor is read; no file of the run, nor the outside file, changes."""
    first = scaletrain("train", *tiny_job(tmp_path, "run"))
    assert first.returncode == 0, first.stderr
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000002"
    outside = _outside_copy(ckpt, tmp_path)
    _redirect_shards(ckpt, str(outside) if where == "absolute" else f"../../{outside.name}")
    before, outside_bytes = digests(tmp_path / "run"), outside.read_bytes()
    again = scaletrain("train", *tiny_job(tmp_path, "run", "--train.steps=4"))
    assert again.returncode == 3, again.stderr[-3000:]
    one_line(again, str(ckpt / ".metadata"), "outside the checkpoint")
    assert lost(before, tmp_path / "run") == [] and outside.read_bytes() == outside_bytes
    assert not (ckpt.parent / "step_00000004").exists()
