"""Pre-tokenized corpora trained in place (`data/direct.py`): what datatrove's DocumentTokenizer
(run with its local executor) and megatron-core's IndexedDatasetBuilder write trains through
`scaletrain train` without a copy, with the ids, documents and step-1 loss of the same corpus
ingested by us; a mixture of them splits and scores its components as ingestion does; files
changed or damaged after their first use are one line naming the file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from scaletrain.cli import main as cli_main
from scaletrain.config import ConfigError, DataConfig
from scaletrain.data import build_data
from scaletrain.data.direct import TokenView
from scaletrain.data.pretrained import PretrainedTokenizer
from tests._hf_models import make_tokenizer_dir
from tests.unit.test_data_datatrove import write_ds
from tests.unit.test_data_megatron import _as_megatron, _docs, write_megatron


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A byte-level BPE trained by `tokenizers` offline, saved to a file."""
    return make_tokenizer_dir(tmp_path_factory.mktemp("tok"), _docs(200, 0))


def _jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text(
        "".join(json.dumps({"text": d, "id": str(i)}) + "\n" for i, d in enumerate(docs))
    )
    return path


def _cfg(tmp_path, source, tok_dir, **kw) -> DataConfig:
    return DataConfig(
        source=str(source),
        tokenizer=str(tok_dir),
        cache_dir=str(tmp_path / "cache"),
        val_fraction=0.1,
        **kw,
    )


def _ids(bundle) -> np.ndarray:
    return np.concatenate([np.asarray(bundle._shards.train), np.asarray(bundle._shards.val)])


def _train_loss(tmp_path, tok_dir, source, run) -> float:
    args = [
        "--model.name=tiny-llama",
        "--model.vocab_size=260",
        f"--data.tokenizer={tok_dir}",
        f"--data.source={source}",
        "--data.document_masking=true",
        "--data.val_fraction=0.1",
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
    assert cli_main(["train", *args]) in (0, None)
    records = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 1
    return losses[0]


def _run_datatrove(tmp_path: Path, tok_file: str) -> Path:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    LocalPipelineExecutor(
        [
            JsonlReader(str(tmp_path / "in")),
            DocumentTokenizer(
                str(tmp_path / "dt"), tokenizer_name_or_path=tok_file, shuffle_documents=False
            ),
        ],
        tasks=1,
        logging_dir=str(tmp_path / "logs"),
    ).run()
    return tmp_path / "dt"


def _megatron_core(prefix: Path, tok, docs: list[str]) -> Path:
    """megatron-core's own builder: one sequence per document, EOD appended as
    `preprocess_data.py --append-eod` does, in megatron's uint16."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for d in docs:
        ids = [*tok.encode(d), tok.eos_id]
        builder.add_document(torch.tensor(ids), [len(ids)])
    builder.finalize(f"{prefix}.idx")
    return prefix


def test_datatrove_and_megatron_core_output_train_in_place_as_our_ingest(tmp_path, tok_dir):
    pytest.importorskip("datatrove")
    pytest.importorskip("megatron.core.datasets.indexed_dataset")
    tok = PretrainedTokenizer.load(tok_dir)
    docs = _docs(300, 11)
    (tmp_path / "in").mkdir()
    jsonl = _jsonl(tmp_path / "in" / "c.jsonl", docs)
    datatrove_dir = _run_datatrove(tmp_path, str(tok_dir / "tokenizer.json"))
    (tmp_path / "mc").mkdir()
    megatron = _megatron_core(tmp_path / "mc" / "corpus_text_document", tok, docs)
    with build_data(_cfg(tmp_path, jsonl, tok_dir), seq_len=32, micro_batch=2) as b:
        want = _ids(b)
    for source in (datatrove_dir, megatron):
        with build_data(_cfg(tmp_path, source, tok_dir), seq_len=32, micro_batch=2) as b:
            assert isinstance(b._shards.train, TokenView)  # read in place
            assert np.array_equal(_ids(b), want)
    ours = _train_loss(tmp_path, tok_dir, jsonl, "ours")
    assert _train_loss(tmp_path, tok_dir, datatrove_dir, "datatrove") == ours
    assert _train_loss(tmp_path, tok_dir, megatron, "megatron") == ours
    # nothing was copied: the in-place records hold no ids, only checksums and the tokenizer
    direct = sorted((tmp_path / "cache").glob("direct-*"))
    assert len(direct) == 2
    for d in direct:
        assert not list(d.glob("*.bin")) and json.loads((d / "meta.json").read_text())["files"]


def test_separators_added_in_place_as_ingestion_adds_them(tmp_path):
    """A corpus without EOD (preprocess_data.py without --append-eod) and a tokenizer that
    adds BOS: the view inserts what ingestion writes, at every offset."""
    tdir = make_tokenizer_dir(tmp_path / "tok", _docs(100, 0), add_bos=True)
    tok = PretrainedTokenizer.load(tdir)
    docs = _docs(200, 12)
    write_megatron(tmp_path / "m", _as_megatron(tok, docs, append_eod=False, split=True))
    with build_data(
        _cfg(tmp_path, _jsonl(tmp_path / "c.jsonl", docs), tdir), seq_len=16, micro_batch=2
    ) as b:
        want = _ids(b)
    with build_data(_cfg(tmp_path, tmp_path / "m", tdir), seq_len=16, micro_batch=2) as b:
        view = b._shards.train
        assert isinstance(view, TokenView) and np.array_equal(_ids(b), want)
        rng = np.random.default_rng(0)
        for _ in range(500):  # any window, as the sampler cuts them
            lo = int(rng.integers(0, len(view)))
            hi = int(rng.integers(lo, min(len(view), lo + 100) + 1))
            assert np.array_equal(view[lo:hi], want[lo:hi])


def test_mixture_in_place_splits_and_scores_components_as_ingestion(tmp_path, tok_dir):
    tok = PretrainedTokenizer.load(tok_dir)
    a_docs, b_docs = _docs(300, 13), _docs(120, 14)
    text = (
        f"{_jsonl(tmp_path / 'a.jsonl', a_docs)}@3, books={_jsonl(tmp_path / 'b.jsonl', b_docs)}@1"
    )
    write_megatron(tmp_path / "a", _as_megatron(tok, a_docs, append_eod=True, split=False))
    (tmp_path / "b").mkdir()
    write_ds(tmp_path / "b" / "00000.ds", [[*tok.encode(d), tok.eos_id] for d in b_docs])
    tokens = f"{tmp_path / 'a'}@3, books={tmp_path / 'b'}@1"
    with (
        build_data(_cfg(tmp_path, text, tok_dir), seq_len=16, micro_batch=2) as want,
        build_data(_cfg(tmp_path, tokens, tok_dir), seq_len=16, micro_batch=2) as got,
    ):
        assert isinstance(got._shards.train, TokenView)
        assert np.array_equal(_ids(got), _ids(want))
        assert got.eval_names == want.eval_names == ["a", "books"]
        for name in ("a", "books"):
            w, g = want.eval_batches(2)[name], got.eval_batches(2)[name]
            assert all(x.equal(y) for p, q in zip(w, g, strict=True) for x, y in zip(p, q))
        # the component's batches are its own validation ids (the last 10% of its tokens)
        n_a = want._shards.meta["val_parts"][0]
        first = want.eval_batches(1)["books"][0][0][0].tolist()
        val = np.asarray(want._shards.val)
        assert first == val[n_a : n_a + 16].tolist()


def _one_line(tmp_path, tok_dir, source, field="data.source") -> str:
    with pytest.raises(ConfigError) as e:
        build_data(_cfg(tmp_path, source, tok_dir), seq_len=8, micro_batch=1)
    assert "\n" not in str(e.value) and e.value.field == field
    return str(e.value)


def test_changed_or_damaged_files_are_one_line_naming_the_file(tmp_path, tok_dir):
    tok = PretrainedTokenizer.load(tok_dir)
    docs = _docs(100, 15)
    path = write_megatron(tmp_path / "m", _as_megatron(tok, docs, append_eod=False, split=False))
    with build_data(_cfg(tmp_path, path, tok_dir), seq_len=8, micro_batch=1):
        pass  # first use: recorded
    (directory,) = (tmp_path / "cache").glob("direct-*")

    def flip(p: Path, at: int) -> None:  # same size and mtime: only the content changes
        st = p.stat()
        raw = bytearray(p.read_bytes())
        raw[at] ^= 1
        p.write_bytes(bytes(raw))
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))

    # the cache key hashes the files' content (shards.file_identity): changed ids are a new
    # corpus, scanned and recorded in a directory of their own, never read under the old record
    flip(path, 10)
    with build_data(_cfg(tmp_path, path, tok_dir), seq_len=8, micro_batch=1):
        pass
    assert len(list((tmp_path / "cache").glob("direct-*"))) == 2
    flip(path, 10)  # restored: the first directory's record again
    flip(path.with_suffix(".idx"), 40)  # a sequence length: the structure check sees it first
    assert "m.idx" in _one_line(tmp_path, tok_dir, path)
    flip(path.with_suffix(".idx"), 40)
    vb = directory / "f0.vbounds"
    flip(vb, 8)
    assert "f0.vbounds" in _one_line(tmp_path, tok_dir, path, field="data.cache_dir")
    flip(vb, 8)
    with build_data(_cfg(tmp_path, path, tok_dir), seq_len=8, micro_batch=1):
        pass  # restored: verified again
    big = write_megatron(tmp_path / "big", [[[5, 6, 300] * 10]] * 10)
    assert "holds id 300" in _one_line(tmp_path, tok_dir, big)
    with pytest.raises(ConfigError) as e:
        build_data(_cfg(tmp_path, path, "bpe"), seq_len=8, micro_batch=1)
    assert e.value.field == "data.tokenizer" and "tokenizer.json" in str(e.value)
