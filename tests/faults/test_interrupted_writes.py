"""What a killed writer leaves under a temporary name is cleaned (or reported) at the next
start, and a write in flight is never touched: an ingest killed while it fills a shard
directory (its leftover removed by the next `build_data`, said in the data line), leftovers of
other hosts reported once unchanged for a day, and a checkpoint save interrupted before its
rename (removed by the next `train` under the run lock, said in one line)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scaletrain.checkpoint.dcp import clear_interrupted_saves
from scaletrain.config import DataConfig
from scaletrain.data import build_data
from scaletrain.data.stale_writes import _HOST, sweep, temp_name

from ._cli import no_traceback, scaletrain, tiny_job

pytestmark = pytest.mark.fault("interrupted_write")

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _leftover(cache: Path, name: str, size: int = 1000) -> Path:
    d = cache / name
    d.mkdir(parents=True)
    (d / "part0.tmp").write_bytes(b"\0" * size)
    return d


def test_an_ingest_killed_mid_write_is_removed_at_the_next_start(tmp_path):
    cache = tmp_path / "cache"
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "the quick brown fox jumps over the lazy dog"}\n' * 400)
    # a real writer: shards.publish's fill killed (SIGKILL-like os._exit) before its rename
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from scaletrain.data.shards import publish

        def fill(tmp):
            (tmp / "part0.tmp").write_bytes(b"x" * 4096)
            os._exit(9)

        publish(Path({str(cache / "text-0123456789abcdef")!r}), fill)
        """
    )
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    assert subprocess.run([sys.executable, "-c", script], env=env).returncode == 9
    (left,) = cache.glob(".text-0123456789abcdef.tmp-*")
    assert left.name.startswith(f".text-0123456789abcdef.tmp-{_HOST}-")
    cfg = DataConfig(source=str(src), tokenizer="byte", cache_dir=str(cache), val_fraction=0.1)
    with build_data(cfg, seq_len=16, micro_batch=2) as b:
        line = b.describe()
    assert not left.exists()
    assert "removed 1 temporary shard directories" in line and left.name in line, line
    assert "4.0 KiB" in line
    with build_data(cfg, seq_len=16, micro_batch=2) as b:  # nothing left: nothing said
        assert "removed" not in b.describe()


def test_writes_in_flight_and_other_hosts_are_kept(tmp_path):
    cache = tmp_path / "cache"
    mine = _leftover(cache, temp_name("text-aaaa"))  # this process: in flight
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        theirs = _leftover(cache, f".text-bbbb.tmp-{_HOST}-{live.pid}-0123abcd")
        dead = _leftover(cache, f".text-cccc.tmp-{_HOST}-{_dead_pid()}-0123abcd")
        other = _leftover(cache, f".text-dddd.tmp-otherhost-{os.getpid()}-0123abcd", 2048)
        old = _leftover(cache, ".text-eeee.tmp-12345-0123abcd")  # before host names
        shard = _leftover(cache, "text-ffff")
        now = sweep(cache)
        assert now.removed == [dead] and now.foreign == []
        assert mine.exists() and theirs.exists() and other.exists() and old.exists()
        later = sweep(cache, now=time.time() + 2 * 24 * 3600)  # two days unchanged
        assert later.removed == [] and sorted(later.foreign) == sorted([other, old])
        (line,) = later.lines("shard directories")
        assert "other hosts" in line and str(other) in line and "delete them" in line
        assert shard.exists() and (shard / "part0.tmp").exists()
    finally:
        live.kill()
        live.wait()


def test_sweep_off_keeps_them(tmp_path):
    cache = tmp_path / "cache"
    dead = _leftover(cache, f".text-cccc.tmp-{_HOST}-{_dead_pid()}-0123abcd")
    cfg = DataConfig(cache_dir=str(cache), num_tokens=20_000)
    with build_data(cfg, seq_len=16, micro_batch=2, sweep_stale=False) as b:
        assert "removed" not in b.describe()
    assert dead.exists()


def test_an_interrupted_checkpoint_save_is_removed_at_the_next_start(tmp_path):
    ckpt = tmp_path / "checkpoints"
    torn = _leftover(ckpt, ".tmp-step_00000004", 3 * 1024)
    kept = _leftover(ckpt, "step_00000002")
    line = clear_interrupted_saves(ckpt)
    assert line is not None and ".tmp-step_00000004" in line and "3.0 KiB" in line
    assert not torn.exists() and kept.exists()
    assert clear_interrupted_saves(ckpt) is None
    # through `train`: the start removes it (rank 0 holds the run lock) and says so
    run = tmp_path / "run"
    torn = _leftover(run / "checkpoints", ".tmp-step_00000009")
    p = scaletrain("train", *tiny_job(tmp_path, "run"))
    assert p.returncode == 0 and no_traceback(p), p.stderr[-2000:]
    assert not torn.exists()
    assert "removed 1 unfinished checkpoint folder" in p.stdout, p.stdout
    assert ".tmp-step_00000009" in p.stdout
