"""Data faults: missing or malformed sources, non-UTF-8 text, corrupt or truncated cached shards,
a tokenizer that does not match its shards. Each is one line naming the file (and the line or
byte where it helps), raised before training; byte-tokenized text is kept byte-exact."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

from scaletrain.config import ConfigError, load_config
from scaletrain.data.shards import load_or_build_shards

TEXT = "the quick brown fox jumps over the lazy dog.\n" * 200  # ~9 KB


def _cfg(tmp_path: Path, source: str, *extra: str):
    return load_config(
        None,
        [
            f"--data.source={source}",
            f"--data.cache_dir={tmp_path / 'c'}",
            "--data.val_fraction=0.1",
            *extra,
        ],
    ).data


def _load(cfg):
    return load_or_build_shards(cfg, train_need=64, val_need=16)


def _refused(cfg, *needles: str) -> str:
    with pytest.raises(ConfigError) as e:
        _load(cfg)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def _jsonl(tmp_path: Path, lines: list[str], name: str = "d.jsonl") -> Path:
    f = tmp_path / name
    f.write_text("".join(line + "\n" for line in lines))
    return f


GOOD = json.dumps({"text": TEXT})


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        ([GOOD, "{not json"], "d.jsonl:2"),
        ([GOOD, GOOD, '{"text": "a"'], "d.jsonl:3"),
        ([GOOD, "[1, 2]"], "d.jsonl:2"),
        ([GOOD, '"just a string"'], "d.jsonl:2"),
        ([GOOD, '{"body": "x"}'], "d.jsonl:2"),
        ([GOOD, '{"text": 5}'], "d.jsonl:2"),
        ([GOOD, '{"text": null}'], "d.jsonl:2"),
        ([GOOD, '{"text": ["a"]}'], "d.jsonl:2"),
        ([GOOD, "NaN"], "d.jsonl:2"),
        ([GOOD, '{"text": "a", }'], "d.jsonl:2"),
        # a lone UTF-16 surrogate escape parses to a str no tokenizer encodes (was a traceback)
        ([GOOD, '{"text": "a\\ud800b"}'], "d.jsonl:2"),
        ([GOOD, '{"text": "\\udfff"}'], "surrogate"),
    ],
)
def test_malformed_jsonl_line_names_file_and_line(tmp_path, lines, needle):
    _refused(_cfg(tmp_path, str(_jsonl(tmp_path, lines))), needle)


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_non_utf8_jsonl_names_file_and_line(tmp_path, tokenizer):
    f = tmp_path / "d.jsonl"
    f.write_bytes((GOOD + "\n").encode() + b'{"text": "caf\xe9"}\n')
    _refused(_cfg(tmp_path, str(f), f"--data.tokenizer={tokenizer}"), "d.jsonl:2", "UTF-8")


@pytest.mark.parametrize("tokenizer", ["bpe", "char"])
def test_non_utf8_text_is_refused_naming_the_byte(tmp_path, tokenizer):
    f = tmp_path / "t.txt"
    f.write_bytes(TEXT.encode() + b"caf\xe9 \xff\xfe\n" + TEXT.encode())
    _refused(
        _cfg(tmp_path, str(f), f"--data.tokenizer={tokenizer}"),
        "t.txt",
        "UTF-8",
        f"byte {len(TEXT) + 3}",
    )


def test_byte_tokenizer_keeps_non_utf8_text_byte_exact(tmp_path):
    raw = TEXT.encode() + b"caf\xe9 \xff\xfe\x00\n" + TEXT.encode()
    (tmp_path / "t.txt").write_bytes(raw)
    s = _load(_cfg(tmp_path, str(tmp_path / "t.txt")))
    got = bytes(np.concatenate([np.asarray(s.train), np.asarray(s.val)]).astype(np.uint8))
    assert got == raw  # no U+FFFD: every byte is a token


def test_gzip_jsonl_that_is_not_gzip(tmp_path):
    f = tmp_path / "d.jsonl.gz"
    f.write_bytes(b"this is not gzip data at all" * 100)
    _refused(_cfg(tmp_path, str(f)), "d.jsonl.gz")


def test_truncated_gzip_jsonl(tmp_path):
    f = tmp_path / "d.jsonl.gz"
    data = gzip.compress(("\n".join([GOOD] * 20) + "\n").encode())
    f.write_bytes(data[: len(data) // 2])
    _refused(_cfg(tmp_path, str(f)), "d.jsonl.gz")


def test_parquet_without_the_text_column(tmp_path):
    f = tmp_path / "d.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"body": [TEXT] * 4}), f)
    except ImportError:  # then the file is refused for needing pyarrow, still one line
        f.write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    _refused(_cfg(tmp_path, str(f)), "d.parquet")


def test_parquet_that_is_not_parquet(tmp_path):
    f = tmp_path / "d.parquet"
    f.write_bytes(b"not a parquet file" * 100)
    _refused(_cfg(tmp_path, str(f)), "d.parquet")


@pytest.mark.parametrize("source", ["missing.txt", "nodir/", "*.nothing", "a.txt@0.5, b.txt"])
def test_missing_source_is_refused_at_parse_time(tmp_path, source):
    (tmp_path / "a.txt").write_text(TEXT)
    with pytest.raises(ConfigError) as e:
        _cfg(
            tmp_path,
            str(tmp_path / source)
            if "," not in source
            else f"{tmp_path / 'a.txt'}@0.5, {tmp_path / 'b.txt'}",
        )
    assert e.value.field == "data.source" and "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_source_that_is_not_a_regular_file_is_refused_not_read(tmp_path, kind):
    # a named pipe blocks its reader forever and /dev/zero never ends: neither may be opened
    src = tmp_path / "corpus.txt"
    if kind == "fifo":
        os.mkfifo(src)
    else:
        src.symlink_to("/dev/zero")
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, str(src))
    msg = str(e.value)
    assert e.value.field == "data.source" and "\n" not in msg
    assert "not a regular file" in msg, msg


@pytest.mark.parametrize("content", [b"", b"hi\n"])
def test_too_little_text(tmp_path, content):
    (tmp_path / "t.txt").write_bytes(content)
    _refused(_cfg(tmp_path, str(tmp_path / "t.txt")), "data.source")


def test_bin_source_with_a_partial_token(tmp_path):
    f = tmp_path / "ids.bin"
    f.write_bytes((np.arange(500) % 256).astype(np.uint16).tobytes() + b"\x01")  # odd
    _refused(_cfg(tmp_path, str(f)), "ids.bin")


# ---- cached shards ---------------------------------------------------------------------------


def _built(tmp_path: Path, source: str = "txt", *extra: str):
    if source == "txt":
        (tmp_path / "t.txt").write_text(TEXT)
        cfg = _cfg(tmp_path, str(tmp_path / "t.txt"), *extra)
    else:
        cfg = _cfg(tmp_path, str(_jsonl(tmp_path, [GOOD] * 3)), *extra)
    s = _load(cfg)
    return cfg, s.directory


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-3])


def _flip(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x55
    p.write_bytes(bytes(b))


def _grow(p: Path) -> None:
    p.write_bytes(p.read_bytes() + b"\0\0")


def _delete(p: Path) -> None:
    p.unlink()


def _garbage(p: Path) -> None:
    p.write_bytes(b"\x00garbage{")


def _drop_keys(p: Path) -> None:
    p.write_text(json.dumps({"tokenizer": "byte"}))


def _json_list(p: Path) -> None:
    p.write_text("[1, 2, 3]")


@pytest.mark.parametrize("source", ["txt", "jsonl"])
@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("train.bin", _truncate),
        ("train.bin", _flip),
        ("train.bin", _grow),
        ("train.bin", _delete),
        ("val.bin", _truncate),
        ("val.bin", _flip),
        ("val.bin", _delete),
        ("meta.json", _garbage),
        ("meta.json", _drop_keys),
        ("meta.json", _json_list),
    ],
)
def test_damaged_cached_shard_is_one_line_naming_it(tmp_path, source, name, damage):
    cfg, d = _built(tmp_path, source)
    damage(d / name)
    _refused(cfg, "data.cache_dir", name, "delete")


@pytest.mark.parametrize("source", ["txt", "jsonl"])
def test_tokenizer_that_does_not_match_its_shards(tmp_path, source):
    cfg, d = _built(tmp_path, source, "--data.tokenizer=bpe", "--data.bpe_vocab_size=300")
    tok = d / "bpe.json"
    vocab = json.loads(tok.read_text())
    vocab["model"]["vocab"] = dict(list(vocab["model"]["vocab"].items())[:100])
    vocab["model"]["merges"] = []
    tok.write_text(json.dumps(vocab))
    _refused(cfg, "data.cache_dir", "tokenizer", "bpe.json")
