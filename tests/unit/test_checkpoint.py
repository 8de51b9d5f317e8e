"""Atomic DCP checkpoints: round trip, torn/corrupted detection with fallback, retention, async."""

import json
from concurrent.futures import Future

import pytest
import torch

import scaletrain.checkpoint.dcp as dcp_module
from scaletrain.checkpoint import (
    AsyncCheckpointer,
    CheckpointError,
    latest_good,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)


def _model_and_opt(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def _save(d, step, model, opt, keep=3):
    return save_checkpoint(
        d,
        step,
        model,
        opt,
        trainer_state={"step": step, "note": "x"},
        extra={"rng": {"cpu": torch.get_rng_state()}, "pos": step * 10},
        keep_last_n=keep,
    )


def test_round_trip_restores_model_optimizer_and_state(tmp_path):
    model, opt = _model_and_opt(0)
    path = _save(tmp_path, 5, model, opt)
    assert verify_checkpoint(path) is None
    fresh, fresh_opt = _model_and_opt(1)
    state, extra = load_checkpoint(path, fresh, fresh_opt)
    assert state == {"step": 5, "note": "x"} and extra["pos"] == 50
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    sa, sb = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    for k in sa:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[k][name], sb[k][name])


def test_torn_and_corrupted_checkpoints_fall_back_to_previous(tmp_path):
    model, opt = _model_and_opt(0)
    good = _save(tmp_path, 1, model, opt)
    newest = _save(tmp_path, 2, model, opt)
    # corrupt one byte of a shard of the newest checkpoint
    shard = next(p for p in newest.iterdir() if p.suffix == ".distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    messages = []
    assert "checksum" in verify_checkpoint(newest)
    assert latest_good(tmp_path, log=messages.append) == good
    assert "step_00000002" in messages[0] and "checksum" in messages[0]
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(newest, *_model_and_opt(3))
    # a torn write (no manifest: the process died before publishing) is skipped too
    (newest / "manifest.json").unlink()
    assert "manifest" in verify_checkpoint(newest)
    assert latest_good(tmp_path, log=messages.append) == good


def test_in_progress_write_is_never_listed_and_retention_keeps_last_n(tmp_path):
    model, opt = _model_and_opt(0)
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, model, opt, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]
    (tmp_path / ".tmp-step_00000005").mkdir()  # a crashed writer's leftovers
    assert latest_good(tmp_path).name == "step_00000004"
    manifest = json.loads((tmp_path / "step_00000004" / "manifest.json").read_text())
    assert "trainer_state.json" in manifest["files"] and "extra_rank0.pt" in manifest["files"]
    _save(tmp_path, 6, model, opt, keep=2)  # the next save clears any crashed writer's leftovers
    assert not list(tmp_path.glob(".tmp-*"))


def test_extra_state_is_loaded_without_unpickling_objects(tmp_path):
    model, opt = _model_and_opt(0)
    path = _save(tmp_path, 1, model, opt)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"rng": Evil()}, path / "extra_rank0.pt")
    # rewrite the manifest so only the weights-only loader stands between us and the object
    files = {
        p.name: {
            "size": p.stat().st_size,
            "sha256": __import__("hashlib").sha256(p.read_bytes()).hexdigest(),
        }
        for p in path.iterdir()
        if p.name != "manifest.json"
    }
    (path / "manifest.json").write_text(json.dumps({"step": 1, "files": files}))
    with pytest.raises(Exception, match="(?i)weights only|unpickl|not an allowed"):
        load_checkpoint(path, *_model_and_opt(2))


def _async_save(saver, step, model, opt):
    saver.save(
        step,
        model,
        opt,
        trainer_state={"step": step},
        extra={"rng": {"cpu": torch.get_rng_state()}, "pos": step},
    )


def test_async_save_writes_the_state_at_the_call_not_later_updates(tmp_path):
    model, opt = _model_and_opt(0)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    saver = AsyncCheckpointer(tmp_path, keep_last_n=2)
    _async_save(saver, 1, model, opt)
    with torch.no_grad():  # training continues while the thread writes
        for p in model.parameters():
            p.add_(1.0)
    assert saver.close() == tmp_path / "step_00000001"
    assert verify_checkpoint(tmp_path / "step_00000001") is None
    fresh, fresh_opt = _model_and_opt(1)
    state, extra = load_checkpoint(tmp_path / "step_00000001", fresh, fresh_opt)
    assert state == {"step": 1} and extra["pos"] == 1
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, expected[name])


def test_async_saves_one_in_flight_published_in_order_with_retention(tmp_path):
    model, opt = _model_and_opt(0)
    saver = AsyncCheckpointer(tmp_path, keep_last_n=2)
    for step in (1, 2, 3):
        _async_save(saver, step, model, opt)
        if step > 1:  # starting a save waited for the previous one: it is published by now
            assert f"step_{step - 1:08d}" in [p.name for p in list_checkpoints(tmp_path)]
    assert saver.close().name == "step_00000003"
    assert not saver.in_flight
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002", "step_00000003"]
    assert not list(tmp_path.glob(".tmp-*"))


def test_failed_async_write_is_never_published_and_previous_stays_latest(tmp_path, monkeypatch):
    model, opt = _model_and_opt(0)
    good = _save(tmp_path, 1, model, opt)
    failed: Future = Future()
    failed.set_exception(OSError("disk full"))
    monkeypatch.setattr(dcp_module.dcp, "async_save", lambda *a, **k: failed)
    saver = AsyncCheckpointer(tmp_path, keep_last_n=2)
    _async_save(saver, 2, model, opt)
    with pytest.raises(OSError, match="disk full"):
        saver.close()
    # the half-written directory stays a .tmp-* one, which nothing loads
    assert (tmp_path / ".tmp-step_00000002").is_dir()
    assert latest_good(tmp_path) == good
