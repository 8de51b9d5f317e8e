"""data.eval_sources: parsing (one-line errors naming the setting), per-source checksummed
shards tokenized like a training source, batches chosen like validation's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scaletrain.config import ConfigError, DataConfig, load_config
from scaletrain.config.sources import parse_eval_sources
from scaletrain.data import build_data


def _jsonl(path, docs):
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def _cfg(tmp_path, **kw):
    return DataConfig(num_tokens=20_000, cache_dir=str(tmp_path / "cache"), **kw)


def _refusal(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert e.value.field == "data.eval_sources" and "\n" not in str(e.value)
    return e.value


def test_entries_are_named_files_folders_and_globs(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", ["one doc"])
    (tmp_path / "dir").mkdir()
    b = _jsonl(tmp_path / "dir" / "b.jsonl", ["two"])
    c = tmp_path / "dir" / "c.txt"
    c.write_text("three")
    got = parse_eval_sources(f" wiki = {a}, code={tmp_path / 'dir'} ,all={tmp_path}/**/*.jsonl ")
    assert [(e.name, e.files) for e in got] == [("wiki", (a,)), ("code", (b, c)), ("all", (a, b))]
    assert parse_eval_sources("") == [] and DataConfig().eval_sources == ""


def test_bad_entries_are_one_line_naming_the_setting(tmp_path):
    good = _jsonl(tmp_path / "good.jsonl", ["text"])
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "nothing").mkdir()
    (tmp_path / "nothing" / "notes.md").write_text("not a source format")
    cases = {
        f"x={tmp_path / 'missing.jsonl'}": "no such file",
        f"x={good}, x={good}": "used twice",
        f"x={tmp_path / 'empty.jsonl'}": "empty",
        f"x={tmp_path / 'nothing'}": "holds no",
        f"x={tmp_path / 'none*.jsonl'}": "matches no",
        str(good): "name=path",
        "x=": "name=path",
        f"a b={good}": "letters, digits",
        " , ": "name=path",
    }
    for spec, words in cases.items():
        err = _refusal([f"--data.eval_sources={spec}"])
        assert words in str(err), (spec, str(err))
    err = _refusal([f"--data.eval_sources=x={good}", "--data.format=sft"])
    assert "sft" in str(err)


def test_set_too_short_for_one_window_or_malformed_names_the_entry(tmp_path):
    short = _jsonl(tmp_path / "short.jsonl", ["tiny"])  # 5 byte tokens with the separator
    with pytest.raises(ConfigError) as e:
        build_data(_cfg(tmp_path, eval_sources=f"s={short}"), seq_len=16, micro_batch=2)
    assert e.value.field == "data.eval_sources" and e.value.value == f"s={short}"
    assert "17" in e.value.fix
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine " * 20}) + "\n{oops\n")
    with pytest.raises(ConfigError) as e:
        build_data(_cfg(tmp_path, eval_sources=f"b={bad}"), seq_len=16, micro_batch=2)
    assert (e.value.field, e.value.value) == ("data.eval_sources", f"{bad}:2")


def test_shard_holds_the_documents_and_separators_and_is_checksummed(tmp_path):
    docs = [f"document number {i} says hello" for i in range(40)]
    src = _jsonl(tmp_path / "e.jsonl", docs)
    cfg = _cfg(tmp_path, eval_sources=f"e={src}")
    with build_data(cfg, seq_len=16, micro_batch=2) as b:
        assert b.eval_names == ["e"]
        tokens = b._eval_samplers["e"].val
        want = [x for d in docs for x in [*d.encode(), ord("\n")]]  # byte ids, newline after each
        assert tokens.tolist() == want
        directory = b.shard_dir.parent
    shard = next(directory.glob("eval-e-*"))
    raw = bytearray((shard / "tokens.bin").read_bytes())
    raw[4] ^= 1
    (shard / "tokens.bin").write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match="checksum"):
        build_data(cfg, seq_len=16, micro_batch=2)


@pytest.mark.parametrize("dp_size", [1, 2])
def test_batches_are_validation_windows_sliced_over_dp_ranks(tmp_path, dp_size):
    """Rank r's batch i holds windows i*micro*dp + r*micro ..., at stride seq_len from the set's
    start, wrapping around its windows: the rule validation uses."""
    text = "abcdefghijklmnopqrstuvwxyz" * 4  # 104 chars + newline: 105 byte tokens, 6 windows
    src = tmp_path / "t.txt"
    src.write_text(text)
    ids = np.frombuffer((text + "\n").encode(), dtype=np.uint8).astype(np.int64)
    seq, micro = 17, 2
    num_windows = (len(ids) - 1) // seq
    for rank in range(dp_size):
        cfg = _cfg(tmp_path, eval_sources=f"t={src}")
        with build_data(cfg, seq_len=seq, micro_batch=micro, dp_rank=rank, dp_size=dp_size) as b:
            batches = b.eval_batches(3)["t"]
        for i, (x, y) in enumerate(batches):
            first = i * micro * dp_size + rank * micro
            for row, w in enumerate(range(first, first + micro)):
                start = (w % num_windows) * seq
                assert x[row].tolist() == ids[start : start + seq].tolist()
                assert y[row].tolist() == ids[start + 1 : start + seq + 1].tolist()


def test_mixture_components_are_named_and_scored_on_their_validation_parts(tmp_path):
    from scaletrain.config.sources import parse_sources

    web = _jsonl(tmp_path / "web.jsonl", [f"web page {i}." for i in range(400)])
    (tmp_path / "books").mkdir()
    _jsonl(tmp_path / "books" / "b.jsonl", [f"book line {i}." for i in range(400)])
    tiny = _jsonl(tmp_path / "tiny.jsonl", ["x"] * 20)
    # named by the path (suffixes dropped), or given; a repeated name gets its position
    got = parse_sources(f"{web}@2, {tmp_path / 'books'}/ @1,code = {web}@1, {web}")
    assert [(e.name, e.weight) for e in got] == [
        ("web", 2.0),
        ("books", 1.0),
        ("code", 1.0),
        ("web-3", 1.0),
    ]
    with pytest.raises(ConfigError, match="used twice"):
        parse_sources(f"a={web}, a={tiny}")
    refusal = _refusal([f"--data.source={web}, {tiny}", f"--data.eval_sources=web={tiny}"])
    assert "component" in str(refusal)
    spec = f"{web}@2, books={tmp_path / 'books'}@1, {tiny}@1"
    with build_data(_cfg(tmp_path, source=spec, val_fraction=0.1), seq_len=16, micro_batch=2) as b:
        # the validation split is the components' parts in order; tiny's is under one window
        counts = b._shards.meta["val_parts"]
        assert len(counts) == 3 and sum(counts) == len(b._shards.val) and counts[2] < 17
        assert b.eval_names == ["web", "books"] and "tiny" in b.describe()
        val = np.asarray(b._shards.val)
        for name, start in (("web", 0), ("books", counts[0])):
            (x, y), *_ = b.eval_batches(1)[name]
            assert x[0].tolist() == val[start : start + 16].tolist()
            assert y[0].tolist() == val[start + 1 : start + 17].tolist()
    with build_data(_cfg(tmp_path, source=str(web)), seq_len=16, micro_batch=2) as b:
        assert b.eval_names == []  # a single source: its loss is val_loss
