"""Retention counts verified checkpoints only: corrupt higher-numbered ones never push good
ones out, and the newest good one survives every save."""

from __future__ import annotations

import pytest
import torch

from scaletrain.checkpoint import latest_good, list_checkpoints, save_checkpoint


def _save(d, step, keep):
    torch.manual_seed(step)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return save_checkpoint(
        d, step, model, opt, trainer_state={"step": step}, extra={}, keep_last_n=keep
    )


def _fake_bad(d, step, kind):
    p = d / f"step_{step:08d}"
    p.mkdir(parents=True)
    if kind == "torn":  # no manifest: the write never finished
        (p / "__0_0.distcp").write_bytes(b"x" * 10)
    else:  # a manifest that does not match the files
        (p / ".metadata").write_bytes(b"y")
        (p / "manifest.json").write_text('{"files": {".metadata": {"size": 5, "sha256": "0"}}}')


@pytest.mark.parametrize("keep", [1, 2, 3])
@pytest.mark.parametrize("kind", ["torn", "corrupt"])
def test_corrupt_newer_dirs_never_delete_good_ones(tmp_path, keep, kind):
    for step in (100, 200):
        _fake_bad(tmp_path, step, kind)
    saved = [_save(tmp_path, s, keep) for s in (1, 2, 3, 4)]
    names = [p.name for p in list_checkpoints(tmp_path)]
    kept_good = [p.name for p in saved[-keep:]]
    assert names == sorted([*kept_good, "step_00000100", "step_00000200"])
    assert latest_good(tmp_path, log=lambda _: None) == saved[-1]


def test_plain_retention_still_keeps_last_n(tmp_path):
    saved = [_save(tmp_path, s, 2) for s in (1, 2, 3)]
    assert list_checkpoints(tmp_path) == saved[-2:]


def test_bad_dirs_older_than_the_kept_good_ones_are_removed(tmp_path):
    _fake_bad(tmp_path, 1, "corrupt")
    saved = [_save(tmp_path, s, 1) for s in (2, 3)]
    assert list_checkpoints(tmp_path) == saved[-1:]
