"""A damaged run directory under `scaletrain verify`, `status` and `report` (in process through
`scaletrain.cli.main`): every file empty, not JSON, not UTF-8, the wrong JSON type, a
directory, a symlink loop, or holding fields of the wrong type. A file the command needs
(verify: config.json and measurement.json; status: config.json) is one line naming it (exit 2);
a file it can do without is passed over, documented in measure/run_files.py (exit 0), except that
`report` writes its page without a damaged file and says so (one warning line, exit 1). Never a
traceback (before: 21 of 84 such cases were). Also: output piped into a reader that stops
early (`| head`) ends quietly, with no BrokenPipeError traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scaletrain.cli import main
from scaletrain.config import load_config

from ._cli import env

ARGS = [
    "--model.name=tiny-llama",
    "--batch.seq_len=16",
    "--batch.global_batch=2",
    "--batch.micro_batch=2",
    "--train.steps=2",
]


def _run_dir(tmp_path):
    """A finished 2-step run's files, written as the trainer writes them (no training)."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(load_config(None, ARGS).to_dict()))
    mem = {
        "params": 5e5,
        "grads": 5e5,
        "optimizer": 1e6,
        "activations": 3.5e5,
        "buffers": 0,
        "total": 2.35e6,
        "reserved": 0,
        "capacity": 0,
        "fits": True,
        "rank": 0,
    }
    (d / "measurement.json").write_text(
        json.dumps(
            {
                "source": "cpu",
                "rank": 0,
                "world_size": 1,
                "plan": {},
                "memory": mem,
                "step_s": 0.01,
                "tokens_per_s": 3000.0,
            }
        )
    )
    (d / "metrics.jsonl").write_text(
        "".join(
            json.dumps(
                {"step": s, "loss": 5.5, "tokens_per_s": 3000.0, "step_s": 0.01, "mfu": 0.005}
            )
            + "\n"
            for s in (1, 2)
        )
    )
    (d / "run_info.json").write_text(
        json.dumps({"steps": 2, "world_size": 1, "tokens_per_s": 3000.0, "best_loss": 5.0})
    )
    (d / "heartbeat").mkdir()
    (d / "heartbeat" / "rank0.json").write_text(
        json.dumps({"rank": 0, "pid": 1, "host": "h", "time": 1.0, "step": 2, "state": "exited"})
    )
    return d


DAMAGE = ["", "{bad", "[]", "null", "5", '"text"', b"\xff\xfe", "<dir>", "<loop>"]
FIELDS = {  # (file, content with a field of the wrong type)
    "config.json": [
        '{"model": 5}',
        '{"train": {"steps": "x"}}',
        '{"train": {"steps": 1e999}}',
        '{"model": {"name": "nope"}}',
        '{"batch": {"seq_len": "x"}}',
    ],
    "measurement.json": [
        "{}",
        '{"memory": "x"}',
        '{"memory": {}, "rank": "x"}',
        '{"memory": {}, "timeline": 5}',
    ],
    "metrics.jsonl": [
        '{"step": "x", "loss": "y"}\n',
        "[1]\n",
        "null\n",
        '{"step": 1e999, "loss": NaN}\n',
        '{"step": 1, "step_s": "x", "tokens_per_s": Infinity}\n',
        '{"step": true}\n',
    ],
    "run_info.json": ['{"world_size": "x"}', '{"tokens_per_s": "x", "best_loss": "y"}'],
    "heartbeat/rank0.json": ['{"time": "x"}', '{"pid": "x", "time": 1}', "[]"],
}
NEEDED = {"verify": ("config.json", "measurement.json"), "status": ("config.json",), "report": ()}
REPORT_WARNS = ("config.json", "measurement.json", "run_info.json", "metrics.jsonl")
WHOLE = ("config.json", "measurement.json")  # one bad field (FIELDS) spoils the whole file
"""Files whose damage `report` names in a warning line and on the page (exit 1; it showed a
damaged config.json as "config.json is missing" and exited 0 before); metrics.jsonl when
not one line of it is a record."""


def _damage(d, name, content):
    f = d / name
    f.unlink()
    if content == "<dir>":
        f.mkdir()
    elif content == "<loop>":
        os.symlink(f, f)
    else:
        f.write_bytes(content if isinstance(content, bytes) else content.encode())


FILES = (
    "config.json",
    "measurement.json",
    "metrics.jsonl",
    "run_info.json",
    "heartbeat/rank0.json",
)
# report renders plots (~1 s a case): a quarter of the damage kinds, marked slow
CASES = [
    pytest.param(
        cmd, name, c, id=f"{cmd}-{name}-{c!r}", marks=[pytest.mark.slow] if cmd == "report" else []
    )
    for cmd in NEEDED
    for name in FILES
    for c in (
        DAMAGE + FIELDS[name]
        if cmd != "report"
        else ["[]", b"\xff\xfe", "<dir>", *FIELDS[name][:2]]
    )
]


@pytest.mark.parametrize(("cmd", "name", "content"), CASES)
def test_damaged_run_file_is_one_line_or_passed_over(tmp_path, capsys, cmd, name, content):
    d = _run_dir(tmp_path)
    _damage(d, name, content)
    rc = main([cmd, str(d)])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    if rc == 2:  # refused: one line naming the damaged file
        assert len(lines) == 1 and name.split("/")[-1] in lines[0], lines
    elif rc == 1 and cmd == "report":  # written without it: one warning line naming it
        assert len(lines) == 1 and "warning" in lines[0] and name in lines[0], lines
        page = (d / "report.html").read_text(encoding="utf-8")
        assert "Incomplete report" in page and name in page
    else:  # passed over: the command did its work
        assert rc == 0 and lines == [], (rc, lines)
        assert out.strip(), "no output"
    if name in NEEDED[cmd] and content in DAMAGE:
        assert rc == 2  # a file the command cannot do without, damaged: never silent
    if cmd == "report" and name in REPORT_WARNS and (content in DAMAGE or name in WHOLE):
        assert rc == 1  # a file the report is incomplete without: never silent


@pytest.mark.parametrize("cmd", ["verify", "status", "report"])
def test_intact_run_dir_still_works(tmp_path, capsys, cmd):
    d = _run_dir(tmp_path)
    assert main([cmd, str(d)]) == 0, capsys.readouterr().err


@pytest.mark.slow
def test_output_piped_into_head_ends_quietly(tmp_path):
    """`scaletrain verify RUN | head -1`: the reader closes the pipe; exit 0, no traceback."""
    d = _run_dir(tmp_path)
    p = subprocess.run(
        f"{sys.executable} -m scaletrain verify {d} | head -1; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr and "Broken" not in p.stderr, p.stderr
    assert p.stdout.startswith("verify ")


def test_report_without_config_json_says_what_it_lacks(tmp_path, capsys):
    """metrics.jsonl alone (absent is not damaged): the curves-only page, exit 0, and the page
    says config.json is missing; damaged, the same page says why, with a warning line, exit 1."""
    d = _run_dir(tmp_path)
    (d / "config.json").unlink()
    assert main(["report", str(d)]) == 0
    assert capsys.readouterr().err == ""
    page = (d / "report.html").read_text(encoding="utf-8")
    assert "The plan cannot be shown: config.json missing" in page
    assert "Incomplete report" not in page
    (d / "config.json").write_text("{bad")
    assert main(["report", str(d)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "config.json (not JSON" in lines[0] and "no plan" in lines[0]
    page = (d / "report.html").read_text(encoding="utf-8")
    assert "The plan cannot be shown: config.json not JSON" in page
    assert "Incomplete report" in page


RUN_INFO_FIELDS = [
    {"val_loss": "x"},  # was a ValueError traceback in report (format code 'f' on a str)
    {"eval": 5},  # was an AttributeError traceback
    {"eval": {"a": {"val_loss": "x", "ppl": None}}},
    {"final_loss": "x", "rollbacks": {"a": 1}, "skipped_steps": "many", "steps": -5},
    {"phases_s": "x", "phases_written_unix": "soon"},  # the phase clock's totals
    {"phases_s": {"train": "inf", "x": None}},
    {"phases_s": [1, 2]},
]


@pytest.mark.parametrize("cmd", ["status", "verify", "report"])
@pytest.mark.parametrize("fields", RUN_INFO_FIELDS, ids=[json.dumps(f) for f in RUN_INFO_FIELDS])
def test_run_info_fields_of_the_wrong_type_are_passed_over(tmp_path, capsys, cmd, fields):
    """run_info.json is optional everywhere: a field of the wrong kind is passed over (the
    report's headline then shows what metrics.jsonl says, never the garbage)."""
    d = _run_dir(tmp_path)
    (d / "run_info.json").write_text(json.dumps({"steps": 2, "world_size": 1, **fields}))
    assert main([cmd, str(d)]) == 0
    assert capsys.readouterr().err == ""
    if cmd == "report":
        page = (d / "report.html").read_text(encoding="utf-8")
        for shown in ("<b>many</b>", "<b>-5</b>", "&#x27;a&#x27;", "<b>x</b>"):
            assert shown not in page
