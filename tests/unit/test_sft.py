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
    return make_tokenizer_dir(
        tmp_path_factory.mktemp("tok"), [_sentence(rng, 30) for _ in range(100)], vocab_size=150
    )


def _write(path, n):
    rng = torch.Generator().manual_seed(1)
    lines = []
    for i in range(n):
        if i % 2:
            rec = {"prompt": _sentence(rng, 6), "response": _sentence(rng, 4)}
        else:
            rec = {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": _sentence(rng, 5)},
                    {"role": "assistant", "content": _sentence(rng, 3)},
                    {"role": "user", "content": _sentence(rng, 2)},
                    {"role": "assistant", "content": _sentence(rng, 3)},
                ]
            }
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_template_masks_exactly_the_responses(tok_dir):
    tok = PretrainedTokenizer.load(tok_dir)
    ids, mask = render_example([("user", "how are you"), ("assistant", "fine thanks")], tok)
    trained = [i for i, m in zip(ids, mask, strict=True) if m]
    assert trained == tok.encode("fine thanks") + [tok.eos_id]
    assert (
        tok.decode([i for i, m in zip(ids, mask, strict=True) if not m])
        == "User: how are you\nAssistant: \n"
    )


def test_prompt_positions_get_zero_gradient_and_loss_matches_hand(tmp_path, tok_dir):
    src = _write(tmp_path / "chat.jsonl", 200)
    cfg = DataConfig(
        source=str(src),
        tokenizer=str(tok_dir),
        format="sft",
        cache_dir=str(tmp_path / "cache"),
        val_fraction=0.1,
    )
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
    bad.write_text(
        json.dumps({"prompt": "x " * 200, "response": "y"})
        + "\n"
        + json.dumps({"text": "not a chat"})
        + "\n"
    )
    with pytest.raises(ConfigError) as e:
        build_data(
            DataConfig(
                source=str(bad), tokenizer=str(tok_dir), format="sft", cache_dir=str(tmp_path / "c")
            ),
            seq_len=4,
            micro_batch=1,
        )
    assert str(e.value.value) == f"{bad}:2" and "messages" in e.value.fix


def test_sft_trains_with_document_masking(tmp_path, tok_dir):
    from scaletrain.config import load_config
    from scaletrain.trainer import train

    src = _write(tmp_path / "chat.jsonl", 300)
    args = [
        "--model.name=tiny-llama",
        "--model.vocab_size=300",
        f"--data.source={src}",
        f"--data.tokenizer={tok_dir}",
        "--data.format=sft",
        "--data.document_masking=true",
        "--batch.seq_len=32",
        "--batch.global_batch=4",
        "--batch.micro_batch=2",
        "--train.steps=3",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--guard.enabled=false",
        "--train.eval_every=2",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / 'run'}",
    ]
    r = train(load_config(None, args))
    assert len(r.losses) == 3 and all(torch.isfinite(torch.tensor(r.losses)))
    assert r.val_loss is not None and r.val_loss == r.val_loss


def test_window_of_prompt_only_has_zero_loss_and_gradient():
    logits = torch.randn(2, 5, 11, requires_grad=True)
    loss = causal_lm_loss(logits, torch.full((2, 5), -100))
    loss.backward()
    assert loss.item() == 0.0 and (logits.grad == 0).all()


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _chatml_dir(tmp_path, tok_dir, template=CHATML):
    """The test tokenizer with ChatML's specials added and a chat template in its config."""
    from tokenizers import Tokenizer

    out = tmp_path / "chatml"
    out.mkdir()
    hf = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    hf.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    hf.save(str(out / "tokenizer.json"))
    conf = json.loads((tok_dir / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**conf, "chat_template": template}))
    return out


def test_tokenizer_chat_template_trains_the_replies_and_matches_transformers(tmp_path, tok_dir):
    """The tokenizer's own template renders the text transformers' apply_chat_template renders;
    the trained tokens are each reply and the template's end-of-turn text, nothing else."""
    transformers = pytest.importorskip("transformers")
    from scaletrain.data.sft import chat_template_for

    d = _chatml_dir(tmp_path, tok_dir)
    tok = PretrainedTokenizer.load(d)
    cfg = DataConfig(tokenizer=str(d), format="sft")
    template = chat_template_for(cfg, tok)
    assert template is not None
    conv = [
        ("system", "be brief"),
        ("user", "how are you"),
        ("assistant", "fine thanks"),
        ("user", "two plus two"),
        ("assistant", "four"),
    ]
    ids, mask = render_example(conv, tok, template)
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"))
    theirs.chat_template = CHATML
    text = theirs.apply_chat_template([{"role": r, "content": c} for r, c in conv], tokenize=False)
    assert tok.decode(ids) == text
    spans, cur = [], []
    for i, m in zip([*ids, -1], [*mask, 0], strict=True):
        if m:
            cur.append(i)
        elif cur:
            spans.append(tok.decode(cur))
            cur = []
    assert spans == ["fine thanks<|im_end|>\n", "four<|im_end|>\n"]
    # 'builtin' ignores the tokenizer's template
    builtin = DataConfig(tokenizer=str(d), format="sft", chat_template="builtin")
    assert chat_template_for(builtin, tok) is None


@pytest.mark.parametrize(
    "template, why",
    [
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed to render"),
        ("{{ cycler.__init__.__globals__.os.system('touch PWNED') }}", "failed to render"),
        (
            "{% for m in messages %}{{ raise_exception('no system role') }}{% endfor %}",
            "the template refused: no system role",
        ),
        ("{% for m in messages %}", "fix the Jinja2 template"),
        (
            "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
            "prefix differently",
        ),
    ],
)
def test_hostile_or_broken_templates_are_one_line_errors(
    tmp_path, tok_dir, monkeypatch, template, why
):
    """A template from disk runs in Jinja2's sandbox: reaching for Python internals is refused
    (no file is created); broken or prefix-unstable templates name the file and the fix."""
    from scaletrain.data.sft import chat_template_for

    monkeypatch.chdir(tmp_path)
    d = _chatml_dir(tmp_path, tok_dir, template)
    tok = PretrainedTokenizer.load(d)
    with pytest.raises(ConfigError, match="data.chat_template") as e:
        render_example(
            [("user", "hi"), ("assistant", "yo")],
            tok,
            chat_template_for(DataConfig(tokenizer=str(d), format="sft"), tok),
        )
    assert why in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "PWNED").exists()


def test_tokenizer_template_required_but_missing(tok_dir):
    from scaletrain.data.sft import chat_template_for

    cfg = DataConfig(tokenizer=str(tok_dir), format="sft", chat_template="tokenizer")
    with pytest.raises(ConfigError, match="has no chat template"):
        chat_template_for(cfg, PretrainedTokenizer.load(tok_dir))


def test_sft_shards_use_the_tokenizer_template(tmp_path, tok_dir):
    """build_data with a templated tokenizer: the trained targets are exactly the replies'
    tokens and ChatML's end-of-turn; the built-in's 'Assistant: ' never appears."""
    d = _chatml_dir(tmp_path, tok_dir)
    tok = PretrainedTokenizer.load(d)
    src = _write(tmp_path / "chat.jsonl", 60)
    cfg = DataConfig(
        source=str(src),
        tokenizer=str(d),
        format="sft",
        cache_dir=str(tmp_path / "cache"),
        val_fraction=0.1,
    )
    with build_data(cfg, seq_len=64, micro_batch=4) as data:
        _, targets = next(data.train_batches())
    trained = targets[targets != -100].tolist()
    end = tok.encode("<|im_end|>")
    assert len(end) == 1 and end[0] in trained
    assert tok.encode("<|im_start|>")[0] not in trained
    assert "Assistant:" not in tok.decode(targets.clamp(min=0).flatten().tolist())
