"""Megatron-LM indexed datasets (`.bin` + `.idx`) as `data.source`: the same ids, document
boundaries and step-1 loss as the same corpus ingested from JSONL; malformed files are one line
naming the file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from scaletrain.config import ConfigError, DataConfig, load_config
from scaletrain.data import build_data
from scaletrain.data.megatron import iter_document_ids, read_index
from scaletrain.data.pretrained import PretrainedTokenizer
from tests._hf_models import make_tokenizer_dir

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "the",
    "cat",
    "sleeps",
]
# megatron-core's DType codes (megatron/core/datasets/indexed_dataset.py)
CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 8}


def _docs(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 30)))) + "." for _ in range(n)]


def write_megatron(
    prefix: Path, documents: list[list[list[int]]], dtype=np.uint16, *, version: int = 1
) -> Path:
    """A test writer of the format (each document a list of sequences of ids), laid out as
    megatron-core's `_IndexWriter` lays it out; returns the .bin path."""
    lengths = [len(s) for d in documents for s in d]
    item = np.dtype(dtype).itemsize
    pointers = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64) * item
    doc_idx = np.concatenate(([0], np.cumsum([len(d) for d in documents]))).astype(np.int64)
    flat = [t for d in documents for s in d for t in s]
    prefix.with_suffix(".bin").write_bytes(np.asarray(flat, dtype=dtype).tobytes())
    head = struct.pack(
        "<9sQBQQ", b"MMIDIDX\x00\x00", version, CODES[dtype], len(lengths), len(doc_idx)
    )
    prefix.with_suffix(".idx").write_bytes(
        head
        + np.asarray(lengths, np.int32).tobytes()
        + pointers[: len(lengths)].tobytes()
        + doc_idx.tobytes()
    )
    return prefix.with_suffix(".bin")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer_dir(tmp_path_factory.mktemp("tok"), _docs(200, 0))


def _as_megatron(tok, docs, *, append_eod: bool, split: bool) -> list[list[list[int]]]:
    """Each document tokenized as preprocess_data.py does (EOD appended when asked), cut into
    two sequences when `split` (its sentence splitting)."""
    out = []
    for d in docs:
        ids = tok.encode(d) + ([tok.eos_id] if append_eod else [])
        out.append([ids[: len(ids) // 2], ids[len(ids) // 2 :]] if split else [ids])
    return out


def _all_ids(bundle) -> list[int]:
    return [int(x) for x in bundle._shards.train] + [int(x) for x in bundle._shards.val]


def _cfg(tmp_path, **kw):
    return DataConfig(cache_dir=str(tmp_path / "cache"), val_fraction=0.1, **kw)


@pytest.mark.parametrize(
    "append_eod,split,dtype",
    [(False, False, np.uint16), (True, True, np.int32), (False, True, np.int64)],
)
def test_same_ids_as_the_corpus_ingested_from_jsonl(tmp_path, tok_dir, append_eod, split, dtype):
    docs = _docs(300, 1)
    tok = PretrainedTokenizer.load(tok_dir)
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    write_megatron(
        tmp_path / "c_text_document",
        _as_megatron(tok, docs, append_eod=append_eod, split=split),
        dtype,
    )
    kw = {"tokenizer": str(tok_dir), "document_masking": True}
    with build_data(_cfg(tmp_path, source=str(jsonl), **kw), seq_len=16, micro_batch=2) as b:
        want = _all_ids(b)
    assert want.count(tok.eos_id) == len(docs)
    # named by its prefix (Megatron's --data-path), by its .bin, or inside a folder
    for source in ("c_text_document", "c_text_document.bin"):
        cfg = _cfg(tmp_path, source=str(tmp_path / source), **kw)
        with build_data(cfg, seq_len=16, micro_batch=2) as b:
            assert _all_ids(b) == want
    (tmp_path / "only").mkdir()
    for ext in (".bin", ".idx"):
        (tmp_path / "only" / f"m{ext}").write_bytes(
            (tmp_path / f"c_text_document{ext}").read_bytes()
        )
    with build_data(
        _cfg(tmp_path, source=str(tmp_path / "only"), **kw), seq_len=16, micro_batch=2
    ) as b:
        assert _all_ids(b) == want


def test_separators_added_only_where_missing_in_pieces():
    """Empty documents, documents already holding BOS/EOS, and a document longer than the
    copy block (cut into pieces) give the ids text ingestion would write."""
    bos, eos = 1, 2
    docs = [[5, 6, 7], [], [1, 8, 2], [9] * 11, [1], [10, 2], []]
    want = []
    for d in docs:
        want += ([] if d[:1] == [bos] else [bos]) + d + ([] if d[-1:] == [eos] else [eos])
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = write_megatron(Path(tmp) / "m", [[d] for d in docs])
        index = read_index(path)
        for block in (1, 3, 4, 100):
            pieces = list(iter_document_ids(index, eos=eos, bos=bos, block=block))
            assert np.concatenate([p for p, _, _ in pieces]).tolist() == want
            assert sum(n for _, n, _ in pieces) == len(docs)
            assert pieces[-1][2] == path.stat().st_size


def _train_args(tmp_path, tok_dir, source, run):
    return [
        "--model.name=tiny-llama",
        "--model.vocab_size=260",
        f"--data.tokenizer={tok_dir}",
        f"--data.source={source}",
        "--data.document_masking=true",
        "--batch.seq_len=32",
        "--batch.global_batch=4",
        "--batch.micro_batch=2",
        "--train.steps=1",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--guard.enabled=false",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / run}",
    ]


def test_trains_with_the_losses_of_the_same_corpus_from_jsonl(tmp_path, tok_dir):
    from scaletrain.trainer import train

    docs = _docs(300, 2)
    tok = PretrainedTokenizer.load(tok_dir)
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    write_megatron(tmp_path / "m", _as_megatron(tok, docs, append_eod=True, split=False))
    a = train(load_config(None, _train_args(tmp_path, tok_dir, jsonl, "run_a")))
    b = train(load_config(None, _train_args(tmp_path, tok_dir, tmp_path / "m", "run_b")))
    assert b.model.document_sep_id == tok.eos_id is not None
    assert len(a.losses) == 1 and a.losses == b.losses  # the same tokens, the same documents


def _one_line(tmp_path, tok_dir, source) -> str:
    with pytest.raises(ConfigError) as e:
        build_data(
            _cfg(tmp_path, source=str(source), tokenizer=str(tok_dir)), seq_len=8, micro_batch=1
        )
    assert "\n" not in str(e.value) and e.value.field == "data.source"
    return str(e.value)


def test_malformed_files_are_one_line_naming_the_file(tmp_path, tok_dir):
    docs = [[[5] * 40, [6] * 30]] * 20
    good = write_megatron(tmp_path / "m", docs)
    idx = good.with_suffix(".idx")
    raw = idx.read_bytes()

    def case(name: str, data: bytes, bin_data: bytes | None = None) -> str:
        (tmp_path / f"{name}.idx").write_bytes(data)
        (tmp_path / f"{name}.bin").write_bytes(good.read_bytes() if bin_data is None else bin_data)
        return _one_line(tmp_path, tok_dir, tmp_path / name)

    assert "header" in case("magic", b"NOTMEGA!!" + raw[9:])
    assert "version 2" in case("version", raw[:9] + struct.pack("<Q", 2) + raw[17:])
    assert "dtype code 7" in case("float", raw[:17] + bytes([7]) + raw[18:])
    assert "truncated" in case("short", raw[:-8])
    assert "bytes where the .idx lists" in case("bin", raw, good.read_bytes()[:-2])
    pointers = bytearray(raw)
    struct.pack_into("<q", pointers, 34 + 4 * 40 + 8 * 3, 2)  # sequence 3 points at byte 2
    assert "sequence 3 points at byte 2" in case("pointers", bytes(pointers))
    ends = bytearray(raw)
    struct.pack_into("<q", ends, len(raw) - 8, 39)  # the last document ends before sequence 40
    assert "document indices" in case("ends", bytes(ends))
    for name in ("magic", "pointers", "ends"):
        assert f"{name}.idx" in case(name, (tmp_path / f"{name}.idx").read_bytes())
    write_megatron(tmp_path / "big", [[[5, 6, 300]]] * 40)
    assert "holds id 300" in _one_line(tmp_path, tok_dir, tmp_path / "big")


def test_reads_what_megatron_core_writes(tmp_path, tok_dir):
    """Cross-check against the format's owner: megatron-core's builder writes, we read (and its
    reader reads what the test writer above writes)."""
    idx_mod = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    import torch

    tok = PretrainedTokenizer.load(tok_dir)
    docs = _as_megatron(tok, _docs(50, 3), append_eod=True, split=True)
    builder = idx_mod.IndexedDatasetBuilder(str(tmp_path / "core.bin"), dtype=np.uint16)
    for d in docs:
        builder.add_document(torch.tensor([t for s in d for t in s]), [len(s) for s in d])
    builder.finalize(str(tmp_path / "core.idx"))
    ours = write_megatron(tmp_path / "ours", docs)
    assert (tmp_path / "core.idx").read_bytes() == ours.with_suffix(".idx").read_bytes()
    assert (tmp_path / "core.bin").read_bytes() == ours.read_bytes()
    theirs = idx_mod.IndexedDataset(str(tmp_path / "ours"))
    assert len(theirs) == sum(len(d) for d in docs)
    index = read_index(tmp_path / "core.bin")
    ids = np.concatenate([p for p, _, _ in iter_document_ids(index, eos=tok.eos_id, bos=None)])
    assert ids.tolist() == [t for d in docs for s in d for t in s]
