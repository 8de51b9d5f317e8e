"""`scaletrain data check PATH --index-only` (`data/check.py`): a pre-tokenized corpus checked
from its headers, sizes and indexes, reading the same bytes whatever its size (a 1 TiB sparse
Megatron .bin reads what a 1 KiB one does: counted, not timed), indexes larger than the budget
checked in seeded blocks, sampled windows of ids, and every damaged file one line naming it."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from scaletrain.cli import main as cli_main
from scaletrain.config import ConfigError, DataConfig
from scaletrain.data import build_data
from scaletrain.data.check import ByteCounter, check_corpus
from tests._hf_models import make_tokenizer_dir
from tests.unit.test_data_datatrove import write_ds
from tests.unit.test_data_megatron import CODES, _docs, write_megatron

TiB = 1 << 40


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer_dir(tmp_path_factory.mktemp("tok"), _docs(200, 0))


def _megatron_sized(prefix: Path, num_seq: int, seq_len: int, *, docs: int) -> Path:
    """A Megatron dataset of `num_seq` sequences of `seq_len` uint16 ids in `docs` documents
    whose .bin is a sparse file (zeros, no blocks on disk): any size costs nothing to make."""
    item = 2
    lengths = np.full(num_seq, seq_len, np.int32)
    pointers = np.arange(num_seq, dtype=np.int64) * seq_len * item
    doc_idx = np.linspace(0, num_seq, docs + 1).astype(np.int64)
    head = struct.pack("<9sQBQQ", b"MMIDIDX\x00\x00", 1, CODES[np.uint16], num_seq, docs + 1)
    prefix.with_suffix(".idx").write_bytes(
        head + lengths.tobytes() + pointers.tobytes() + doc_idx.tobytes()
    )
    with open(prefix.with_suffix(".bin"), "wb") as f:
        try:
            f.truncate(num_seq * seq_len * item)
        except OSError as e:  # a filesystem without sparse files this large
            pytest.skip(f"cannot make a sparse file of {num_seq * seq_len * item} bytes: {e}")
    return prefix.with_suffix(".bin")


def _read(spec, **kw) -> tuple[int, object]:
    counter = ByteCounter()
    result = check_corpus(str(spec), counter=counter, **kw)
    assert result.bytes_read == counter.bytes_read
    return counter.bytes_read, result


def test_index_only_reads_the_same_bytes_for_a_kib_and_a_tib_corpus(tmp_path, tok_dir, capsys):
    small = _megatron_sized(tmp_path / "small", 512, 1, docs=64)  # 1 KiB of ids
    big = _megatron_sized(tmp_path / "big", 512, 1 << 30, docs=64)  # 1 TiB of ids (sparse)
    assert big.stat().st_size == TiB and small.stat().st_size == 1024
    index = 512 * 12 + 65 * 8
    for sample in (0, 8):
        kw = {"tokenizer": str(tok_dir), "sample": sample, "window": 64}
        n_small, r_small = _read(small, **kw)
        n_big, r_big = _read(big, **kw)
        assert not r_small.bad and not r_big.bad
        assert n_big == n_small  # nothing read grows with the ids
        # the header, the index body once, a few endpoint entries, and the windows' ids
        windows = 8 * 64 * 2 if sample else 0
        assert index + windows < n_big <= index + windows + 256, n_big
        (rep,) = r_big.files
        assert rep.num_tokens == TiB // 2 and rep.index_checked == rep.index_bytes == index
        assert rep.windows == sample and (rep.max_id == 0 if sample else rep.max_id is None)
    assert cli_main(["data", "check", str(big), "--index-only", "--sample", "4"]) == 0
    out = capsys.readouterr().out
    assert "index read whole" in out and "1,024.0 GiB" in out and "0 bad" in out, out


def test_an_index_over_the_budget_is_checked_in_seeded_blocks(tmp_path):
    path = _megatron_sized(tmp_path / "m", 200_000, 3, docs=100_000)
    whole = 200_000 * 12 + 100_001 * 8
    budget = 64 << 10
    n, result = _read(path, index_budget=budget, seed=3)
    (rep,) = result.files
    assert rep.problem is None and 0 < rep.index_checked <= budget < whole
    assert n <= budget + 8 * 12 + 256  # blocks' extra next pointer and the endpoints
    n_again, again = _read(path, index_budget=budget, seed=3)
    assert (n_again, again.files[0].index_checked) == (n, rep.index_checked)
    n_all, every = _read(path, index_budget=whole)
    assert every.files[0].index_checked == whole and n_all > whole


def _flip_idx(path: Path, offset: int, value: bytes) -> None:
    idx = path.with_suffix(".idx")
    raw = bytearray(idx.read_bytes())
    raw[offset : offset + len(value)] = value
    idx.write_bytes(bytes(raw))


def test_a_fault_anywhere_is_found_by_the_whole_check_and_in_a_drawn_block(tmp_path):
    path = _megatron_sized(tmp_path / "m", 200_000, 3, docs=10)
    pointer = 34 + 4 * 200_000 + 8 * 150_000  # sequence 150,000 no longer follows 149,999
    _flip_idx(path, pointer, struct.pack("<q", 7))
    full = check_corpus(str(path), index_only=False).files[0].problem
    assert full is not None and "m.idx" in full and "back to back" in full
    budget = (200_000 * 12 + 11 * 8) // 2  # half the index: half the blocks drawn
    found = [
        check_corpus(str(path), index_budget=budget, seed=s).files[0].problem for s in range(40)
    ]
    hit = [p for p in found if p is not None]
    # each seed draws its own blocks: about half reach the damaged one (all 40 missing it, or
    # all 40 drawing it, has odds of 2^-40 each), each naming the file
    assert hit and len(hit) < len(found)
    assert all("m.idx" in p and "\n" not in p for p in hit)


def _bad_line(capsys, argv: list[str], name: str) -> str:
    assert cli_main(["data", "check", *argv]) == 1
    out = capsys.readouterr().out.splitlines()
    bad = [line for line in out if line.startswith("BAD")]
    assert len(bad) == 1 and name in bad[0], out
    return bad[0]


@pytest.mark.parametrize(
    ("offset", "value", "name", "says"),
    [
        (0, b"NOTMAGIC!", "m.idx", "header"),
        (9, struct.pack("<Q", 2), "m.idx", "version 2"),
        (17, bytes([6]), "m.idx", "dtype code 6"),
        (34, struct.pack("<i", -3), "m.idx", "negative sequence length"),
        (34 + 4, struct.pack("<i", 3), "m.idx", "back to back"),
        (34 + 4 * 4, struct.pack("<q", 5), "m.idx", "sequence 0 points"),
        (34 + 12 * 4 + 8, struct.pack("<q", 4), "m.idx", "document indices"),
    ],
)
def test_a_damaged_megatron_index_is_one_line_naming_it(
    tmp_path, capsys, offset, value, name, says
):
    path = write_megatron(tmp_path / "m", [[[1, 2, 3], [4, 5]], [[6, 7]], [[8, 9, 10]]])
    _flip_idx(path, offset, value)
    assert says in _bad_line(capsys, [str(path), "--index-only"], name)


def test_sizes_and_ids_against_the_files_and_the_tokenizer(tmp_path, tok_dir, capsys):
    good = write_megatron(tmp_path / "good", [[[1, 2, 3]], [[4, 5]]])
    short = write_megatron(tmp_path / "short", [[[1, 2, 3]], [[4, 5]]])
    short.write_bytes(short.read_bytes()[:-2])
    line = _bad_line(capsys, [str(short), "--index-only"], "short.bin")
    assert "last sequence ends at byte 10" in line
    trunc = write_megatron(tmp_path / "trunc", [[[1, 2, 3]], [[4, 5]]])
    trunc.with_suffix(".idx").write_bytes(trunc.with_suffix(".idx").read_bytes()[:-1])
    assert "truncated" in _bad_line(capsys, [str(trunc), "--index-only"], "trunc.idx")
    # ids past the vocabulary: every window finds them, as the whole check does
    high = write_megatron(tmp_path / "high", [[[300] * 50]] * 4)
    tok = ["--tokenizer", str(tok_dir)]
    assert cli_main(["data", "check", str(high), "--index-only", *tok]) == 0  # ids unread
    capsys.readouterr()
    for mode in (["--index-only", "--sample", "2", "--window", "8"], []):
        assert "holds id 300" in _bad_line(capsys, [str(high), *tok, *mode], "high.bin")
    # a type too narrow for the tokenizer: written by another one
    narrow = write_megatron(tmp_path / "narrow", [[[1, 2, 3]]], dtype=np.uint8)
    line = _bad_line(capsys, [str(narrow), "--index-only", *tok], "narrow.bin")
    assert "uint8 ids reach 255" in line and "written with another tokenizer" in line
    # a folder: each file its own line, the bad ones named, exit 1
    assert cli_main(["data", "check", str(tmp_path), "--index-only"]) == 1
    out = capsys.readouterr().out
    assert f"ok   {good}" in out and out.count("BAD") == 2, out  # short, trunc


def test_datatrove_files(tmp_path, capsys):
    ds = tmp_path / "ds"
    ds.mkdir()
    write_ds(ds / "a.ds", [[1, 2, 3], [4, 5]])
    write_ds(ds / "b.ds", [[6, 7]], token_size=4)
    n, result = _read(ds, sample=3, window=2)
    assert not result.bad and [f.dtype for f in result.files] == ["uint16", "uint32"]
    assert [f.num_documents for f in result.files] == [2, 1]
    write_ds(ds / "c.ds", [[1, 2, 3], [4, 5]])
    Path(f"{ds}/c.ds.index").write_bytes(np.array([4, 3, 5], "<u8").tobytes())  # ends fall
    assert "fall" in _bad_line(capsys, [str(ds), "--index-only"], "c.ds.index")
    Path(f"{ds}/c.ds.index").write_bytes(np.array([3, 4], "<u8").tobytes())  # last end short
    assert "does not end at 5" in _bad_line(capsys, [str(ds), "--index-only"], "c.ds.index")
    Path(f"{ds}/c.ds.index").write_bytes(np.array([3, 5], "<u8").tobytes())
    Path(f"{ds}/c.ds.metadata").write_text("tok|2\n9\n")
    assert "counts 9" in _bad_line(capsys, [str(ds), "--index-only"], "c.ds")


def test_our_shard_directory_checked_from_its_meta_and_sizes(tmp_path, capsys):
    cfg = DataConfig(cache_dir=str(tmp_path / "cache"), num_tokens=20_000)
    with build_data(cfg, seq_len=16, micro_batch=2) as b:
        shard = b.shard_dir
    n, result = _read(shard)  # index-only: meta.json and sizes; no id read
    (rep,) = result.files
    assert n == 0 and rep.problem is None and rep.kind == "shards"
    assert rep.num_tokens == b.num_train_tokens + b.num_val_tokens
    n, result = _read(shard, sample=4, window=32)
    assert n == 4 * 32 * np.dtype(rep.dtype).itemsize and result.files[0].max_id is not None
    assert cli_main(["data", "check", str(shard)]) == 0  # the whole check: sha256s
    capsys.readouterr()
    val = shard / "val.bin"
    raw = bytearray(val.read_bytes())
    raw[0] ^= 1
    val.write_bytes(bytes(raw))
    assert cli_main(["data", "check", str(shard), "--index-only"]) == 0  # same size
    capsys.readouterr()
    assert "sha256" in _bad_line(capsys, [str(shard)], "val.bin")
    val.write_bytes(bytes(raw[:-1]))
    assert "truncated" in _bad_line(capsys, [str(shard), "--index-only"], "val.bin")


def test_megatron_cores_own_output_passes(tmp_path, tok_dir):
    pytest.importorskip("megatron.core.datasets.indexed_dataset")
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(tmp_path / "c.bin"), dtype=np.uint16)
    for doc in ([1, 2, 3], [4, 5], [6]):
        builder.add_item(torch.tensor(doc))
        builder.end_document()
    builder.finalize(str(tmp_path / "c.idx"))
    for index_only in (True, False):
        result = check_corpus(str(tmp_path / "c"), tokenizer=str(tok_dir), index_only=index_only)
        (rep,) = result.files
        assert rep.problem is None and (rep.num_tokens, rep.num_documents) == (6, 3)


def test_bad_arguments_are_one_line_before_any_read(tmp_path, capsys):
    text = tmp_path / "c.jsonl"
    text.write_text(json.dumps({"text": "hi"}) + "\n")
    with pytest.raises(ConfigError) as e:
        check_corpus(str(text))
    assert "not a pre-tokenized dataset" in str(e.value) and "c.jsonl" in str(e.value)
    assert cli_main(["data", "check", str(tmp_path / "nope"), "--index-only"]) == 2
    assert cli_main(["data", "check", str(text), "--sample", "-1"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "--sample" in err
