"""Create a tiny local Hugging Face model directory plus corpora to fine-tune it on.

    python scripts/make_tiny_hf.py runs/tiny-hf [--arch llama|gpt2|mixtral]

Writes, with no network and no hub:
  runs/tiny-hf/model/        config.json, model.safetensors (transformers' save_pretrained),
                             tokenizer.json + tokenizer_config.json (a byte-level BPE trained by
                             `tokenizers` on the corpus below, `<|endoftext|>` as EOS)
  runs/tiny-hf/corpus.jsonl  {"text": ...} documents of scaletrain's generated grammar
  runs/tiny-hf/heldout.jsonl more documents of it, from another seed (a held-out eval set)
  runs/tiny-hf/chat.jsonl    {"prompt": ..., "response": ...} pairs (continue the story)

The model is randomly initialized: it stands in for a downloaded checkpoint in the README's
"Fine-tune a Hugging Face model" walk-through (`configs/continue-pretraining.toml`,
`configs/sft.toml`). A real one (e.g. a saved Llama directory) is used the same way.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from scaletrain.data import generate_text


def _documents(num_bytes: int, seed: int) -> list[str]:
    return [line for line in generate_text(num_bytes, seed).splitlines() if line.strip()]


def _tokenizer(out: Path, texts: list[str], vocab_size: int) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {"bos_token": None, "eos_token": "<|endoftext|>", "add_bos_token": False}, indent=1
        )
    )
    return tok.get_vocab_size()


def _model(arch: str, vocab: int):
    import transformers as tf

    llama = {
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "eos_token_id": 0,
        "bos_token_id": 0,
    }
    if arch == "llama":
        cfg = tf.LlamaConfig(**llama)
    elif arch == "mixtral":
        cfg = tf.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **llama)
    else:
        cfg = tf.GPT2Config(
            vocab_size=vocab,
            n_positions=256,
            n_embd=64,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="runs/tiny-hf")
    ap.add_argument("--arch", choices=("llama", "gpt2", "mixtral"), default="llama")
    ap.add_argument("--vocab-size", type=int, default=512)
    args = ap.parse_args()
    out = Path(args.out)
    (out / "model").mkdir(parents=True, exist_ok=True)
    docs = _documents(400_000, seed=7)
    vocab = _tokenizer(out / "model", docs, args.vocab_size)
    _model(args.arch, vocab).save_pretrained(out / "model", safe_serialization=True)
    (out / "corpus.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    held = _documents(20_000, seed=8)
    (out / "heldout.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in held))
    pairs = []
    for d in docs[:3000]:
        sentences = [s.strip() + "." for s in d.split(".") if s.strip()]
        if len(sentences) >= 2:
            pairs.append({"prompt": sentences[0], "response": " ".join(sentences[1:])})
    (out / "chat.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    print(
        f"wrote {out / 'model'} ({args.arch}, vocab {vocab}), {out / 'corpus.jsonl'} "
        f"({len(docs)} documents), {out / 'heldout.jsonl'} ({len(held)} documents), "
        f"{out / 'chat.jsonl'} ({len(pairs)} pairs)"
    )


if __name__ == "__main__":
    main()
