"""`checkpoint.init_from` of a small transformers DeepseekV3ForCausalLM on one process: the
trainer's first-step loss is transformers' float64 loss, the trained model exports back to a
directory transformers reloads with the trainer's logits (and its moved balancing bias), and
the CLI continues it on a JSONL corpus with its own tokenizer from that same loss.
(Multi-process layouts: tests/distributed/test_deepseek_layouts.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from scaletrain.config import load_config
from scaletrain.trainer import train
from tests._hf_models import first_step_batches, hf_args, hf_loss, make_hf_model

transformers = pytest.importorskip("transformers")

RTOL = 1e-4  # fp32 trainer vs float64 reference (tests/integration/test_hf_init.py)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_hf_model("deepseek_v3", tmp_path_factory.mktemp("hf") / "deepseek_v3")


def test_first_loss_equals_transformers_and_export_reloads(model_dir, tmp_path):
    job = load_config(None, hf_args(tmp_path, model_dir, "run", "--checkpoint.export_hf=true"))
    assert job.model.is_mla and job.model.num_dense_layers == 1
    reference = hf_loss(model_dir, first_step_batches(job))
    r = train(job)
    assert r.losses[0] == pytest.approx(reference, rel=RTOL)
    assert r.losses[-1] != r.losses[0]  # it trained

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "run" / "hf",
        dtype=torch.float32,
        attn_implementation="eager",
        experts_implementation="eager",
    ).eval()
    # the bias moved over the steps (gamma 0.001 per step) and was exported with the weights
    bias = hf.model.layers[1].mlp.gate.e_score_correction_bias
    start = transformers.AutoModelForCausalLM.from_pretrained(model_dir).model.layers[1]
    assert not torch.equal(bias, start.mlp.gate.e_score_correction_bias)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    r.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(r.model(tokens), hf(tokens).logits, atol=1e-4, rtol=1e-4)


def test_jsonl_corpus_with_pretrained_tokenizer_through_the_cli(model_dir, tmp_path):
    from scaletrain.cli import main
    from tests._hf_models import make_tokenizer_dir

    rng = torch.Generator().manual_seed(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    docs = [
        " ".join(words[int(i)] for i in torch.randint(0, 8, (int(n),), generator=rng))
        for n in torch.randint(3, 30, (400,), generator=rng)
    ]
    tok_dir = make_tokenizer_dir(tmp_path / "tok", docs, vocab_size=120)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    args = hf_args(
        tmp_path, model_dir, "cli", f"--data.source={corpus}", f"--data.tokenizer={tok_dir}"
    )
    reference = hf_loss(model_dir, first_step_batches(load_config(None, args)))
    assert main(["train", *args]) in (0, None)
    first = json.loads((tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss"] == pytest.approx(reference, rel=RTOL)


def test_resume_restores_the_balancing_bias(tmp_path):
    """The router bias is a checkpointed buffer: 6 steps straight == 3, stop, resume, 3 (fp32
    CPU), losses, weights and biases identical; the bias moved (rate 0.05 per step)."""

    def job(name):
        return load_config(
            None,
            [
                "--model.name=tiny-deepseek",
                "--model.router_bias_rate=0.05",
                "--batch.seq_len=32",
                "--batch.global_batch=4",
                "--batch.micro_batch=2",
                "--train.steps=6",
                "--train.eval_every=1000",
                "--train.sample_tokens=0",
                "--train.progress=false",
                "--train.tensorboard=false",
                "--data.num_tokens=60000",
                f"--data.cache_dir={tmp_path / 'cache'}",
                f"--train.run_dir={tmp_path / name}",
                "--optim.warmup_steps=0",
            ],
        )

    straight = train(job("straight"))
    first = train(job("split"), max_steps=3)
    second = train(job("split"))
    assert first.losses + second.losses == straight.losses  # exact
    a, b = straight.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    biases = [v for k, v in a.items() if k.endswith("expert_bias")]
    assert len(biases) == 2 and all(v.abs().max() > 0 for v in biases)
