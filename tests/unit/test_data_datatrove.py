"""datatrove's tokenized output as `data.source`: its own `.ds` + `.ds.index` files and its
Megatron writer's `.bin` + `.idx`, written by datatrove itself (local executor) when it is
installed, give the ids of the same corpus ingested from JSONL; malformed `.ds` files are one
line naming the file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scaletrain.config import ConfigError, DataConfig
from scaletrain.data import build_data
from scaletrain.data.pretrained import PretrainedTokenizer
from tests._hf_models import make_tokenizer_dir
from tests.unit.test_data_megatron import _docs


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer_dir(tmp_path_factory.mktemp("tok"), _docs(200, 0))


def _ids(tmp_path, source, tok_dir, **kw) -> list[int]:
    cfg = DataConfig(
        source=str(source),
        tokenizer=str(tok_dir),
        cache_dir=str(tmp_path / "cache"),
        val_fraction=0.1,
        **kw,
    )
    with build_data(cfg, seq_len=16, micro_batch=2) as b:
        return [int(x) for x in b._shards.train] + [int(x) for x in b._shards.val]


def write_ds(path, documents: list[list[int]], *, token_size: int = 2, metadata: bool = True):
    """A test writer of datatrove's `TokenizedFile` layout: ids, uint64 document ends, and the
    `name|token_size` / count metadata."""
    flat = [t for d in documents for t in d]
    path.write_bytes(np.asarray(flat, dtype=np.uint16 if token_size == 2 else np.uint32).tobytes())
    ends = np.cumsum([len(d) for d in documents]).astype("<u8")
    path.with_name(path.name + ".index").write_bytes(ends.tobytes())
    if metadata:
        path.with_name(path.name + ".metadata").write_text(f"tok|{token_size}\n{len(flat)}\n")


def test_ds_files_read_as_the_jsonl_corpus(tmp_path, tok_dir):
    docs = _docs(300, 6)
    tok = PretrainedTokenizer.load(tok_dir)
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    want = _ids(tmp_path, jsonl, tok_dir)
    (tmp_path / "ds").mkdir()
    ids = [tok.encode(d) + [tok.eos_id] for d in docs]
    write_ds(tmp_path / "ds" / "00000_tokens.ds", ids[:100])
    write_ds(tmp_path / "ds" / "00001_tokens.ds", ids[100:], token_size=4)
    assert _ids(tmp_path, tmp_path / "ds", tok_dir) == want
    write_ds(tmp_path / "bare.ds", ids, metadata=False)  # no .metadata: data.token_dtype
    assert _ids(tmp_path, tmp_path / "bare.ds", tok_dir) == want


def test_malformed_ds_files_are_one_line(tmp_path, tok_dir):
    docs = [[5] * 30] * 40
    write_ds(tmp_path / "a.ds", docs)
    raw, index = (tmp_path / "a.ds").read_bytes(), (tmp_path / "a.ds.index").read_bytes()

    def case(ds: bytes, idx: bytes, meta: str = "tok|2\n1200\n") -> ConfigError:
        (tmp_path / "b.ds").write_bytes(ds)
        (tmp_path / "b.ds.index").write_bytes(idx)
        (tmp_path / "b.ds.metadata").write_text(meta)
        with pytest.raises(ConfigError) as e:
            _ids(tmp_path, tmp_path / "b.ds", tok_dir)
        assert "\n" not in str(e.value) and e.value.field == "data.source"
        return e.value

    assert "b.ds" in str(case(raw[:-1], index, "tok|2\n1199\n"))  # half an id
    assert "counts 1,200" in str(case(raw[:-2], index))
    assert "b.ds.index" in str(case(raw, index[:-3]))
    assert "ends at 1,170" in str(case(raw, index[:-8]))
    assert "token size 3" in str(case(raw, index, "tok|3\n1200\n"))
    falling = np.frombuffer(index, "<u8").copy()
    falling[[3, 4]] = falling[[4, 3]]
    assert "fall near" in str(case(raw, falling.tobytes()))


def _run_datatrove(tmp_path, name, writer) -> None:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader

    LocalPipelineExecutor(
        [JsonlReader(str(tmp_path / "in")), writer],
        tasks=1,
        logging_dir=str(tmp_path / f"logs-{name}"),  # (a finished task's log: skipped)
    ).run()


def test_what_datatrove_writes_trains_as_the_jsonl_corpus(tmp_path, tok_dir):
    """datatrove (PyPI) run locally: DocumentTokenizer's .ds files and
    MegatronDocumentTokenizer's .bin/.idx give the ids of the same corpus from JSONL."""
    pytest.importorskip("datatrove")
    from datatrove.pipeline.tokens import DocumentTokenizer, MegatronDocumentTokenizer

    docs = _docs(300, 7)
    (tmp_path / "in").mkdir()
    jsonl = tmp_path / "in" / "c.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"text": d, "id": str(i)}) + "\n" for i, d in enumerate(docs))
    )
    want = _ids(tmp_path, jsonl, tok_dir)
    tok_file = str(tok_dir / "tokenizer.json")
    _run_datatrove(
        tmp_path,
        "ds",
        DocumentTokenizer(
            str(tmp_path / "ds"), tokenizer_name_or_path=tok_file, shuffle_documents=False
        ),
    )
    assert list((tmp_path / "ds").glob("*.ds.index"))
    assert _ids(tmp_path, tmp_path / "ds", tok_dir) == want
    _run_datatrove(
        tmp_path,
        "megatron",
        MegatronDocumentTokenizer(str(tmp_path / "mg"), tokenizer_name_or_path=tok_file),
    )
    assert list((tmp_path / "mg").glob("*.idx"))
    assert _ids(tmp_path, tmp_path / "mg", tok_dir) == want
