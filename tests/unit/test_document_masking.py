"""Document masking: a packed sequence's logits equal those of its documents run one by one
(float64, naive and SDPA cores, learned and rotary positions)."""

from __future__ import annotations

import pytest
import torch

from scaletrain.config import ConfigError, DataConfig, ModelConfig, model_preset
from scaletrain.models import build_model
from scaletrain.models.documents import document_layout

SEP = 5

CFGS = {
    "gpt2": lambda attn: ModelConfig(
        vocab_size=50, dim=32, num_layers=2, num_heads=4, max_seq_len=64, attention=attn
    ),
    "llama-gqa": lambda attn: model_preset(
        "tiny-llama", vocab_size=50, dim=32, ffn_dim=48, num_heads=4, num_kv_heads=2, attention=attn
    ),
    "moe": lambda attn: model_preset(
        "tiny-moe", vocab_size=50, dim=32, ffn_dim=40, max_seq_len=64, attention=attn
    ),
}


def _docs(gen):
    lens = (7, 1, 12, 5)
    docs = [torch.randint(6, 50, (n,), generator=gen) for n in lens]
    return [torch.cat([d, torch.tensor([SEP])]) for d in docs[:-1]] + [docs[-1]]


def test_layout_positions_and_mask():
    tokens = torch.tensor([[1, SEP, 2, 3, SEP, SEP, 4]])
    lay = document_layout(tokens, SEP)
    assert lay.positions.tolist() == [[0, 1, 0, 1, 2, 0, 0]]
    m = lay.mask[0, 0]
    assert m[3].tolist() == [False, False, True, True, False, False, False]
    assert m[5].tolist() == [False] * 5 + [True, False]
    assert m[6].tolist() == [False] * 6 + [True]


@pytest.mark.parametrize("attn", ["naive", "sdpa"])
@pytest.mark.parametrize("name", list(CFGS))
def test_packed_logits_equal_separate_documents(name, attn):
    model = build_model(CFGS[name](attn), device="cpu", seed=3).double().eval()
    gen = torch.Generator().manual_seed(0)
    rows = [_docs(gen), _docs(gen)]
    packed = torch.stack([torch.cat(r) for r in rows])  # (2, T)
    model.document_sep_id = SEP
    with torch.no_grad():
        got = model(packed)  # (2, T, V)
        model.document_sep_id = None
        unmasked = model(packed)
        for b, docs in enumerate(rows):
            start = 0
            for d in docs:
                alone = model(d[None])[0]  # (len, V)
                # float64 model, but the naive core's softmax is fp32 on purpose (eps 6e-8):
                # O(1) logits then differ by ~1e-8 with the different masked row lengths
                torch.testing.assert_close(got[b, start : start + len(d)], alone, atol=1e-7, rtol=0)
                start += len(d)
    # without masking, later documents see earlier ones: the check above can fail
    assert (unmasked - got).abs().max() > 1e-3


def test_document_masking_needs_an_eos_token():
    with pytest.raises(ConfigError, match="data.document_masking"):
        DataConfig(document_masking=True)


def test_trainer_enables_masking_with_the_tokenizers_eos(tmp_path):
    import json

    from scaletrain.config import load_config
    from scaletrain.trainer import train

    corpus = tmp_path / "c.jsonl"
    words = ["red", "green", "blue", "cyan", "magenta", "yellow"]
    gen = torch.Generator().manual_seed(0)
    corpus.write_text(
        "".join(
            json.dumps(
                {"text": " ".join(words[int(i)] for i in torch.randint(0, 6, (20,), generator=gen))}
            )
            + "\n"
            for _ in range(300)
        )
    )
    args = [
        "--model.name=tiny-llama",
        "--model.vocab_size=300",
        "--data.tokenizer=bpe",
        "--data.bpe_vocab_size=280",
        f"--data.source={corpus}",
        "--data.document_masking=true",
        "--batch.seq_len=32",
        "--batch.global_batch=4",
        "--batch.micro_batch=2",
        "--train.steps=2",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--guard.enabled=false",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / 'run'}",
    ]
    r = train(load_config(None, args))
    from scaletrain.data import BPETokenizer

    shard = next((tmp_path / "cache").glob("text-*"))
    assert r.model.document_sep_id == BPETokenizer.load(shard).eos_id is not None
    assert all(torch.isfinite(torch.tensor(r.losses)))


def test_layouts_refused_and_accepted():
    from types import SimpleNamespace as NS

    from scaletrain.config import resolve_model
    from scaletrain.models import build_model
    from scaletrain.trainer.documents import enable_document_masking

    def run(pp=1, cp=1, tp=1):
        return NS(
            job=NS(data=NS(document_masking=True), model=NS(position="rope")),
            dims=NS(layout=NS(pp=pp, cp=cp, tp=tp)),
            data=NS(tokenizer=NS(name="bpe", eos_id=7)),
            model=build_model(resolve_model("tiny-llama")),
            pipeline=NS(document_sep_id=None) if pp > 1 else None,
        )

    r = run(pp=2)  # the pipeline hands every stage the document ids (parity: tests/distributed)
    enable_document_masking(r)
    assert r.pipeline.document_sep_id == r.model.document_sep_id == 7
    r = run(cp=2, tp=2)  # ring attention under tp (parity: tests/distributed)
    enable_document_masking(r)
    assert r.model.document_sep_id == 7
    r = run(cp=2)  # ring attention masks with the whole sequence's document ids
    enable_document_masking(r)
    assert r.model.document_sep_id == 7
