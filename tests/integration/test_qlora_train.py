"""`scaletrain train` with a quantized base (`lora.base_dtype` nf4 / int8) from a small
Hugging Face Llama and Qwen2: the loss falls, the adapters are exported in PEFT's format, and a
run resumed from its checkpoint continues the straight run bit for bit (the NF4 base is in
the checkpoint: a resume does not re-read init_from)."""

from __future__ import annotations

import json

import pytest

from scaletrain.config import load_config
from scaletrain.trainer import train

from .._hf_models import hf_args, make_hf_model

LORA = ("--lora.rank=8", "--lora.targets=wq,wk,wv,wo,w1,w2,w3", "--optim.lr=1e-2")


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    return {kind: make_hf_model(kind, tmp / kind) for kind in ("llama", "qwen2")}


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("base_dtype", ["nf4", "int8"])
def test_qlora_loss_falls_and_adapters_are_written(hf_dirs, tmp_path, kind, base_dtype):
    args = hf_args(
        tmp_path, hf_dirs[kind], "run", *LORA, f"--lora.base_dtype={base_dtype}", steps=8
    )
    r = train(load_config(None, args))
    assert sum(r.losses[-3:]) < sum(r.losses[:3]) - 0.1  # measured -0.46 (llama), -0.43 (qwen2)
    config = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 8 and len(config["target_modules"]) == 7


def test_qlora_resume_continues_the_straight_run(hf_dirs, tmp_path):
    extra = (*LORA, "--lora.base_dtype=nf4", "--checkpoint.every=3")
    straight = train(load_config(None, hf_args(tmp_path, hf_dirs["llama"], "a", *extra, steps=6)))
    args = hf_args(tmp_path, hf_dirs["llama"], "b", *extra, steps=6)
    first = train(load_config(None, args), max_steps=3).losses
    rest = train(load_config(None, args)).losses
    assert first + rest == straight.losses
