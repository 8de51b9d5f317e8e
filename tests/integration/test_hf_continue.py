"""Issue #35's continuation acceptance: a small model of each supported Llama-like family,
trained a few steps by transformers itself on a JSONL corpus and saved with its tokenizer
(`tokenizers` BPE wrapped in `PreTrainedTokenizerFast`, `save_pretrained`), is continued by
`scaletrain train --checkpoint.init_from=org/name --data.tokenizer=org/name` from a local
Hugging Face cache (no network), and the run's first loss is that model's loss on the same
first batch (transformers in float64).

Tolerance: the CLI trains in fp32 (unit roundoff u = 2^-24 = 6e-8). Every logit is the end of a
chain of dot products and sums: per layer a norm (32 terms), q/k/v (32), scores (head dim
<= 16), softmax and P.V (<= 32 keys), o (32), a norm, gate/up (32), down (48); then the final
norm and the head (32). A sum of n terms carries a relative error of at most ~n u (Higham,
"Accuracy and Stability of Numerical Algorithms", 2002, sec. 3.1), and the errors of a chain add
to first order: ~2 x 270 + 64 ~ 600 u ~ 4e-5 relative on a logit of O(1). The loss per token,
log-sum-exp(z) - z_target (a sum of ~260 exponentials, 260 u more), is then off by at most
~1e-4 absolute at logits of a few units, ~2e-5 of a loss of ~5; the batch mean keeps the
relative size. RTOL = 1e-4 holds that worst case with 5x to spare (measured: 2e-8 to 4e-8, the
sqrt(n) u of random rounding); a weight read wrong (a transposed, swapped or dropped tensor, a
bias missing) moves the loss by 1e-2 or more.
"""

from __future__ import annotations

import json

import pytest
import torch

from scaletrain.cli import main
from scaletrain.config import load_config
from tests._hf_hub import put_in_hub_cache
from tests._hf_models import VOCAB, _config, first_step_batches, hf_args, hf_loss

transformers = pytest.importorskip("transformers")

RTOL = 1e-4  # derivation in the module docstring
FAMILIES = ("llama", "llama-bias", "mistral", "qwen2", "qwen3", "phi3")
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def _family_config(kind: str):
    if kind == "mistral":  # a window (16) shorter than the runs' sequences (32)
        return transformers.MistralConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rope_theta=500.0,
            sliding_window=16,
        )
    if kind == "llama-bias":  # biases on q/k/v/o and the MLP (LlamaConfig's two fields)
        cfg = _config("llama")
        cfg.attention_bias = cfg.mlp_bias = True
        return cfg
    return _config(kind)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    g = torch.Generator().manual_seed(0)
    docs = [
        " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (int(n),), generator=g))
        for n in torch.randint(3, 30, (300,), generator=g)
    ]
    path = root / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return docs, path


@pytest.fixture(scope="module")
def tokenizer(corpus):
    """A byte-level BPE trained by `tokenizers` on the corpus, as transformers wraps it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus[0],
        trainer=trainers.BpeTrainer(
            vocab_size=200,
            special_tokens=["<s>", "</s>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>"
    )


def _train_with_transformers(kind, docs, tok, out_dir, steps=6):
    """A few fp32 AdamW steps of transformers' own model on the corpus (documents joined by
    EOS, cut into 33-token windows); saved with the tokenizer. Returns (first, last) loss."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        _family_config(kind), dtype=torch.float32, attn_implementation="eager"
    )
    ids = [i for d in docs for i in [*tok(d)["input_ids"], tok.eos_token_id]]
    windows = torch.tensor(ids[: len(ids) // 33 * 33]).view(-1, 33)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        batch = windows[torch.randint(0, len(windows), (8,), generator=g)]
        loss = model(batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return losses[0], losses[-1]


def _tensor_names(model_dir):
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("kind", FAMILIES)
def test_continuing_a_transformers_trained_model_starts_at_its_loss(
    kind, corpus, tokenizer, tmp_path, monkeypatch
):
    docs, corpus_path = corpus
    model_dir = tmp_path / "saved"
    first, last = _train_with_transformers(kind, docs, tokenizer, model_dir)
    assert last < first - 0.5, (first, last)  # transformers' steps trained it
    repo = f"acme/tiny-{kind}"
    if kind == "llama-bias":  # the biases are in the file (trained off zero) and read back
        assert "model.layers.0.mlp.down_proj.bias" in _tensor_names(model_dir)
    put_in_hub_cache(model_dir, tmp_path / "hub", repo)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    args = hf_args(
        tmp_path,
        repo,
        "run",
        f"--data.source={corpus_path}",
        f"--data.tokenizer={repo}",
        steps=2,
    )
    reference = hf_loss(model_dir, first_step_batches(load_config(None, args)))
    assert main(["train", *args]) in (0, None)
    ours = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    print(
        f"{kind}: first loss {ours:.8f}, transformers {reference:.8f}, "
        f"rel diff {abs(ours - reference) / reference:.1e} (trained {first:.3f} -> {last:.3f})"
    )
    assert ours == pytest.approx(reference, rel=RTOL)
