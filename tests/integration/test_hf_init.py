"""`checkpoint.init_from`: a transformers-saved directory initializes the trainer's model.

The first step's loss (before any update) equals transformers' own loss on the same batch, for
GPT-2 (tied head), Llama with GQA (untied, also saved as several shards), Mixtral, Qwen2 (q/k/v
biases, tied head), Qwen3 (q/k norms, head_dim != hidden / heads), Phi-3 (fused tensors, a
sliding window shorter than the sequence), Qwen3-MoE (8 experts, top 3), Gemma 2 (local and
global layers, soft-capped scores and logits) and Gemma 3 (q/k norms, a local RoPE base); after
a few steps the exported weights reload in transformers with the trainer's logits.
"""

from __future__ import annotations

import json

import pytest
import torch

from scaletrain.checkpoint.hf_load import load_hf_weights
from scaletrain.config import ConfigError, load_config
from scaletrain.models import build_model
from scaletrain.trainer import train
from tests._hf_models import first_step_batches, hf_args, hf_loss, make_hf_model

transformers = pytest.importorskip("transformers")

# fp32 trainer vs a float64 reference: the sums are a few hundred terms of O(1) values, so the
# fp32 rounding is ~1e-6 relative; 1e-4 is the bound.
RTOL = 1e-4


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {
        "gpt2": make_hf_model("gpt2", root / "gpt2"),
        "llama": make_hf_model("llama", root / "llama"),
        "llama-sharded": make_hf_model("llama", root / "llama-sharded", max_shard_size="20KB"),
        "mixtral": make_hf_model("mixtral", root / "mixtral"),
        **{k: make_hf_model(k, root / k) for k in FAMILIES},
    }


FAMILIES = ("qwen2", "qwen3", "phi3", "qwen3_moe", "gemma2", "gemma3_text")


@pytest.mark.parametrize("kind", ["gpt2", "llama", "llama-sharded", "mixtral", *FAMILIES])
def test_first_loss_equals_transformers_and_export_reloads(kind, hf_dirs, tmp_path):
    model_dir = hf_dirs[kind]
    if kind == "llama-sharded":
        assert (model_dir / "model.safetensors.index.json").is_file()
        assert len(list(model_dir.glob("*.safetensors"))) > 1
    job = load_config(None, hf_args(tmp_path, model_dir, "run", "--checkpoint.export_hf=true"))
    assert job.model.vocab_size == 260 and job.model.num_layers == 2
    reference = hf_loss(model_dir, first_step_batches(job))
    r = train(job)
    assert r.losses[0] == pytest.approx(reference, rel=RTOL)
    assert r.losses[-1] != r.losses[0]  # it trained

    # the exported weights are the trained ones: transformers gives the trainer's logits
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "run" / "hf", dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    r.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(r.model(tokens), hf(tokens).logits, atol=1e-4, rtol=1e-4)


def test_resume_wins_over_init_from(hf_dirs, tmp_path):
    """A run stopped after 2 steps resumes from its own checkpoint, not from init_from: the
    resumed losses continue the straight run's."""
    args = hf_args(tmp_path, hf_dirs["llama"], "resumed")
    straight = train(load_config(None, hf_args(tmp_path, hf_dirs["llama"], "straight"))).losses
    first = train(load_config(None, args), max_steps=2).losses
    rest = train(load_config(None, args)).losses
    assert first + rest == pytest.approx(straight, rel=1e-6)
    assert rest[0] != pytest.approx(straight[0], rel=1e-3)


def test_shape_mismatch_names_the_tensor(hf_dirs, tmp_path):
    cfg = load_config(
        None,
        [f"--checkpoint.init_from={hf_dirs['llama']}", "--model.ffn_dim=64", "--batch.seq_len=32"],
    ).model
    model = build_model(cfg, device="cpu")
    with pytest.raises(ConfigError, match=r"model\.safetensors:model\.layers\.0\.mlp\."):
        load_hf_weights(model, cfg, hf_dirs["llama"])


def test_bad_directories_fail_in_one_line(hf_dirs, tmp_path):
    with pytest.raises(ConfigError, match="checkpoint.init_from"):
        load_config(None, [f"--checkpoint.init_from={tmp_path / 'nowhere'}", "--batch.seq_len=32"])
    bad = tmp_path / "qwen"
    bad.mkdir()
    cfg = json.loads((hf_dirs["llama"] / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "jamba"}))
    with pytest.raises(ConfigError, match="jamba"):
        load_config(None, [f"--checkpoint.init_from={bad}", "--batch.seq_len=32"])
    (bad / "config.json").write_text(json.dumps(cfg))
    # (the tiny models hold 64 positions: RoPE tables stop at model.max_seq_len)
    model_cfg = load_config(None, [f"--checkpoint.init_from={bad}", "--batch.seq_len=32"]).model
    with pytest.raises(ConfigError, match="no \\*.safetensors"):
        load_hf_weights(build_model(model_cfg, device="cpu"), model_cfg, bad)


def test_jsonl_corpus_with_pretrained_tokenizer_through_the_cli(hf_dirs, tmp_path):
    """The issue's path end to end: `scaletrain train --checkpoint.init_from=DIR` with the
    model's tokenizer.json and a JSONL corpus; the first loss is transformers' loss."""
    from scaletrain.cli import main
    from tests._hf_models import make_tokenizer_dir

    rng = torch.Generator().manual_seed(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    docs = [
        " ".join(words[int(i)] for i in torch.randint(0, 8, (int(n),), generator=rng))
        for n in torch.randint(3, 30, (400,), generator=rng)
    ]
    make_tokenizer_dir(hf_dirs["llama"], docs, vocab_size=120)  # the model dir holds it too
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    args = hf_args(
        tmp_path,
        hf_dirs["llama"],
        "cli",
        f"--data.source={corpus}",
        f"--data.tokenizer={hf_dirs['llama']}",
    )
    reference = hf_loss(hf_dirs["llama"], first_step_batches(load_config(None, args)))
    assert main(["train", *args]) in (0, None)
    first = json.loads((tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss"] == pytest.approx(reference, rel=RTOL)
