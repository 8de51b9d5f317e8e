"""Streamed corpora: JSONL (+gzip), parquet, globs, mixtures, pre-tokenized .bin, pretrained
tokenizers, checksummed shards, and one-line errors naming the file (and line)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from scaletrain.cli import main as cli_main
from scaletrain.config import (
    ConfigError,
    DataConfig,
    load_config,
    parse_overrides,
    split_overrides,
)
from scaletrain.config.sources import parse_sources
from scaletrain.data import build_data
from scaletrain.data.pretrained import PretrainedTokenizer
from tests._hf_models import make_tokenizer_dir

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "a",
    "cat",
    "sleeps",
]


def _docs(n: int, seed: int, prefix: str = "") -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        prefix + " ".join(rng.choice(WORDS, size=int(rng.integers(5, 40)))) + "." for _ in range(n)
    ]


def _jsonl(path, docs, field="text"):
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer_dir(tmp_path_factory.mktemp("tok"), _docs(200, 0))


def _all_ids(bundle) -> list[int]:
    sh = bundle._shards
    return [int(x) for x in sh.train] + [int(x) for x in sh.val]


def _cfg(tmp_path, **kw):
    return DataConfig(cache_dir=str(tmp_path / "cache"), val_fraction=0.1, **kw)


def test_jsonl_with_pretrained_tokenizer_puts_eos_between_documents(tmp_path, tok_dir):
    docs = _docs(300, 1)
    src = _jsonl(tmp_path / "c.jsonl", docs)
    tok = PretrainedTokenizer.load(tok_dir)
    assert tok.eos_id == tok._tok.token_to_id("<|endoftext|>") and tok.bos_id == 0
    want = [i for d in docs for i in tok.encode(d) + [tok.eos_id]]
    with build_data(
        _cfg(tmp_path, source=str(src), tokenizer=str(tok_dir)), seq_len=16, micro_batch=2
    ) as b:
        assert b.tokenizer.name == "pretrained" and b.tokenizer.vocab_size == tok.vocab_size
        assert _all_ids(b) == want
        assert len(b._shards.val) == int(len(want) * 0.1)
    # gzip gives the same shards' content; a glob over both files doubles it
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as f:
        f.write((tmp_path / "c.jsonl").read_text())
    with build_data(
        _cfg(
            tmp_path, source=str(tmp_path / "d.jsonl.gz"), tokenizer=str(tok_dir / "tokenizer.json")
        ),
        seq_len=16,
        micro_batch=2,
    ) as b:
        assert _all_ids(b) == want
    with build_data(
        _cfg(tmp_path, source=str(tmp_path / "*.jsonl*"), tokenizer=str(tok_dir)),
        seq_len=16,
        micro_batch=2,
    ) as b:
        assert sorted(_all_ids(b)) == sorted(want + want)


def test_bos_added_when_the_tokenizer_config_asks(tmp_path):
    tdir = make_tokenizer_dir(tmp_path / "tok", _docs(100, 0), add_bos=True)
    docs = _docs(200, 2)
    tok = PretrainedTokenizer.load(tdir)
    with build_data(
        _cfg(tmp_path, source=str(_jsonl(tmp_path / "c.jsonl", docs)), tokenizer=str(tdir)),
        seq_len=16,
        micro_batch=2,
    ) as b:
        assert _all_ids(b) == [i for d in docs for i in [0, *tok.encode(d), tok.eos_id]]


def test_mixture_weights_are_token_shares(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", _docs(400, 3, "A "))
    (tmp_path / "b").mkdir()
    _jsonl(tmp_path / "b" / "b.jsonl", _docs(400, 4, "B "))
    with build_data(_cfg(tmp_path, source=str(a)), seq_len=16, micro_batch=2) as b:
        n_a = len(b._shards.train)
    with build_data(_cfg(tmp_path, source=str(tmp_path / "b")), seq_len=16, micro_batch=2) as b:
        n_b = len(b._shards.train)
    spec = f"{a}@3, {tmp_path / 'b'}@1"
    with build_data(_cfg(tmp_path, source=spec), seq_len=16, micro_batch=2) as b:
        train = bytes(int(x) for x in b._shards.train).decode()
        assert len(train) == round((n_a + n_b) * 0.75) + round((n_a + n_b) * 0.25)
        head = train[: round((n_a + n_b) * 0.75)]
        assert "B " not in head and head.count("A ") > 400  # source a repeated to its share


def test_mixture_with_spaces_on_the_command_line(tmp_path, capsys):
    a = _jsonl(tmp_path / "a.jsonl", _docs(20, 3))
    (tmp_path / "b").mkdir()
    _jsonl(tmp_path / "b" / "b.jsonl", _docs(20, 4))
    spec = f"{a}@0.7, {tmp_path / 'b'}/@0.3"
    want = [(str(a), 0.7), (f"{tmp_path / 'b'}/", 0.3)]
    # quoted (one argument holding a space), unquoted (the shell splits after the comma),
    # `--key value` with the space before the comma, and a piece that starts with the comma
    lines = [
        [f"--data.source={spec}"],
        [f"--data.source={a}@0.7,", f"{tmp_path / 'b'}/@0.3"],
        ["--data.source", f"{a}@0.7", f", {tmp_path / 'b'}/@0.3"],
    ]
    for argv in lines:
        rest, overrides = split_overrides(["train", *argv, "--nproc=0"])
        assert rest == ["train", "--nproc=0"]
        entries = parse_sources(parse_overrides(overrides)["data"]["source"])
        assert [(e.pattern, e.weight) for e in entries] == want
        # through the CLI: the mixture is checked (not taken for the config file), then
        # --nproc=0 stops the run before any work
        assert cli_main(["train", *argv, "--nproc=0"]) == 2
        assert "--nproc must be >= 1" in capsys.readouterr().err
    # a config file after a trailing comma stays the config file
    assert split_overrides([f"--data.source={a},", "job.toml"]) == (
        ["job.toml"],
        [f"--data.source={a},"],
    )


def test_shards_identical_for_any_number_of_workers(tmp_path, tok_dir):
    (tmp_path / "mix").mkdir()
    _jsonl(tmp_path / "mix" / "a.jsonl", _docs(1500, 8))  # 6 batches: > 2 x workers
    b = _jsonl(tmp_path / "b.jsonl", _docs(700, 9))
    np.arange(250, dtype=np.uint16).tofile(tmp_path / "mix" / "z.bin")  # after a's batches
    got = {}
    for workers in (1, 2, 3):
        cfg = DataConfig(
            source=f"{tmp_path / 'mix'}@2, {b}@1",
            tokenizer=str(tok_dir),
            workers=workers,
            cache_dir=str(tmp_path / f"cache{workers}"),
        )
        with build_data(cfg, seq_len=16, micro_batch=2) as data:
            d = data.shard_dir
            got[workers] = [(d / n).read_bytes() for n in ("train.bin", "val.bin", "meta.json")]
    assert got[1] == got[2] == got[3]
    tok = PretrainedTokenizer.load(tok_dir)
    # the folder's tokens: a's documents, then z.bin (written after a's batches were drained);
    # its last 5% opens val.bin
    mix = [i for d in _docs(1500, 8) for i in [*tok.encode(d), tok.eos_id]] + list(range(250))
    n_val = int(len(mix) * 0.05)
    assert np.frombuffer(got[2][1], np.uint16)[:n_val].tolist() == mix[-n_val:]
    assert np.frombuffer(got[2][0], np.uint16)[:1000].tolist() == mix[:1000]
    with pytest.raises(ConfigError, match="data.workers"):
        DataConfig(workers=-1)


def test_encode_pool_keeps_order_with_a_bounded_window(tok_dir):
    from scaletrain.data.encode_pool import EncodePool, encode_rows

    tok = PretrainedTokenizer.load(tok_dir)
    batches = [[(d, True, True)] for d in _docs(40, 10)]
    seen, in_flight = [], []
    with EncodePool(tok, 2) as pool:
        for batch in batches:
            pool.submit(batch, lambda ids, docs: seen.append(ids.tolist()), field="f", where="w")
            in_flight.append(len(pool._pending))
        pool.drain()
    assert seen == [encode_rows(tok, b)[0].tolist() for b in batches]
    assert max(in_flight) == 4  # 2 x workers read ahead, never more


def test_pretokenized_bin_is_used_as_is(tmp_path, tok_dir):
    ids = np.random.default_rng(0).integers(0, 150, size=5000).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")
    cfg = _cfg(tmp_path, source=str(tmp_path / "train.bin"), tokenizer=str(tok_dir))
    with build_data(cfg, seq_len=16, micro_batch=2) as b:
        assert _all_ids(b) == ids.tolist()
    ids32 = ids.astype(np.uint32)
    ids32[7] = 70000
    ids32.tofile(tmp_path / "big.bin")
    with pytest.raises(ConfigError, match="big.bin.*70000"):
        build_data(
            _cfg(
                tmp_path,
                source=str(tmp_path / "big.bin"),
                tokenizer=str(tok_dir),
                token_dtype="uint32",
            ),
            seq_len=16,
            micro_batch=2,
        )


def test_corrupt_shard_fails_its_checksum(tmp_path, tok_dir):
    cfg = _cfg(
        tmp_path, source=str(_jsonl(tmp_path / "c.jsonl", _docs(300, 5))), tokenizer=str(tok_dir)
    )
    with build_data(cfg, seq_len=16, micro_batch=2) as b:
        path = b.shard_dir / "train.bin"
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="checksum"):
        build_data(cfg, seq_len=16, micro_batch=2)


def test_bad_inputs_name_the_file_and_line(tmp_path, tok_dir):
    good = json.dumps({"text": "fine words " * 50})
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([good, good, "{not json", good]) + "\n")
    with pytest.raises(ConfigError) as e:
        build_data(_cfg(tmp_path, source=str(bad)), seq_len=16, micro_batch=2)
    assert e.value.field == "data.source" and str(e.value.value) == f"{bad}:3"
    other = _jsonl(tmp_path / "other.jsonl", _docs(50, 6), field="content")
    with pytest.raises(ConfigError) as e:
        build_data(_cfg(tmp_path, source=str(other)), seq_len=16, micro_batch=2)
    assert e.value.field == "data.text_field" and str(e.value.value).endswith("other.jsonl:1")
    with pytest.raises(ConfigError, match="data.source"):
        DataConfig(source=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="matches no"):
        DataConfig(source=str(tmp_path / "nothing*.jsonl"))
    with pytest.raises(ConfigError, match="weight"):
        DataConfig(source=f"{other}@-1")
    with pytest.raises(ConfigError, match="data.tokenizer"):
        DataConfig(tokenizer=str(tmp_path / "no-tokenizer"))


def test_tokenizer_larger_than_model_fails_before_work(tmp_path, tok_dir):
    with pytest.raises(ConfigError) as e:
        load_config(
            None,
            ["--model.name=tiny-llama", "--model.vocab_size=100", f"--data.tokenizer={tok_dir}"],
        )
    assert e.value.field == "data.tokenizer" and "exceed model.vocab_size=100" in e.value.fix


def test_parquet_column_and_missing_column(tmp_path, tok_dir):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    docs = _docs(300, 7)
    pq.write_table(pa.table({"body": docs}), tmp_path / "c.parquet")
    tok = PretrainedTokenizer.load(tok_dir)
    with build_data(
        _cfg(
            tmp_path, source=str(tmp_path / "c.parquet"), tokenizer=str(tok_dir), text_field="body"
        ),
        seq_len=16,
        micro_batch=2,
    ) as b:
        assert _all_ids(b) == [i for d in docs for i in tok.encode(d) + [tok.eos_id]]
    with pytest.raises(ConfigError, match="no column 'text'"):
        build_data(
            _cfg(tmp_path, source=str(tmp_path / "c.parquet"), tokenizer=str(tok_dir)),
            seq_len=16,
            micro_batch=2,
        )
