"""Damaged, forged or mismatched checkpoints: verification names the reason in one line,
`latest_good` falls back to the previous good checkpoint (the documented recovery), and a
direct load raises one CheckpointError line, never a traceback from DCP or json."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest
import torch

from scaletrain.checkpoint import (
    CheckpointError,
    latest_good,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)


def _model(out: int = 4) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = torch.nn.Linear(4, out)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    return m, opt


def _two(tmp_path: Path) -> tuple[Path, Path]:
    m, opt = _model()
    a = save_checkpoint(tmp_path, 1, m, opt, trainer_state={"step": 1}, extra={"x": 1})
    b = save_checkpoint(tmp_path, 2, m, opt, trainer_state={"step": 2}, extra={"x": 2})
    return a, b


def _distcp(p: Path) -> Path:
    return next(p.glob("*.distcp"))


def _rewrite_manifest(p: Path, edit) -> None:
    doc = json.loads((p / "manifest.json").read_text())
    edit(doc)
    (p / "manifest.json").write_text(json.dumps(doc))


def _forge(p: Path, name: str, content: bytes) -> None:
    """Replace a file and re-sign the manifest (as anyone who can write the directory can)."""
    (p / name).write_bytes(content)

    def edit(doc):
        doc["files"][name] = {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}

    _rewrite_manifest(p, edit)


DAMAGE = {
    "no-manifest": lambda p: (p / "manifest.json").unlink(),
    "manifest-garbage": lambda p: (p / "manifest.json").write_bytes(b"{\x00nope"),
    "manifest-not-utf8": lambda p: (p / "manifest.json").write_bytes(b"\xff\xfe{}"),
    "manifest-list": lambda p: (p / "manifest.json").write_text("[1, 2]"),
    "manifest-files-list": lambda p: _rewrite_manifest(p, lambda d: d.update(files=[1])),
    "manifest-empty-files": lambda p: _rewrite_manifest(p, lambda d: d.update(files={})),
    "manifest-no-size": lambda p: _rewrite_manifest(
        p, lambda d: d["files"][".metadata"].pop("size")
    ),
    "manifest-size-str": lambda p: _rewrite_manifest(
        p, lambda d: d["files"][".metadata"].update(size="12")
    ),
    "manifest-entry-null": lambda p: _rewrite_manifest(
        p, lambda d: d["files"].update({".metadata": None})
    ),
    "manifest-path-escape": lambda p: _rewrite_manifest(
        p, lambda d: d["files"].update({"../../etc/passwd": {"size": 1, "sha256": "0"}})
    ),
    "manifest-wrong-step": lambda p: _rewrite_manifest(p, lambda d: d.update(step=7)),
    "manifest-step-bool": lambda p: _rewrite_manifest(p, lambda d: d.update(step=True)),
    "no-metadata": lambda p: (p / ".metadata").unlink(),
    "no-distcp": lambda p: _distcp(p).unlink(),
    "distcp-truncated": lambda p: _distcp(p).write_bytes(_distcp(p).read_bytes()[:-8]),
    "distcp-flipped": lambda p: _distcp(p).write_bytes(
        bytes(b ^ 1 if i == 40 else b for i, b in enumerate(_distcp(p).read_bytes()))
    ),
    "distcp-appended": lambda p: _distcp(p).write_bytes(_distcp(p).read_bytes() + b"\0"),
    "no-trainer-state": lambda p: (p / "trainer_state.json").unlink(),
    "trainer-state-edited": lambda p: (p / "trainer_state.json").write_text('{"step": 99}'),
    "no-extra": lambda p: (p / "extra_rank0.pt").unlink(),
    "extra-zeroed": lambda p: (p / "extra_rank0.pt").write_bytes(
        bytes(len((p / "extra_rank0.pt").read_bytes()))
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_damaged_checkpoint_is_skipped_and_refused_in_one_line(tmp_path, damage):
    a, b = _two(tmp_path)
    DAMAGE[damage](b)
    reason = verify_checkpoint(b)
    assert reason is not None and "\n" not in reason
    said = []
    assert latest_good(tmp_path, log=said.append) == a  # the documented recovery
    assert len(said) == 1 and str(b) in said[0]
    m, opt = _model()
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(b, m, opt)
    assert "\n" not in str(e.value) and str(b) in str(e.value)


class _Boom:
    def __reduce__(self):
        return (print, ("never",))


FORGED = {  # files replaced and the manifest re-signed: verification passes, loading must not
    "trainer-state-garbage": ("trainer_state.json", b"{not json"),
    "trainer-state-list": ("trainer_state.json", b"[1, 2]"),
    "extra-garbage": ("extra_rank0.pt", b"PK\x03\x04 not a zip"),
    "extra-pickle-payload": ("extra_rank0.pt", pickle.dumps(_Boom())),
    "metadata-garbage": (".metadata", b"\x80\x04garbage"),
    "metadata-empty": (".metadata", b""),
}


@pytest.mark.filterwarnings("error")  # nothing but the one line reaches the user
@pytest.mark.parametrize("forged", list(FORGED), ids=list(FORGED))
def test_forged_files_are_one_line_checkpoint_errors(tmp_path, forged):
    _, b = _two(tmp_path)
    _forge(b, *FORGED[forged])
    m, opt = _model()
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(b, m, opt)
    assert "\n" not in str(e.value) and str(b) in str(e.value)


@pytest.mark.parametrize(("out", "bias"), [(8, True), (4, False)], ids=["shape", "keys"])
def test_checkpoint_of_another_model_is_one_line(tmp_path, out, bias):
    _, b = _two(tmp_path)
    torch.manual_seed(0)
    m = torch.nn.Linear(4, out, bias=bias)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(b, m, opt)
    assert "\n" not in str(e.value) and "resume it with the config" in str(e.value)


def test_a_good_checkpoint_still_loads_bitwise(tmp_path):
    _, b = _two(tmp_path)
    ref, _ = _model()
    m = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    state, extra = load_checkpoint(b, m, opt)
    assert state == {"step": 2} and extra == {"x": 2}
    assert torch.equal(m.weight, ref.weight) and torch.equal(m.bias, ref.bias)


@pytest.mark.slow
@pytest.mark.fault("all_corrupt")
def test_all_checkpoints_corrupt_refuses_to_start_over_and_keeps_them(tmp_path):
    """resume=auto with every checkpoint unusable: one line, exit 3, nothing trained or
    overwritten; resume=never then trains afresh and sets the damaged step aside, not over it."""
    from ._cli import no_traceback, scaletrain, tiny_job

    first = scaletrain("train", *tiny_job(tmp_path, "run", "--checkpoint.every=1"))
    assert first.returncode == 0, first.stderr
    ckpts = tmp_path / "run" / "checkpoints"
    steps = sorted(ckpts.glob("step_*"))
    for d in steps:  # damage every one of them
        shard = next(d.glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, another checksum
        shard.write_bytes(bytes(data))
    damaged = {d.name: next(d.glob("*.distcp")).read_bytes() for d in steps}
    again = scaletrain("train", *tiny_job(tmp_path, "run", "--train.steps=4"))
    assert again.returncode == 3 and no_traceback(again), again.stderr
    err = again.stderr.strip().splitlines()
    assert len(err) == 1 and "every checkpoint" in err[0] and "resume=never" in err[0]
    assert {d.name: next(d.glob("*.distcp")).read_bytes() for d in steps} == damaged
    over = scaletrain(
        "train", *tiny_job(tmp_path, "run", "--checkpoint.every=1", "--checkpoint.resume=never")
    )
    assert over.returncode == 0, over.stderr
    kept = sorted(ckpts.glob("unusable-step_*"))
    assert [d.name for d in kept] == [f"unusable-{d.name}" for d in steps]
    assert {d.name[len("unusable-") :]: next(d.glob("*.distcp")).read_bytes() for d in kept} == (
        damaged
    )
    assert latest_good(ckpts) is not None  # the new run's own checkpoints


def _rewrite_state(ckpt: Path, edit) -> None:
    """Edit trainer_state.json and re-list it in the manifest (files match their checksums)."""
    state = json.loads((ckpt / "trainer_state.json").read_text())
    edit(state)
    data = json.dumps(state).encode()
    (ckpt / "trainer_state.json").write_bytes(data)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["trainer_state.json"] = {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda s: s.update(step="three"), "not a non-negative integer"),
        (lambda s: s.pop("data"), "lacks the data position"),
        (lambda s: s.update(wall_s="x"), "wall_s"),
    ],
    ids=["step", "data", "wall_s"],
)
@pytest.mark.fault("checkpoint_format")
def test_a_checkpoint_matching_its_manifest_with_wrong_fields_is_one_line(tmp_path, edit, said):
    from ._cli import no_traceback, scaletrain, tiny_job

    first = scaletrain("train", *tiny_job(tmp_path, "run"))
    assert first.returncode == 0, first.stderr
    ckpt = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))[-1]
    _rewrite_state(ckpt, edit)
    again = scaletrain("train", *tiny_job(tmp_path, "run", "--train.steps=4"))
    assert again.returncode == 3 and no_traceback(again), again.stderr
    err = again.stderr.strip().splitlines()
    assert len(err) == 1 and said in err[0] and ckpt.name in err[0], err
