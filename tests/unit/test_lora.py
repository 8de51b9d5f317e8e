"""LoRA (`models.lora`, `[lora]`): config checks, a frozen base with trainable adapters only, and
the adapters in PEFT's format: `peft.PeftModel.from_pretrained` on the `transformers` Llama of
our HF export gives our logits, and so does the merged export alone (float64)."""

from __future__ import annotations

import json

import pytest
import torch

from scaletrain.checkpoint.hf import export_hf
from scaletrain.checkpoint.peft import ADAPTER_CONFIG, ADAPTER_WEIGHTS, export_peft_adapters
from scaletrain.config import ConfigError, LoraConfig, load_config, model_preset
from scaletrain.models import build_model, materialize
from scaletrain.models.lora import LoRALinear, apply_lora
from scaletrain.trainer.build import build_run
from scaletrain.trainer.step import apply_update, train_step

from ..adam_tolerance import float64_default
from ..token_loss import global_batch

ALL = "wq,wk,wv,wo,w1,w2,w3"
ZB = {"pp": 2, "pp_schedule": "zero-bubble", "pp_virtual": 2}
DUALPIPEV = {"pp": 2, "pp_schedule": "dualpipev", "pp_virtual": 2}


def _job(
    tmp_path, lora: dict, model: str = "tiny-llama", layers: int = 0, batch: int = 2, **parallel
):
    return load_config(
        None,
        {
            "model": {"name": model, **({"num_layers": layers} if layers else {})},
            "parallel": parallel,
            "lora": lora,
            "batch": {"seq_len": 16, "micro_batch": 1, "global_batch": batch},
            "train": {"run_dir": str(tmp_path), "device": "cpu"},
            "hardware": {"gpu": "cpu"},
        },
    )


@pytest.mark.parametrize(
    ("lora", "field"),
    [
        ({"rank": -1}, "lora.rank"),
        ({"rank": 4, "alpha": 0}, "lora.alpha"),
        ({"rank": 4, "dropout": 1.0}, "lora.dropout"),
        ({"rank": 4, "targets": "wq,q_proj"}, "lora.targets"),
        ({"rank": 4, "targets": ""}, "lora.targets"),
    ],
)
def test_lora_fields_are_checked(lora, field):
    with pytest.raises(ConfigError) as e:
        LoraConfig(**lora)
    assert e.value.field == field


@pytest.mark.parametrize(
    ("model", "parallel", "field"),
    [
        ("tiny", {}, "lora.rank"),  # GPT-2: fused c_attn in HF, no PEFT names for q/k/v
        ("tiny-moe", {}, "lora.rank"),
        # 4 stages of 4 layers hold 0, 2, 2, 0: under a split backward the first stage, the
        # embedding alone, sends an activation without gradient; DualPipeV's rank 0 holds
        # stages 0 and 3, the embedding and the head: nothing to train
        ("tiny-llama", {"layers": 4, **ZB}, "parallel.pp_schedule"),
        ("tiny-llama", {"layers": 4, "batch": 4, **DUALPIPEV}, "parallel.pp"),
    ],
)
def test_what_lora_does_not_run_yet_is_refused_naming_the_field(tmp_path, model, parallel, field):
    job = _job(tmp_path, {"rank": 4}, model, **parallel)
    with pytest.raises(ConfigError) as e:
        job.layout(2 if parallel else 1)
    assert e.value.field == field


@pytest.mark.parametrize(
    "parallel",
    [
        {"tp": 2},
        {"tp": 2, "sp": True},
        {"pp": 2},
        {"layers": 4, "pp": 2, "pp_schedule": "interleaved", "pp_virtual": 2},  # stage 0: 0 layers
        {"dp": 2, "zero": 3},
    ],
)
def test_lora_layouts_are_legal(tmp_path, parallel):
    """The layouts `tests/distributed/test_lora_layouts.py` proves against one process."""
    assert _job(tmp_path, {"rank": 4}, **parallel).layout(2).world_size == 2


def test_only_the_adapters_train_and_hold_optimizer_states(tmp_path):
    run = build_run(_job(tmp_path, {"rank": 4, "targets": ALL}), data=False)
    trainable = {n for n, p in run.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 7 * run.job.model.num_layers
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    inputs, targets = global_batch(run.job.model.vocab_size)
    micro = [(inputs[k : k + 1], targets[k : k + 1]) for k in range(2)]
    out = train_step(run, iter(micro))
    for n, p in run.model.named_parameters():
        assert (p.grad is None) == (n not in trainable), n
    apply_update(run, out)
    assert {id(p) for p in run.optimizer.state} == {id(p) for p in run.params}
    for n, p in run.model.named_parameters():
        if n not in trainable:
            assert torch.equal(p, before[n]), n  # the base is frozen
        elif ".lora_B." in n:
            assert not torch.equal(p, before[n]), n  # B left zero


def test_a_fresh_adapter_leaves_the_base_model_unchanged():
    cfg = model_preset("tiny-llama")
    base = build_model(cfg, device="cpu", seed=3)
    adapted = apply_lora(build_model(cfg, device="meta"), LoraConfig(rank=4, targets=ALL))
    materialize(adapted, seed=3)
    assert isinstance(adapted.layers["0"].feed_forward.w3, LoRALinear)
    tokens = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(adapted(tokens), base(tokens), rtol=0, atol=0)


def _trained_lora_model(lora: LoraConfig):
    """A float64 tiny Llama with adapters whose B is not zero (as after training)."""
    cfg = model_preset(
        "tiny-llama", vocab_size=97, dim=32, ffn_dim=48, num_heads=4, rope_theta=500.0
    )
    model = apply_lora(build_model(cfg, device="meta"), lora)
    materialize(model, seed=5)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return cfg, model


def test_peft_loads_our_adapters_onto_the_transformers_llama_and_gives_our_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    lora = LoraConfig(rank=4, alpha=8.0, targets=ALL)
    with float64_default():
        cfg, model = _trained_lora_model(lora)
        export_hf(model, cfg, tmp_path / "base")  # the base weights (adapters not merged)
        export_peft_adapters(model, cfg, lora, tmp_path / "adapter")
        export_hf(model, cfg, tmp_path / "merged", lora_scale=lora.scale)
        tokens = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(0))
        model.eval()
        with torch.no_grad():
            ours = model(tokens)
            kw = {"dtype": torch.float64, "attn_implementation": "eager"}
            hf_base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", **kw)
            plain = hf_base(tokens).logits
            peft_model = peft.PeftModel.from_pretrained(hf_base.eval(), tmp_path / "adapter")
            with_adapters = peft_model.eval()(tokens).logits
            merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", **kw)
            merged_logits = merged.eval()(tokens).logits
    config = json.loads((tmp_path / "adapter" / ADAPTER_CONFIG).read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert set(config["target_modules"]) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    }  # fmt: skip
    assert (tmp_path / "adapter" / ADAPTER_WEIGHTS).is_file()
    assert (plain - ours).abs().max() > 0.1  # the adapters matter (measured 0.30)
    # transformers' LlamaRMSNorm and RoPE frequencies compute in float32 even in a float64
    # model: its logits (|logit| < 0.4) carry float32 rounding, 2^-24 x 0.4 x a few norms
    # ~ 1e-7 (measured 4.0e-8, the same with or without adapters); a wrong key, scale or
    # transpose moves them by ~0.1
    torch.testing.assert_close(with_adapters, ours, rtol=0, atol=1e-6)
    torch.testing.assert_close(merged_logits, ours, rtol=0, atol=1e-6)
    torch.testing.assert_close(merged_logits, with_adapters, rtol=0, atol=1e-12)


def test_peft_key_names_are_those_of_the_hf_llama_modules():
    from scaletrain.checkpoint.peft import peft_state_dict

    lora = LoraConfig(rank=2, targets="wq,w2")
    cfg, model = _trained_lora_model(lora)
    keys = set(peft_state_dict(model.state_dict(), cfg))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in keys
    assert len(keys) == 2 * 2 * cfg.num_layers


def test_row_parallel_projections_are_the_trainers_tp_plan():
    """`config.lora.ROW_PARALLEL` (what the planner splits by columns under tp, with A) is
    the trainer's block plan: wo and w2 row-parallel, every other projection column-parallel
    (w3 is added beside w1 as ColwiseParallel in apply_tp)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from scaletrain.config.lora import ROW_PARALLEL
    from scaletrain.parallel.tensor_parallel import _block_plan

    plan = _block_plan(sp=False)
    names = {k.rsplit(".", 1)[-1]: type(v) for k, v in plan.items()}
    assert {n for n, t in names.items() if t is RowwiseParallel} == set(ROW_PARALLEL)
    assert {n for n, t in names.items() if t is ColwiseParallel} == {"wq", "wk", "wv", "w1"}
