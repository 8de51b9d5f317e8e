"""Held-out eval sources in a single-process training run: a set holding the validation tokens
scores exactly val_loss; a set's loss equals a hand computation on the trained model; the
metrics, the step line, run_info.json and the summary carry val_loss/<name> and ppl/<name>."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import torch.nn.functional as F

from scaletrain.config import load_config
from scaletrain.data import build_data
from scaletrain.trainer import train

pytestmark = pytest.mark.slow


def _args(tmp_path, name, *extra):
    return [
        "--model.name=tiny",
        "--batch.seq_len=32",
        "--batch.global_batch=4",
        "--batch.micro_batch=2",
        "--train.steps=3",
        "--train.eval_every=2",
        "--train.eval_batches=3",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--data.num_tokens=40000",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / name}",
        "--optim.warmup_steps=0",
        "--guard.enabled=false",
        *extra,
    ]


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_eval_source_holding_the_validation_tokens_scores_val_loss(tmp_path, capsys):
    job = load_config(None, _args(tmp_path, "prep"))
    with build_data(job.data, seq_len=32, micro_batch=2) as data:  # the run's own shards
        shutil.copy(data.shard_dir / "val.bin", tmp_path / "val.bin")  # uint16 byte ids
    r = train(
        load_config(
            None, _args(tmp_path, "run", f"--data.eval_sources=same={tmp_path / 'val.bin'}")
        )
    )
    evals = [x for x in _records(r.run_dir) if "val_loss" in x]
    assert [x["step"] for x in evals] == [2, 3]  # every eval_every steps and at the end
    for x in evals:
        assert x["val_loss/same"] == x["val_loss"]  # the same batches through the same code
        assert x["ppl/same"] == pytest.approx(math.exp(x["val_loss"]), rel=1e-12)
    assert r.eval_losses == {"same": r.val_loss}
    info = json.loads((r.run_dir / "run_info.json").read_text())
    assert info["eval"] == {"same": {"val_loss": r.val_loss, "ppl": math.exp(r.val_loss)}}
    out = capsys.readouterr().out
    assert f"| same {r.val_loss:.4f} (ppl {math.exp(r.val_loss):.2f})" in out  # step + summary
    assert out.count(f"same {r.val_loss:.4f}") == 2


def test_eval_source_loss_equals_a_hand_computation(tmp_path):
    docs = [f"held-out line {i}: the {'quick' if i % 2 else 'lazy'} fox." for i in range(5)]
    src = tmp_path / "held.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    r = train(load_config(None, _args(tmp_path, "run", f"--data.eval_sources=held={src}")))
    # by hand: byte ids of each document then a newline (the byte tokenizer's separator);
    # batch i = windows 2i, 2i+1 at stride seq_len, wrapping over the set's windows
    ids = torch.tensor([b for d in docs for b in [*d.encode(), ord("\n")]])
    seq, micro = 32, 2
    num_windows = (len(ids) - 1) // seq
    assert num_windows < 3 * micro  # the batches wrap around: that rule is exercised too
    model = r.model.eval()
    losses = []
    with torch.no_grad():
        for i in range(3):
            starts = [(w % num_windows) * seq for w in range(i * micro, (i + 1) * micro)]
            rows = torch.stack([ids[s : s + seq + 1] for s in starts])
            logits = model(rows[:, :-1]).double()  # (micro, seq, vocab)
            losses.append(F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten()))
    hand = torch.stack(losses).mean().item()
    # fp32 forward in both; the trainer's fused chunked loss reduces in fp32 (~1e-7 relative)
    assert r.eval_losses["held"] == pytest.approx(hand, rel=1e-5)
    last = _records(r.run_dir)[-1]
    assert last["val_loss/held"] == r.eval_losses["held"] and last["ppl/held"] == pytest.approx(
        math.exp(hand), rel=1e-5
    )
