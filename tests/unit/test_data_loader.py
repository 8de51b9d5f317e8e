"""Sampler and loader: determinism, dp slicing, exact resume, caching, errors, shutdown."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest
import torch

from scaletrain.config import ConfigError, DataConfig
from scaletrain.data import build_data
from scaletrain.data import shards as shards_mod


def _cfg(tmp_path, **kw):
    kw.setdefault("num_tokens", 20_000)
    return DataConfig(cache_dir=str(tmp_path / "cache"), **kw)


def _take(it, n):
    return [next(it) for _ in range(n)]


def _assert_same(a, b):
    assert len(a) == len(b)
    for (x1, y1), (x2, y2) in zip(a, b):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_batches_are_deterministic_shifted_and_typed(tmp_path):
    runs = []
    for _ in range(2):
        with build_data(_cfg(tmp_path), seq_len=16, micro_batch=3, grad_accum=2) as b:
            runs.append(_take(b.train_batches(), 5))
    _assert_same(*runs)
    x, y = runs[0][0]
    assert x.shape == y.shape == (3, 16) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert not torch.equal(runs[0][0][0], runs[0][1][0])
    with build_data(_cfg(tmp_path), seq_len=16, micro_batch=3, grad_accum=2, seed=99) as b:
        assert not torch.equal(next(b.train_batches())[0], x)  # the seed picks the order


@pytest.mark.parametrize("accum", [1, 2])
def test_dp_ranks_split_exactly_the_dp1_batch(tmp_path, accum):
    """Micro-step k on rank r holds global batch rows [k*m*dp + r*m, ...+m): the concatenation
    over ranks equals dp=1 with a micro-batch dp times larger."""
    cfg = _cfg(tmp_path)
    with build_data(cfg, seq_len=16, micro_batch=4, grad_accum=accum) as ref:
        want = _take(ref.train_batches(), 3 * accum)
        want_val = ref.val_batches(2)
    got, got_val = [], []
    for rank in range(2):
        with build_data(
            cfg, seq_len=16, micro_batch=2, grad_accum=accum, dp_rank=rank, dp_size=2
        ) as b:
            got.append(_take(b.train_batches(), 3 * accum))
            got_val.append(b.val_batches(2))
    for k in range(3 * accum):
        assert torch.equal(torch.cat([got[0][k][0], got[1][k][0]]), want[k][0])
        assert torch.equal(torch.cat([got[0][k][1], got[1][k][1]]), want[k][1])
    for k in range(2):
        assert torch.equal(torch.cat([got_val[0][k][0], got_val[1][k][0]]), want_val[k][0])


def test_dp2_step_is_the_union_of_dp1_accumulation(tmp_path):
    """Same global batch (4 rows): dp=1 x accum=2 and dp=2 x accum=1 see the same rows."""
    cfg = _cfg(tmp_path)
    with build_data(cfg, seq_len=16, micro_batch=2, grad_accum=2) as ref:
        want = _take(ref.train_batches(), 4)  # steps 0 and 1
    for rank in range(2):
        with build_data(cfg, seq_len=16, micro_batch=2, dp_rank=rank, dp_size=2) as b:
            got = _take(b.train_batches(), 2)
            _assert_same(got, [want[rank], want[2 + rank]])


def test_val_batches_fixed_across_calls(tmp_path):
    with build_data(_cfg(tmp_path), seq_len=16, micro_batch=2) as b:
        _assert_same(b.val_batches(3), b.val_batches(3))
        next(b.train_batches())
        _assert_same(b.val_batches(3), b.val_batches(3))


@pytest.mark.parametrize("prefetch", [0, 3])
def test_resume_mid_stream_is_exact(tmp_path, prefetch):
    cfg = _cfg(tmp_path, prefetch=prefetch)
    kw = dict(seq_len=16, micro_batch=2, grad_accum=3)
    with build_data(cfg, **kw) as b:
        want = _take(b.train_batches(), 10)
    with build_data(cfg, **kw) as b:
        it = b.train_batches()
        head = _take(it, 4)  # mid-step: step 1, micro-step 1
        state = json.loads(json.dumps(b.state_dict()))
    assert (state["step"], state["micro_step"]) == (1, 1)
    _assert_same(head, want[:4])
    with build_data(cfg, **kw) as b:
        b.load_state_dict(state)
        _assert_same(_take(b.train_batches(), 6), want[4:])
    with build_data(cfg, **kw) as b:  # rewinding a live iterator drops its prefetched batches
        it = b.train_batches()
        _take(it, 7)
        b.load_state_dict(state)
        _assert_same(_take(it, 6), want[4:])


def test_resume_with_other_dp_degree_and_mismatch_errors(tmp_path):
    cfg = _cfg(tmp_path)
    with build_data(cfg, seq_len=16, micro_batch=2, grad_accum=2) as ref:
        want = _take(ref.train_batches(), 6)
    with build_data(cfg, seq_len=16, micro_batch=2, grad_accum=2) as b:
        _take(b.train_batches(), 2)
        state = b.state_dict()
    with build_data(cfg, seq_len=16, micro_batch=2, dp_rank=1, dp_size=2) as b:
        b.load_state_dict(state)  # same global batch of 4: the stream continues at step 1
        _assert_same(_take(b.train_batches(), 2), [want[3], want[5]])
    with (
        build_data(cfg, seq_len=16, micro_batch=2, grad_accum=2, seed=5) as b,
        pytest.raises(ConfigError, match="data.seed"),
    ):
        b.load_state_dict(state)


def test_shards_reused_from_cache_and_rebuilt_on_change(tmp_path, monkeypatch):
    src = tmp_path / "corpus.txt"
    src.write_text("some text here. " * 400)
    cfg = _cfg(tmp_path, source=str(src), tokenizer="char")
    with build_data(cfg, seq_len=16, micro_batch=2) as b:
        first_dir = b.shard_dir
        assert b.best_loss_nats is None
    built = []
    real_build = shards_mod._build
    monkeypatch.setattr(
        shards_mod, "_build", lambda *a, **k: built.append(1) or real_build(*a, **k)
    )
    with build_data(cfg, seq_len=16, micro_batch=2) as b:
        assert b.shard_dir == first_dir and not built
    src.write_text("other text here! " * 400)
    with build_data(cfg, seq_len=16, micro_batch=2) as b:
        assert b.shard_dir != first_dir and built == [1]
        assert "!" in b.tokenizer.decode(list(b._shards.val))
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]
    assert leftovers == []


def test_folder_of_txt_files_sorted(tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("bbbb " * 300)
    (folder / "a.txt").write_text("aaaa " * 300)
    (folder / "sub" / "c.txt").write_text("cccc " * 300)
    (folder / "notes.md").write_text("ignored " * 300)
    with build_data(
        _cfg(tmp_path, source=str(folder), tokenizer="byte"), seq_len=8, micro_batch=2
    ) as b:
        sh = b._shards
        text = b.tokenizer.decode(list(sh.train) + list(sh.val))
        assert text == "\n".join(["aaaa " * 300, "bbbb " * 300, "cccc " * 300])


@pytest.mark.parametrize("case", ["empty_file", "tiny_file", "empty_folder", "tiny_grammar"])
def test_too_small_dataset_names_the_field(tmp_path, case, monkeypatch):
    def fail(*a, **k):
        raise AssertionError("tokenized before checking the size")

    monkeypatch.setattr(shards_mod, "_tokenize", fail)
    if case == "empty_folder":
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "x.md").write_text("not text")
        cfg, field = _cfg(tmp_path, source=str(tmp_path / "empty")), "data.source"
    elif case == "tiny_grammar":
        cfg, field = _cfg(tmp_path, num_tokens=10_000), "data.num_tokens"
    else:
        f = tmp_path / "small.txt"
        f.write_text("" if case == "empty_file" else "a few words only. " * 20)
        cfg, field = _cfg(tmp_path, source=str(f)), "data.source"
    with pytest.raises(ConfigError) as e:
        build_data(cfg, seq_len=256, micro_batch=8, dp_size=2)
    assert e.value.field == field
    assert "batch" in e.value.fix or "no text" in e.value.fix


def test_bpe_too_few_tokens_after_tokenizing(tmp_path):
    """Bytes pass the cheap pre-check, but BPE packs them into fewer tokens than a batch."""
    f = tmp_path / "rep.txt"
    f.write_text("the cat sat. " * 400)  # 5200 bytes, 5% val = 260 bytes >= 2 x 65
    with pytest.raises(ConfigError) as e:
        build_data(
            _cfg(tmp_path, source=str(f), tokenizer="bpe", bpe_vocab_size=300),
            seq_len=64,
            micro_batch=2,
        )
    assert e.value.field == "data.source" and "tokens" in e.value.fix


def test_delayed_prefetch_loader_delivers_and_shuts_down(tmp_path):
    cfg = _cfg(tmp_path, prefetch=2, delay_s=0.01)
    b = build_data(cfg, seq_len=16, micro_batch=2)
    it = b.train_batches()
    got = _take(it, 4)
    with build_data(_cfg(tmp_path, prefetch=0), seq_len=16, micro_batch=2) as ref:
        _assert_same(got, _take(ref.train_batches(), 4))
    thread = it._thread
    assert thread is not None and thread.is_alive() and thread.daemon
    b.close()
    assert not thread.is_alive()
    with pytest.raises(StopIteration):
        next(it)
    abandoned = build_data(cfg, seq_len=16, micro_batch=2).train_batches()
    next(abandoned)
    thread = abandoned._thread
    del abandoned  # never closed: the finalizer stops the thread once collected
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_producer_errors_reach_the_consumer(tmp_path, monkeypatch):
    with build_data(_cfg(tmp_path, prefetch=2), seq_len=16, micro_batch=2) as b:

        def boom(index):
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(b._sampler, "train_batch", boom)
        with pytest.raises(RuntimeError, match="disk on fire"):
            next(b.train_batches())


def test_interpreter_exits_with_a_live_prefetch_thread(tmp_path):
    """A script that never closes its loader still exits (daemon thread + exit finalizer)."""
    script = (
        "from scaletrain.config import DataConfig\n"
        "from scaletrain.data import build_data\n"
        f"cfg = DataConfig(num_tokens=20_000, cache_dir={str(tmp_path)!r}, prefetch=4,"
        " delay_s=0.05)\n"
        "it = build_data(cfg, seq_len=16, micro_batch=2).train_batches()\n"
        "next(it)\n"
        "print('done')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"
