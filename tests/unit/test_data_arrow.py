"""A Hugging Face `datasets` directory (`save_to_disk`: data-*.arrow shards in the Arrow IPC
streaming format) as `data.source`: the same ids as the corpus from JSONL; a missing column or
a truncated shard is one line naming the file."""

from __future__ import annotations

import json

import pytest

from scaletrain.config import ConfigError, DataConfig
from scaletrain.data import build_data
from tests._hf_models import make_tokenizer_dir
from tests.unit.test_data_megatron import _docs

pa = pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer_dir(tmp_path_factory.mktemp("tok"), _docs(200, 0))


def _shard(path, docs, *, column="text", stream=True):
    """One shard as `datasets`' ArrowWriter writes it (pyarrow's RecordBatchStreamWriter, a
    few record batches), or as an Arrow IPC file when `stream` is false."""
    table = pa.table({column: docs, "id": list(range(len(docs)))})
    with pa.OSFile(str(path), "wb") as sink:
        opener = pa.ipc.new_stream if stream else pa.ipc.new_file
        with opener(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=64):
                writer.write_batch(batch)


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


def test_save_to_disk_directory_reads_as_the_jsonl_corpus(tmp_path, tok_dir):
    docs = _docs(300, 4)
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    ds = tmp_path / "ds"
    ds.mkdir()
    _shard(ds / "data-00000-of-00002.arrow", docs[:170])
    _shard(ds / "data-00001-of-00002.arrow", docs[170:])
    (ds / "state.json").write_text(json.dumps({"_data_files": []}))
    (ds / "dataset_info.json").write_text("{}")
    want = _ids(tmp_path, jsonl, tok_dir)
    assert _ids(tmp_path, ds, tok_dir) == want
    _shard(tmp_path / "file.arrow", docs, stream=False)  # the IPC file format too
    assert _ids(tmp_path, tmp_path / "file.arrow", tok_dir) == want


def test_missing_column_and_truncated_shard_are_one_line(tmp_path, tok_dir):
    _shard(tmp_path / "body.arrow", _docs(100, 5), column="body")
    with pytest.raises(ConfigError) as e:
        _ids(tmp_path, tmp_path / "body.arrow", tok_dir)
    assert e.value.field == "data.text_field" and "column 'text'" in str(e.value)
    assert _ids(tmp_path, tmp_path / "body.arrow", tok_dir, text_field="body")
    data = (tmp_path / "body.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError) as e:
        _ids(tmp_path, tmp_path / "cut.arrow", tok_dir, text_field="body")
    assert e.value.field == "data.source" and "cut.arrow row" in str(e.value)
    assert "\n" not in str(e.value)
