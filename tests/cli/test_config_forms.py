"""One config syntax for every verb that reads a job TOML, `--version`, family suggestions."""

from __future__ import annotations

import pytest

from scaletrain.cli import main
from scaletrain.config.strict import did_you_mean


@pytest.fixture
def toml(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('[model]\nname = "tiny-llama"\n\n[batch]\nseq_len = 64\n')
    return f


@pytest.mark.parametrize("form", ["positional", "option"])
def test_plan_takes_the_config_either_way(toml, form, capsys):
    args = [str(toml)] if form == "positional" else ["--config", str(toml)]
    assert main(["explain", *args, "--gpus", "1"]) == 0
    out = capsys.readouterr().out
    assert "tiny-llama" in out and "64" in out  # the file's model and sequence were read


def test_train_accepts_config_as_an_option_too(toml, monkeypatch):
    """`scaletrain train --config F` reaches the same job as `scaletrain train F`."""
    import scaletrain.cli.train as train_cli

    seen = []
    monkeypatch.setattr(train_cli, "run", lambda args, extra: seen.append(args.config) or 0)
    assert main(["train", "--config", str(toml)]) == 0
    assert main(["train", str(toml)]) == 0
    assert seen == [str(toml), str(toml)]


def test_two_different_config_files_are_one_line(toml, tmp_path, capsys):
    assert main(["plan", str(toml), "--config", str(tmp_path / "other.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "two config files" in err


def test_version_prints_the_version(capsys):
    from scaletrain import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"scaletrain {__version__}"


def test_a_family_name_suggests_its_members_before_the_nearest_string():
    opts = ["a100-80gb", "h100-sxm", "h100-pcie", "h200"]
    assert did_you_mean("h100", opts) == " (did you mean 'h100-sxm' or 'h100-pcie'?)"
    assert did_you_mean("h20", opts) == " (did you mean 'h200'?)"  # one member: itself
    assert did_you_mean("bf61", ["fp32", "bf16"]) == " (did you mean 'bf16'?)"
