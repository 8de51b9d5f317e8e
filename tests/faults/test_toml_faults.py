"""Faults in a TOML plan file's structure and types (the values' ranges are in
test_config_faults.py): one ConfigError line naming the file or the field."""

from __future__ import annotations

import pytest

from scaletrain.config import ConfigError, load_config

from ._cli import no_traceback, scaletrain

# (file bytes, the field the error must name: "config" = the file itself)
CASES = [
    ("syntax", b"[train\nsteps = 3\n", "config"),
    ("duplicate-key", b"[train]\nsteps = 3\nsteps = 4\n", "config"),
    ("duplicate-section", b"[train]\nsteps=3\n[train]\nseed=1\n", "config"),
    ("unknown-section", b"[trian]\nsteps = 3\n", "trian"),
    ("section-not-table", b"train = 5\n", "train"),
    ("top-level-key", b"steps = 5\n", "steps"),
    ("nested-table", b"[train.extra]\nx = 1\n", "train.extra"),
    ("array-of-tables", b"[[train]]\nsteps = 1\n", "train"),
    ("not-utf8", b'[train]\nrun_dir = "caf\xe9"\n', "config"),
    ("binary", b"\x00\x01\x02", "config"),
    ("unknown-key", b"[train]\nstesp = 3\n", "train.stesp"),
    ("model-unknown-key", b"[model]\nname='tiny-llama'\ndimm = 8\n", "model.dimm"),
    ("model-quoted-int", b"[model]\nname='tiny-llama'\ndim = '8'\n", "model.dim"),
    ("quoted-int", b'[train]\nsteps = "8"\n', "train.steps"),
    ("quoted-float", b'[optim]\nlr = "1e-3"\n', "optim.lr"),
    ("quoted-bool", b'[train]\ncompile = "true"\n', "train.compile"),
    ("quoted-degree", b'[parallel]\ntp = "2"\n', "parallel.tp"),
    ("model-name-table", b"[model]\nname = {a=1}\n", "model.name"),
    ("date-for-int", b"[train]\nsteps = 1979-05-27\n", "train.steps"),
    ("table-for-float", b"[optim]\nlr = {x=1}\n", "optim.lr"),
    ("beyond-int64", b"[train]\nsteps = 99999999999999999999999\n", "train.steps"),
    ("float-overflow", b"[optim]\nlr = 1e400\n", "optim.lr"),
    ("nan-literal", b"[optim]\nlr = nan\n", "optim.lr"),
    ("negative-steps", b"[train]\nsteps = -3\n", "train.steps"),
    ("negative-every", b"[checkpoint]\nevery = -1\n", "checkpoint.every"),
    ("dp-zero", b"[parallel]\ndp = 0\n", "parallel.dp"),
    ("global-batch-zero", b"[batch]\nglobal_batch = 0\n", "batch.global_batch"),
    ("model-json-missing", b"[model]\nname = '/nope/config.json'\n", "model.name"),
    ("init-from-missing", b"[checkpoint]\ninit_from = '/nope'\n", "checkpoint.init_from"),
    ("resume-missing", b"[checkpoint]\nresume = '/nope/step_00000001'\n", "checkpoint.resume"),
    ("source-missing", b"[data]\nsource = '/nope.txt'\n", "data.source"),
    ("device-typo", b"[train]\ndevice = 'cdua'\n", "train.device"),
    ("run-dir-list", b"[train]\nrun_dir = ['a']\n", "train.run_dir"),
]


@pytest.mark.parametrize(("content", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_toml_fault_is_one_line_naming_the_field(tmp_path, content, field):
    f = tmp_path / "plan.toml"
    f.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert e.value.field == field, str(e.value)
    assert "\n" not in str(e.value)
    if field == "config":
        assert "plan.toml" in str(e.value)


def test_config_path_that_is_a_directory(tmp_path):
    (tmp_path / "plan.toml").mkdir()
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "plan.toml")
    assert e.value.field == "config"


@pytest.mark.parametrize(
    ("content", "field", "value"),
    [
        (b"\xef\xbb\xbf[train]\nsteps = 3\n", "steps", 3),  # a byte-order mark is harmless
        (b"[train]\nsteps = 0x10\n", "steps", 16),  # a TOML hex integer is an integer
        (b"[train]\nsteps = 1_000\n", "steps", 1000),
        (b"", "steps", 800),  # an empty plan is the defaults
    ],
)
def test_good_toml_still_loads(tmp_path, content, field, value):
    f = tmp_path / "plan.toml"
    f.write_bytes(content)
    assert getattr(load_config(f).train, field) == value


@pytest.mark.parametrize("args", [["train"], ["plan", "--config"], ["dryrun", "--config"]])
def test_cli_names_a_non_utf8_toml_in_one_line(tmp_path, args):
    # the CLI reads the file once more (which fields were given) before load_config: that
    # read must report a bad file as load_config does, never as a UnicodeDecodeError
    bad = tmp_path / "job.toml"
    bad.write_bytes(b"[train]\nsteps = 1\n# caf\xe9\n")
    p = scaletrain(*args, str(bad), timeout=120)
    assert p.returncode == 2 and no_traceback(p), p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert "config = " in last and "not UTF-8" in last and "job.toml" in last, last
