"""LoRA adapters in Hugging Face PEFT's format, and adapters merged into the HF export.

`export_peft_adapters` writes `adapter_config.json` and `adapter_model.safetensors` the way
PEFT's `save_pretrained` does for a `LlamaForCausalLM` (what `peft.PeftModel.from_pretrained`
reads): one `lora_A` / `lora_B` weight per adapted projection under PEFT's key names, e.g.
`base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight` (saved without the adapter
name "default"), and a config naming the HF modules (`q_proj`, ..., `down_proj`), `r`,
`lora_alpha` and `lora_dropout`. Our names map one to one (`hf._layer_map`: `wq` is
`q_proj`, `w1` `gate_proj`, `w3` `up_proj`, `w2` `down_proj`); the weights are nn.Linear's
(out, in) in both.

The merged HF export (`hf.export_hf(lora_scale=...)`) folds the adapters into the base
weights (`models.lora.merge_adapters`), as PEFT's `merge_and_unload`.

Collective when distributed (the adapters' shards and pipeline stages are gathered); global
rank 0 writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from scaletrain.config import ModelConfig
from scaletrain.config.lora import LoraConfig
from scaletrain.models.lora import is_adapter

from .hf import _layer_map, gathered_state_dict

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "adapter_config",
    "export_peft_adapters",
    "peft_state_dict",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _hf_modules(cfg: ModelConfig) -> dict[str, str]:
    """Our projection path in a block -> HF's ('attention.wq' -> 'self_attn.q_proj')."""
    return {
        ours.removesuffix(".weight"): hf.removesuffix(".weight")
        for ours, hf in _layer_map(cfg)
        if ours.endswith(".weight") and "norm" not in ours
    }


def peft_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The adapters of a full state dict under PEFT's key names."""
    modules = _hf_modules(cfg)
    out = {}
    for key, value in state.items():
        if not is_adapter(key):
            continue
        # layers.{i}.{module}.lora_{A|B}.weight
        _, layer, rest = key.split(".", 2)
        module, which = rest.rsplit(".lora_", 1)
        hf = f"base_model.model.model.layers.{layer}.{modules[module]}.lora_{which}"
        out[hf] = value
    return out


def adapter_config(cfg: ModelConfig, lora: LoraConfig) -> dict:
    """PEFT's LoraConfig for these adapters (`adapter_config.json`)."""
    modules = _hf_modules(cfg)
    by_name = {ours.rsplit(".", 1)[1]: hf.rsplit(".", 1)[1] for ours, hf in modules.items()}
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": sorted(by_name[t] for t in lora.target_names),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "inference_mode": True,
    }


def export_peft_adapters(
    model: nn.Module,
    cfg: ModelConfig,
    lora: LoraConfig,
    out_dir: str | Path,
    *,
    pp_group: dist.ProcessGroup | None = None,
) -> Path:
    """Write the model's adapters as PEFT does (see the module docstring); returns out_dir.
    Call on every rank (the gather is a collective); global rank 0 writes. `pp_group`: a
    pipeline run (`model` = this rank's stages), each stage's adapters gathered over it.
    Only the adapters are gathered (FSDP2 / TP shards, pipeline stages), not the base."""
    out = Path(out_dir)
    state = gathered_state_dict(model, pp_group=pp_group, keep=is_adapter)
    if dist.is_initialized() and dist.get_rank() != 0:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.cpu().contiguous().clone() for k, v in peft_state_dict(state, cfg).items()}
    save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    text = json.dumps(adapter_config(cfg, lora), indent=2) + "\n"
    (out / ADAPTER_CONFIG).write_text(text)
    return out
