"""QLoRA (`lora.base_dtype`, `models.quantized`): the frozen projections stored in NF4, int8 or
bf16, each format's dequantization error held to the bound its definition gives, only the
adapters training, and the adapters exported in PEFT's format giving, on the `transformers`
Llama and Qwen2 with the dequantized base, the logits scaletrain computes."""

from __future__ import annotations

import pytest
import torch

from scaletrain.checkpoint.hf import export_hf
from scaletrain.checkpoint.hf_load import load_hf_weights
from scaletrain.checkpoint.peft import export_peft_adapters
from scaletrain.config import ConfigError, LoraConfig, load_config, model_from_hf_config
from scaletrain.config.lora import NF4_BLOCK, nf4_scaler_block
from scaletrain.dtensor import local_bytes
from scaletrain.models import build_model, materialize
from scaletrain.models.lora import apply_lora
from scaletrain.models.quantized import FrozenLinear, quantize_weight
from scaletrain.trainer.build import build_run
from scaletrain.trainer.step import apply_update, train_step

from .._hf_models import make_hf_model
from ..adam_tolerance import float64_default
from ..token_loss import global_batch

ALL = "wq,wk,wv,wo,w1,w2,w3"


def _weight(rows: int = 64, cols: int = 512, seed: int = 0) -> torch.Tensor:
    """A float32 weight with rows of very different scales and a few outliers (what makes
    the per-block and per-row scales matter)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 0, rows).unsqueeze(1)
    w.view(-1)[torch.randint(0, rows * cols, (20,), generator=g)] *= 8.0
    return w


def test_nf4_error_is_within_the_format_bound():
    """NF4 (QLoRA sec. 3): each block of 64 values is divided by its absmax a, rounded to the
    nearest of 16 NormalFloat levels, and stored with a' = the int8 double-quantized absmax.
    Rounding to the nearest level moves w / a by at most half the widest gap between
    neighbouring levels (G/2); a' differs from a by at most s/128, s = the largest |a - mean|
    of the absmaxes in its second-level block (int8 steps of 2s/256, the top one clamped to
    127: one full step). So |w - w'| <= a G/2 + s/128 per block, plus float32 rounding."""
    w = _weight()
    q = quantize_weight(w, "nf4")["weight"]
    deq = q.get_original_weight()
    levels = q.nf4.sort().values
    half_gap = float((levels[1:] - levels[:-1]).max()) / 2  # 0.1519: between -1 and -0.6962
    blocks = w.reshape(-1, NF4_BLOCK)
    a = blocks.abs().amax(dim=1)  # (n_blocks,)
    groups = (a - a.mean()).reshape(-1, nf4_scaler_block(w.numel()))
    s = groups.abs().amax(dim=1, keepdim=True).expand_as(groups).reshape(-1)
    bound = a * half_gap + s / 128 + 8 * torch.finfo(torch.float32).eps * a
    err = (deq - w).reshape(-1, NF4_BLOCK).abs().amax(dim=1)
    assert bool((err <= bound).all()), float((err - bound).max())
    assert float((err / bound).max()) > 0.5  # the bound is the format's, not a loose one


def test_int8_error_is_within_half_a_step_per_row():
    """torchao's int8 weight-only format: symmetric per row, scale = absmax / 127.5, codes =
    round(w / scale) clamped to [-128, 127]: at most half a step off, absmax / 255 (the row's
    absmax itself: 127.5 rounds to 128, clamped to 127), plus float32 rounding of the scale
    and of code x scale (a few eps x absmax)."""
    w = _weight(seed=1)
    pieces = quantize_weight(w, "int8")
    codes, scale = pieces["weight"], pieces["weight_scale"]
    assert codes.dtype == torch.int8 and scale.shape == (w.shape[0], 1)
    err = (codes.float() * scale - w).abs().amax(dim=1)
    absmax = w.abs().amax(dim=1)
    bound = absmax / 255 + 4 * torch.finfo(torch.float32).eps * absmax
    assert bool((err <= bound).all())
    assert float((err / bound).max()) > 0.9


@pytest.mark.parametrize(
    ("base_dtype", "bytes_per_value"),
    [
        ("bf16", 2.0),
        ("int8", 1.0 + 4 / 512),  # int8 codes + one fp32 scale per row of 512
        # QLoRA's NF4: 4-bit codes, an int8 absmax per 64 values, an fp32 factor per 256
        # absmaxes, one fp32 mean and the 16 fp32 levels per tensor
        ("nf4", 0.5 + 1 / 64 + 4 / (64 * 256) + (4 + 16 * 4) / (64 * 512)),
    ],
)
def test_stored_bytes_per_value(base_dtype, bytes_per_value):
    stored = quantize_weight(torch.zeros(64, 512), base_dtype)
    assert sum(local_bytes(t) for t in stored.values()) == pytest.approx(64 * 512 * bytes_per_value)


def _stored(p: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding `p` (an NF4's codes and scales: its clone would requantize)."""
    flatten = getattr(p, "__tensor_flatten__", None)
    if type(p) not in (torch.Tensor, torch.nn.Parameter) and flatten is not None:
        return [getattr(p, name).detach().clone() for name in flatten()[0]]
    return [p.detach().clone()]


@pytest.mark.parametrize("base_dtype", ["bf16", "int8", "nf4"])
def test_every_projection_is_frozen_and_stored_and_only_adapters_train(tmp_path, base_dtype):
    job = load_config(
        None,
        {
            "model": {"name": "tiny-llama"},
            "lora": {"rank": 4, "targets": "wq,wv", "base_dtype": base_dtype},
            "batch": {"seq_len": 16, "micro_batch": 1, "global_batch": 2},
            "train": {"run_dir": str(tmp_path), "device": "cpu"},
            "hardware": {"gpu": "cpu"},
        },
    )
    run = build_run(job, data=False)
    frozen = [m for m in run.model.modules() if isinstance(m, FrozenLinear)]
    assert len(frozen) == 7 * job.model.num_layers and all(m.quantized for m in frozen)
    before = {n: _stored(p) for n, p in run.model.named_parameters()}
    inputs, targets = global_batch(job.model.vocab_size)
    apply_update(
        run, train_step(run, iter([(inputs[k : k + 1], targets[k : k + 1]) for k in range(2)]))
    )
    for n, p in run.model.named_parameters():
        assert p.requires_grad == (".lora_" in n), n
        if not p.requires_grad:  # frozen: the stored form untouched
            assert all(torch.equal(a, b) for a, b in zip(_stored(p), before[n], strict=True)), n


@pytest.mark.parametrize(
    ("lora", "parallel", "field"),
    [
        ({"base_dtype": "nf4"}, {}, "lora.base_dtype"),  # no adapters, nothing to freeze
        ({"rank": 4, "base_dtype": "nf4"}, {"dp": 2, "zero": 3}, "lora.base_dtype"),  # 1 group
        (
            {"rank": 4, "base_dtype": "nf4"},
            {"dp": 4, "zero": 3, "dp_replicate": 2},
            "parallel.dp_replicate",
        ),
        ({"rank": 4, "base_dtype": "int8"}, {"tp": 2}, "lora.base_dtype"),
    ],
)  # fmt: skip
def test_what_qlora_does_not_run_is_refused_naming_the_field(tmp_path, lora, parallel, field):
    job = load_config(
        None,
        {
            "model": {"name": "tiny-llama"},  # k: 32 x 64 = one group of 32 NF4 blocks
            "parallel": parallel,
            "lora": lora,
            "batch": {"seq_len": 16, "micro_batch": 1, "global_batch": 4},
            "train": {"run_dir": str(tmp_path), "device": "cpu"},
        },
    )
    with pytest.raises(ConfigError) as e:
        job.layout(4 if "dp_replicate" in parallel else 2 if parallel else 1)
    assert e.value.field == field


def test_nf4_shards_are_the_single_process_quantization():
    """Quantized whole then split as FSDP2 splits it (`torch.chunk` on rows): each shard
    dequantizes to the whole tensor's rows (one mean of the block scales for every shard)."""
    whole = quantize_weight(_weight(64, 512), "nf4")["weight"]
    deq = whole.get_original_weight()
    for i, shard in enumerate(torch.chunk(whole, 2, dim=0)):
        assert shard.shape == (32, 512)
        torch.testing.assert_close(
            shard.get_original_weight(), deq[32 * i : 32 * (i + 1)], rtol=0, atol=0
        )


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("base_dtype", ["nf4", "int8"])
def test_peft_adapters_on_the_dequantized_base_give_our_logits(tmp_path, kind, base_dtype):
    """Our QLoRA model (the HF model's weights, quantized; adapters with B != 0, as after
    training) exports its base dequantized and its adapters in PEFT's format; `transformers`
    + `peft` then compute our logits. Both sides multiply the same dequantized float64
    values, so the bound is the existing LoRA test's: transformers' RMSNorm and RoPE run in
    float32 inside a float64 model (2^-24 x |logit| < 0.4 x a few norms ~ 1e-7)."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    hf_dir = make_hf_model(kind, tmp_path / "hf")
    cfg = model_from_hf_config(str(hf_dir))
    lora = LoraConfig(rank=4, alpha=8.0, targets=ALL, base_dtype=base_dtype)
    with float64_default():
        model = apply_lora(build_model(cfg, device="meta"), lora)
        materialize(model, seed=5)
        load_hf_weights(model, cfg, hf_dir)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".lora_B." in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        export_hf(model, cfg, tmp_path / "base")  # dequantized base, adapters apart
        export_peft_adapters(model, cfg, lora, tmp_path / "adapter")
        tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
        model.eval()
        kw = {"dtype": torch.float64, "attn_implementation": "eager"}
        with torch.no_grad():
            ours = model(tokens)
            full = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, **kw).eval()
            unquantized = full(tokens).logits
            base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", **kw)
            plain = base.eval()(tokens).logits
            adapted = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
            theirs = adapted(tokens).logits
    assert (plain - ours).abs().max() > 1e-3  # the adapters matter
    assert (plain - unquantized).abs().max() > 1e-5  # the base was quantized
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-6)
