"""SFT: chat / instruction JSONL with the loss on the responses only."""

from __future__ import annotations

import json

import pytest
import torch

from scaletrain.config import ConfigError, DataConfig, model_preset
from scaletrain.data import build_data
from scaletrain.data.pretrained import PretrainedTokenizer
from scaletrain.data.sft import render_example
from scaletrain.models import build_model, causal_lm_loss
from tests._hf_models import make_tokenizer_dir

WORDS = ["how", "are", "you", "fine", "thanks", "what", "is", "two", "plus", "four"]


def _sentence(rng, n):
    return " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n,), generator=rng))


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    rng = torch.Generator().manual_seed(0)
    return make_tokenizer_dir(tmp_path_factory.mktemp("tok"),
                              [_sentence(rng, 30) for _ in range(100)], vocab_size=150)


def _write(path, n):
    rng = torch.Generator().manual_seed(1)
    lines = []
    for i in range(n):
        if i % 2:
            rec = {"prompt": _sentence(rng, 6), "response": _sentence(rng, 4)}
        else:
            rec = {"messages": [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": _sentence(rng, 5)},
                                {"role": "assistant", "content": _sentence(rng, 3)},
                                {"role": "user", "content": _sentence(rng, 2)},
                                {"role": "assistant", "content": _sentence(rng, 3)}]}
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_template_masks_exactly_the_responses(tok_dir):
    tok = PretrainedTokenizer.load(tok_dir)
    ids, mask = render_example([("user", "how are you"), ("assistant", "fine thanks")], tok)
    trained = [i for i, m in zip(ids, mask, strict=True) if m]
    assert trained == tok.encode("fine thanks") + [tok.eos_id]
    assert tok.decode([i for i, m in zip(ids, mask, strict=True) if not m]) == \
        "User: how are you\nAssistant: \n"


def test_prompt_positions_get_zero_gradient_and_loss_matches_hand(tmp_path, tok_dir):
    src = _write(tmp_path / "chat.jsonl", 200)
    cfg = DataConfig(source=str(src), tokenizer=str(tok_dir), format="sft",
                     cache_dir=str(tmp_path / "cache"), val_fraction=0.1)
    with build_data(cfg, seq_len=24, micro_batch=2) as data:
        inputs, targets = next(data.train_batches())
    masked = targets == -100
    assert masked.any() and (~masked).any()
    # every trained target is a response token or the EOS ending a reply
    model = build_model(model_preset("tiny-llama", vocab_size=300), device="cpu", seed=0)
    logits = model(inputs).detach().requires_grad_(True)  # (B, T, V)
    loss = causal_lm_loss(logits, targets)
    loss.backward()
    assert (logits.grad[masked] == 0).all()  # exactly zero, not small
    assert (logits.grad[~masked].abs().sum(-1) > 0).all()
    # the hand computation: mean over trained positions of -log p(target)
    logp = torch.log_softmax(logits.detach().double(), dim=-1)
    picked = [-logp[b, t, targets[b, t]] for b, t in (~masked).nonzero().tolist()]
    hand = torch.stack(picked).mean()
    torch.testing.assert_close(loss.double(), hand, atol=1e-6, rtol=1e-6)


def test_bad_sft_records_name_the_line(tmp_path, tok_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x " * 200, "response": "y"}) + "\n"
                   + json.dumps({"text": "not a chat"}) + "\n")
    with pytest.raises(ConfigError) as e:
        build_data(DataConfig(source=str(bad), tokenizer=str(tok_dir), format="sft",
                              cache_dir=str(tmp_path / "c")), seq_len=4, micro_batch=1)
    assert str(e.value.value) == f"{bad}:2" and "messages" in e.value.fix


def test_sft_trains_with_document_masking(tmp_path, tok_dir):
    from scaletrain.config import load_config
    from scaletrain.trainer import train

    src = _write(tmp_path / "chat.jsonl", 300)
    args = ["--model.name=tiny-llama", "--model.vocab_size=300", f"--data.source={src}",
            f"--data.tokenizer={tok_dir}", "--data.format=sft", "--data.document_masking=true",
            "--batch.seq_len=32", "--batch.global_batch=4", "--batch.micro_batch=2",
            "--train.steps=3", "--train.sample_tokens=0", "--train.progress=false",
            "--train.tensorboard=false", "--guard.enabled=false", "--train.eval_every=2",
            f"--data.cache_dir={tmp_path / 'cache'}", f"--train.run_dir={tmp_path / 'run'}"]
    r = train(load_config(None, args))
    assert len(r.losses) == 3 and all(torch.isfinite(torch.tensor(r.losses)))
    assert r.val_loss is not None and r.val_loss == r.val_loss


def test_window_of_prompt_only_has_zero_loss_and_gradient():
    logits = torch.randn(2, 5, 11, requires_grad=True)
    loss = causal_lm_loss(logits, torch.full((2, 5), -100))
    loss.backward()
    assert loss.item() == 0.0 and (logits.grad == 0).all()
