"""The single-process trainer end to end: accumulation, resume, precisions, overflow skip, CLI."""

import json

import pytest
import torch

from scaletrain.cli import main
from scaletrain.config import load_config
from scaletrain.trainer import train

from ..adam_tolerance import assert_adam_close

pytestmark = pytest.mark.slow


def _job(tmp_path, name, *extra):
    return load_config(
        None,
        [
            "--model.name=tiny",
            "--batch.seq_len=32",
            "--batch.global_batch=8",
            "--batch.micro_batch=8",
            "--train.steps=4",
            "--train.eval_every=1000",
            "--train.sample_tokens=0",
            "--train.progress=false",
            "--train.tensorboard=false",
            "--data.num_tokens=60000",
            f"--data.cache_dir={tmp_path / 'cache'}",
            f"--train.run_dir={tmp_path / name}",
            "--optim.warmup_steps=0",
            *extra,
        ],
    )


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_gradient_accumulation_matches_one_big_batch(tmp_path, optim):
    """4 micro-batches of 2 == one batch of 8 after one optimizer step (fp32).

    With SGD the update is linear in the gradient and every parameter agrees to ~2e-9 (bound
    1e-6, the acceptance figure). AdamW's first step is lr*g/(|g|+eps): where a gradient element
    is a cancellation, its fp32 summation-order noise is a large part of it and the normalized
    step passes it on whole, so element-wise only AdamW's own bound holds (`assert_adam_close`).
    """
    big = train(_job(tmp_path, "big", "--train.steps=1", f"--optim.name={optim}"))
    acc = train(
        _job(tmp_path, "acc", "--train.steps=1", "--batch.micro_batch=2", f"--optim.name={optim}")
    )
    assert big.losses[0] == pytest.approx(acc.losses[0], abs=1e-6)
    pairs = list(zip(big.model.named_parameters(), acc.model.parameters(), strict=True))
    worst = max((a - b).abs().max().item() for (_, a), b in pairs)
    if optim == "sgd":
        assert worst <= 1e-6
        return
    lr = _job(tmp_path, "lr").optim.lr
    for (name, a), b in pairs:
        assert_adam_close(a, b, lr=lr, steps=1, where=name)


@pytest.mark.parametrize("optim", ["adamw", "adamw8bit", "adafactor"])
def test_resume_is_bitwise_identical(tmp_path, optim):
    """2N steps straight == N steps, stop, resume, N steps (fp32 CPU): identical losses and
    final weights, for each optimizer whose states the DCP checkpoint holds (torchao's 8-bit
    codes and block scales, Adafactor's row and column moments)."""
    if optim == "adamw8bit":
        pytest.importorskip("torchao")
    args = ("--train.steps=6", "--data.prefetch=2", f"--optim.name={optim}")
    straight = train(_job(tmp_path, "straight", *args))
    first = train(_job(tmp_path, "split", *args), max_steps=3)
    assert first.steps == 3
    second = train(_job(tmp_path, "split", *args))
    assert second.steps == 6
    assert first.losses + second.losses == straight.losses  # exact equality, not approx
    pairs = zip(straight.model.parameters(), second.model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_low_precision_trains(tmp_path, dtype):
    r = train(
        _job(tmp_path, dtype, f"--precision.dtype={dtype}", "--train.steps=30", "--optim.lr=3e-3")
    )
    assert r.skipped_steps == 0 or dtype == "fp16"
    assert sum(r.losses[-5:]) / 5 < sum(r.losses[:5]) / 5 - 0.3


def test_fp16_skips_a_step_with_injected_overflow(tmp_path, monkeypatch):
    import scaletrain.trainer.build as loop

    real = loop.materialize
    calls = {"n": 0}

    def poison(model, **kw):
        real(model, **kw)
        p = next(model.parameters())

        def hook(grad):
            calls["n"] += 1
            return grad * float("inf") if calls["n"] == 2 else grad

        p.register_hook(hook)

    monkeypatch.setattr(loop, "materialize", poison)
    r = train(_job(tmp_path, "fp16", "--precision.dtype=fp16", "--train.steps=4"))
    assert r.skipped_steps == 1
    rows = [json.loads(line) for line in (tmp_path / "fp16" / "metrics.jsonl").open()]
    assert [row["skipped"] for row in rows] == [False, True, False, False]
    assert rows[1]["loss_scale"] == rows[0]["loss_scale"] / 2
    assert all(torch.isfinite(p).all() for p in r.model.parameters())


def test_cli_main_job_runs_and_reports(tmp_path, capsys):
    rc = main(
        [
            "train",
            "--model.name=tiny",
            "--batch.seq_len=32",
            "--batch.global_batch=4",
            "--batch.micro_batch=4",
            "--train.steps=3",
            "--train.sample_tokens=20",
            "--train.progress=false",
            "--data.num_tokens=60000",
            f"--data.cache_dir={tmp_path / 'cache'}",
            f"--train.run_dir={tmp_path / 'run'}",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "sample:" in out and "run directory:" in out and "tokens/s" in out
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(rows) == 3
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "mfu"} <= set(rows[0])
    assert 0 < rows[-1]["mfu"] < 1
    assert (tmp_path / "run" / "checkpoints" / "step_00000003" / "manifest.json").is_file()


def test_cli_bad_override_fails_before_work(tmp_path, capsys):
    rc = main(["train", "--optim.lr=-3", f"--train.run_dir={tmp_path / 'never'}"])
    assert rc == 2
    assert "optim.lr" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_export_hf_at_end_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    r = train(
        _job(
            tmp_path,
            "hf",
            "--model.name=tiny-llama",
            "--train.steps=2",
            "--checkpoint.export_hf=true",
        )
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "hf")
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        ours = r.model(x)
        theirs = hf(x).logits
    assert (ours - theirs).abs().max().item() <= 1e-4
    # the export and the run directory carry the tokenizer the model was trained with
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf" / "hf")
    assert tok.encode("héllo\n", add_special_tokens=False) == list("héllo\n".encode())
    assert (tmp_path / "hf" / "tokenizer" / "tokenizer.json").is_file()
    assert (tmp_path / "hf" / "tokenizer" / "name").read_text().strip() == "byte"


@pytest.mark.parametrize("kernel", ["auto", "emulated"])
def test_fp8_run_trains_with_fp32_master_weights(tmp_path, capsys, kernel):
    """Both GEMM kernels train; the run names its kernel in one start line
    (`precision.fp8_matmul`; 'auto' on a CPU: measured)."""
    from scaletrain.precision import Float8Linear

    r = train(
        _job(
            tmp_path,
            "fp8",
            "--model.name=tiny-llama",
            "--precision.dtype=fp8",
            f"--precision.fp8_matmul={kernel}",
            "--train.steps=25",
            "--optim.lr=3e-3",
        )
    )
    assert any(isinstance(m, Float8Linear) for m in r.model.modules())
    assert all(p.dtype == torch.float32 for p in r.model.parameters())
    assert sum(r.losses[-5:]) / 5 < sum(r.losses[:5]) / 5 - 0.3
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("fp8 matmul: ")]
    assert len(lines) == 1 and f"precision.fp8_matmul={kernel}" in lines[0]


def test_running_a_finished_run_again_trains_in_a_sibling_directory(tmp_path, capsys):
    first = train(_job(tmp_path, "again", "--train.steps=2"))
    second = train(_job(tmp_path, "again", "--train.steps=2"))
    assert first.steps == second.steps == 2 and len(second.losses) == 2
    assert second.run_dir == tmp_path / "again-2"
    assert "holds a finished run" in capsys.readouterr().out


def test_optimizer_offload_trains_and_resumes_like_adamw(tmp_path):
    """memory.offload=optimizer (CPUOffloadAdamW): the same losses as AdamW, and an exact resume
    from its checkpoint (the host-held moments are saved and restored)."""
    ref = train(_job(tmp_path, "ref", "--train.steps=6"))
    first = train(
        _job(tmp_path, "off", "--train.steps=6", "--memory.offload=optimizer"), max_steps=3
    )
    rest = train(_job(tmp_path, "off", "--train.steps=6", "--memory.offload=optimizer"))
    assert first.losses + rest.losses == ref.losses


def test_sample_of_a_char_model_whose_head_has_more_rows_than_characters(tmp_path):
    """A 1-step model over 20 characters with a 128-row head: near-uniform logits would pick
    a row past the characters almost surely in 60 draws (it raised IndexError in decode)."""
    chars = "The abcdfgijklmnopq\n"
    text = tmp_path / "text.txt"
    text.write_text(chars * 4000)
    r = train(
        _job(
            tmp_path,
            "char",
            f"--data.source={text}",
            "--data.tokenizer=char",
            "--model.vocab_size=128",
            "--train.steps=1",
            "--train.sample_tokens=60",
        )
    )
    assert len(r.sample) == 60 and set(r.sample) <= set(chars)
