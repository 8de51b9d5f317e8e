"""`scaletrain train` with `[lora]`: the loss falls, the run checkpoints, and the end of the run
writes the adapters in PEFT's format and the merged HF export."""

from __future__ import annotations

import json

from scaletrain.config import load_config
from scaletrain.trainer import train


def test_lora_run_learns_and_writes_its_adapters(tmp_path):
    job = load_config(
        None,
        [
            "--model.name=tiny-llama",
            "--batch.seq_len=32",
            "--batch.global_batch=4",
            "--batch.micro_batch=2",
            "--train.steps=12",
            "--train.eval_every=1000",
            "--train.sample_tokens=0",
            "--train.progress=false",
            "--train.tensorboard=false",
            "--data.num_tokens=20000",
            f"--data.cache_dir={tmp_path / 'cache'}",
            f"--train.run_dir={tmp_path / 'run'}",
            "--optim.warmup_steps=0",
            "--optim.lr=1e-2",
            "--lora.rank=8",
            "--lora.targets=wq,wk,wv,wo,w1,w2,w3",
            "--checkpoint.export_hf=true",
            "--guard.enabled=false",
        ],
    )
    r = train(job)
    assert sum(r.losses[-3:]) < sum(r.losses[:3])
    adapter = tmp_path / "run" / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8
    assert (adapter / "adapter_model.safetensors").is_file()
    assert (tmp_path / "run" / "hf" / "model.safetensors").is_file()
