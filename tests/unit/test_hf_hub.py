"""Hub ids (`org/name`) read from the local Hugging Face cache, with the network cut off:
`--model`, `checkpoint.init_from` and `data.tokenizer` resolve to the cached snapshot; a model
that is not cached, an id that is not a hub id and a damaged cache entry are one line each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open

from scaletrain.checkpoint.hf_load import load_hf_weights
from scaletrain.cli import main
from scaletrain.config import ConfigError, load_config, model_from_hf_config, resolve_model
from scaletrain.config.hub import hub_cache_dir, hub_snapshot, is_hub_id
from scaletrain.config.sources import resolve_tokenizer_file
from scaletrain.models import build_model
from tests._hf_hub import put_in_hub_cache
from tests._hf_models import make_hf_model, make_tokenizer_dir

pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

REPO = "acme/tiny-llama"
_HF_VARS = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


class _NetworkUsed(AssertionError):
    pass


def _no_network(*_a, **_k):
    raise _NetworkUsed("a hub id was resolved over the network")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Every test here runs with sockets unable to connect or resolve a name."""
    monkeypatch.setattr(socket.socket, "connect", _no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", _no_network)
    monkeypatch.setattr(socket, "create_connection", _no_network)
    monkeypatch.setattr(socket, "getaddrinfo", _no_network)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Llama saved by transformers with its tokenizer, and a hub cache holding it under
    HF_HOME/hub (HF_HOME's layout; HF_HUB_CACHE pointed at it directly in most tests)."""
    root = tmp_path_factory.mktemp("hub")
    model_dir = make_hf_model("llama", root / "model")
    make_tokenizer_dir(model_dir, ["alpha beta gamma delta"] * 20, vocab_size=100)
    cache = root / "hf_home" / "hub"
    snapshot = put_in_hub_cache(model_dir, cache, REPO)
    return {"dir": model_dir, "home": root / "hf_home", "cache": cache, "snapshot": snapshot}


@pytest.fixture
def cache(saved, monkeypatch):
    for k in _HF_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(saved["cache"]))
    return saved["cache"]


def test_the_network_is_cut_off():
    with pytest.raises(_NetworkUsed):
        socket.create_connection(("huggingface.co", 443))


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"HF_HOME": "{tmp}/home"},
        {"HF_HOME": "~/hf"},
        {"XDG_CACHE_HOME": "{tmp}/xdg"},
        {"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy", "HF_HOME": "{tmp}/home"},
        {"HF_HUB_CACHE": "{tmp}/hub", "HUGGINGFACE_HUB_CACHE": "{tmp}/legacy"},
    ],
    ids=["default", "hf_home", "hf_home_tilde", "xdg", "legacy", "hf_hub_cache"],
)
def test_cache_dir_is_the_one_huggingface_hub_uses(env, tmp_path, monkeypatch):
    """The place searched is where `hf download` puts models: huggingface_hub's own constant,
    read in a fresh interpreter with the same environment."""
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    clean = {k: v for k, v in os.environ.items() if k not in _HF_VARS}
    clean.update(env, HOME=str(tmp_path))
    theirs = subprocess.run(
        [sys.executable, "-c", "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"],
        env=clean,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for k in _HF_VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in {**env, "HOME": str(tmp_path)}.items():
        monkeypatch.setenv(k, v)
    assert str(hub_cache_dir()) == theirs


def test_model_init_from_and_tokenizer_resolve_from_the_cache(saved, cache, tmp_path):
    cfg = resolve_model(REPO)
    assert cfg.name == REPO  # the id, not the snapshot's path, is what plans print
    assert cfg == replace(model_from_hf_config(saved["dir"]), name=REPO)
    assert resolve_tokenizer_file(REPO) == saved["snapshot"] / "tokenizer.json"

    job = load_config(
        None,
        [
            f"--checkpoint.init_from={REPO}",
            f"--data.tokenizer={REPO}",
            "--batch.seq_len=32",
            f"--train.run_dir={tmp_path / 'run'}",
        ],
    )
    assert job.model == cfg
    torch.manual_seed(0)
    model = build_model(cfg, device="cpu")
    assert load_hf_weights(model, cfg, REPO) == len(list(model.parameters()))
    with safe_open(str(saved["dir"] / "model.safetensors"), framework="pt") as f:
        want = f.get_tensor("model.layers.1.mlp.down_proj.weight")
    torch.testing.assert_close(model.layers["1"].feed_forward.w2.weight.data, want, rtol=0, atol=0)


def test_hf_home_layout_is_searched(saved, monkeypatch):
    for k in _HF_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HOME", str(saved["home"]))
    assert hub_snapshot(REPO, "model.name") == saved["snapshot"]


def test_plan_and_dryrun_take_a_hub_id(cache, capsys):
    assert main(["plan", "--model", REPO, "--gpus", "1", "--seq-len", "32", "--json"]) in (0, None)
    plans = json.loads(capsys.readouterr().out)
    assert plans[0]["plan"]["model"] == REPO
    assert main(["dryrun", "--model", REPO, "--gpus", "1", "--seq-len", "32"]) in (0, None)
    assert REPO in capsys.readouterr().out


def test_a_path_on_disk_wins_over_the_cache(saved, cache, tmp_path, monkeypatch):
    local = tmp_path / REPO
    local.mkdir(parents=True)
    hf = json.loads((saved["snapshot"] / "config.json").read_text())
    (local / "config.json").write_text(json.dumps({**hf, "num_hidden_layers": 3}))
    monkeypatch.chdir(tmp_path)
    assert not is_hub_id(REPO)
    assert resolve_model(REPO).num_layers == 3


def _one_line(e: pytest.ExceptionInfo, *needles: str) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def test_a_model_not_in_the_cache_is_one_line_saying_how_to_fetch_it(cache, tmp_path, capsys):
    missing = "acme/absent-model"
    needles = (missing, str(cache), f"hf download {missing}")
    try:
        rc = main(["plan", "--model", missing, "--gpus", "1"])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--model" in err[0], err
    assert all(n in err[0] for n in needles), err
    for field in ("checkpoint.init_from", "data.tokenizer"):
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"--{field}={missing}", "--batch.seq_len=32"])
        assert e.value.field == field
        _one_line(e, *needles)


HOSTILE = [
    "../../etc",
    "/etc/passwd",
    "/etc",
    "org/..",
    "../etc",
    "..",
    "a--b/c",
    "org/a/b",
    "~/models",
    "org/na me",
    "org/.hidden",
    "x" * 100 + "/y",
]


@pytest.mark.parametrize("spec", HOSTILE)
def test_ids_that_are_not_hub_ids_never_reach_the_cache(spec, cache):
    with pytest.raises(ConfigError) as e:
        hub_snapshot(spec, "model.name")
    _one_line(e, "hub id")


@pytest.mark.parametrize("spec", ["org/..", "a--b/c", "~/models", "org/na me"])
def test_a_malformed_id_on_the_command_line_is_one_line(spec, cache, capsys):
    try:
        rc = main(["plan", "--model", spec, "--gpus", "1"])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--model" in err[0] and "hub id" in err[0], err


def test_a_tampered_ref_cannot_lead_out_of_the_cache(saved, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snapshot = put_in_hub_cache(saved["dir"], cache, REPO)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    ref = snapshot.parents[1] / "refs" / "main"
    ref.write_text("../../../../../../etc")
    with pytest.raises(ConfigError) as e:
        resolve_model(REPO)
    _one_line(e, "commit hash", "damaged")
    ref.write_text("0" * 40)  # a commit whose snapshot is not there: not cached
    with pytest.raises(ConfigError) as e:
        resolve_model(REPO)
    _one_line(e, "no snapshot", f"hf download {REPO}")
