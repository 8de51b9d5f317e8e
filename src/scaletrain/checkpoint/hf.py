"""Hugging Face export/import: `model.safetensors` + `config.json`, safetensors only.

Families (by `ModelConfig.family`):
- Llama (`LlamaForCausalLM`): names map one to one; our RoPE uses HF's `rotate_half` layout,
  so q/k weights need no permutation. Mistral, Qwen2 (plus q/k/v biases) and Qwen3 (plus
  `self_attn.q_norm` / `k_norm`) the same.
- Phi-3 (`Phi3ForCausalLM`): Llama's block with q, k, v fused in `self_attn.qkv_proj` (rows
  q | k | v) and gate, up in `mlp.gate_up_proj` (rows gate | up): split into wq/wk/wv and
  w1/w3 on import, concatenated on export (`_fused_map`).
- GPT-2 (`GPT2LMHeadModel`): HF's `Conv1D` stores weights as (in, out), the transpose of
  nn.Linear's (out, in); q, k, v are one fused `c_attn` (columns ordered q | k | v).
- DeepSeek-V2 / V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`): Multi-head Latent
  Attention, dense first blocks, routed + shared experts; `hf_deepseek.py` maps them (the
  RoPE rows of the checkpoint are interleaved pairs, ours halves).
- Mixtral (`MixtralForCausalLM`, Llama family with `num_experts > 0`): written in the layout of
  the published Mixtral checkpoints, `block_sparse_moe.gate` + `block_sparse_moe.experts.{e}.
  w1/w2/w3` (transformers 4.x reads it as is, 5.x converts it on load); read back from that
  layout or from transformers 5's fused `mlp.experts.gate_up_proj` / `down_proj`.
- Qwen3-MoE and Gemma 2: their names and config.json in `checkpoint.hf_families`.

Sharded models (FSDP2 / TP DTensors) are gathered with `full_tensor()`; call on every rank and
write from one (the gather is a collective).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn

from scaletrain.config import ModelConfig
from scaletrain.config.hf_model import hf_model_type
from scaletrain.config.user_files import read_user_file
from scaletrain.dtensor import is_dtensor, to_full
from scaletrain.models.lora import merge_adapters
from scaletrain.models.quantized import FrozenLinear

from .hf_families import expert_names, family_config, norm_names, router_name

__all__ = [
    "export_hf",
    "gathered_state_dict",
    "load_hf_state_dict",
    "to_hf_state_dict",
    "from_hf_state_dict",
    "hf_config",
]


def _check_exportable(cfg: ModelConfig) -> None:
    from scaletrain.config.hf_model import hf_export_problem

    if (why := hf_export_problem(cfg)) is not None:
        raise ValueError(f"HF export: {why}")


def hf_config(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> dict:
    """The `config.json` content for `cfg` (dropout off: these are pretraining weights)."""
    _check_exportable(cfg)
    dtype_name = str(dtype).removeprefix("torch.")
    kind = hf_model_type(cfg)
    if kind in ("deepseek_v2", "deepseek_v3"):
        from .hf_deepseek import deepseek_hf_config

        return deepseek_hf_config(cfg, dtype_name)
    if kind != "gpt2":
        # the keys Llama, Mistral and Mixtral share; each adds its own below
        out = {
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.dim,
            "intermediate_size": cfg.ffn_dim,
            "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_seq_len,
            "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta,
            "hidden_act": "silu",
            "tie_word_embeddings": cfg.tie_embeddings,
            "attention_dropout": 0.0,
            "initializer_range": cfg.init_std,
            "torch_dtype": dtype_name,
        }
        if (family := family_config(cfg, kind, out)) is not None:
            return family
        if kind in ("qwen2", "qwen3"):
            # one window for every layer (or none): the layers from max_window_layers on slide
            window = cfg.sliding_window
            arch = "Qwen2ForCausalLM" if kind == "qwen2" else "Qwen3ForCausalLM"
            return {
                "architectures": [arch],
                "model_type": kind,
                **out,
                **({"attention_bias": False} if kind == "qwen3" else {}),
                "use_sliding_window": bool(window),
                "sliding_window": window or None,
                "max_window_layers": 0 if window else cfg.num_layers,
                "layer_types": [("sliding" if window else "full") + "_attention"] * cfg.num_layers,
            }
        if kind == "phi3":
            last = cfg.vocab_size - 1  # Phi-3's special ids, clipped into small vocabularies
            return {
                "architectures": ["Phi3ForCausalLM"],
                "model_type": "phi3",
                **out,
                "resid_pdrop": 0.0,
                "embd_pdrop": 0.0,
                "original_max_position_embeddings": cfg.max_seq_len,
                "sliding_window": cfg.sliding_window or None,
                "bos_token_id": min(1, last),
                "eos_token_id": min(32000, last),
                "pad_token_id": min(32000, last),
            }
        if kind == "mixtral":
            return {
                "architectures": ["MixtralForCausalLM"],
                "model_type": "mixtral",
                **out,
                "num_local_experts": cfg.num_experts,
                "num_experts_per_tok": cfg.experts_per_token,
                "router_aux_loss_coef": cfg.moe_aux_loss_coef,
                "router_jitter_noise": 0.0,
                "sliding_window": cfg.sliding_window or None,
            }
        if kind == "mistral":
            return {
                "architectures": ["MistralForCausalLM"],
                "model_type": "mistral",
                **out,
                "sliding_window": cfg.sliding_window or None,
            }
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **out,
            "attention_bias": cfg.bias,
            "mlp_bias": cfg.bias,
        }
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_seq_len,
        "n_embd": cfg.dim,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_inner": cfg.ffn_dim,
        # HF's names: "gelu_new" is the tanh approximation (our "gelu"), "gelu" the erf form
        "activation_function": "gelu" if cfg.activation == "gelu_exact" else "gelu_new",
        "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        # GPT-2's end-of-text id, clipped into small vocabularies so HF's validation passes.
        "bos_token_id": min(50256, cfg.vocab_size - 1),
        "eos_token_id": min(50256, cfg.vocab_size - 1),
        "torch_dtype": dtype_name,
    }


def _full_state_dict(
    model: nn.Module, keep: Callable[[str], bool] | None = None
) -> dict[str, torch.Tensor]:
    """Every tensor of the state dict whole (DTensor shards gathered; collective), or those
    whose name `keep` accepts (the same names on every rank). A frozen projection stored
    quantized (`lora.base_dtype`) is written as its dequantized float weight (its int8 scales
    dropped): what the HF model and PEFT's base load."""
    stored = {
        name: m for name, m in model.named_modules() if isinstance(m, FrozenLinear) and m.quantized
    }
    out = {}
    for k, v in model.state_dict().items():
        if keep is not None and not keep(k):
            continue
        owner, _, leaf = k.rpartition(".")
        module = stored.get(owner)
        if module is not None and leaf in module.storage_names():
            if leaf == "weight":
                out[k.replace("_orig_mod.", "")] = _dequantized_full(module)
            continue
        v = to_full(v)  # a DTensor's shards gathered
        out[k.replace("_orig_mod.", "")] = v.detach()
    return out


def gathered_state_dict(
    model: nn.Module,
    *,
    pp_group: dist.ProcessGroup | None = None,
    keep: Callable[[str], bool] | None = None,
) -> dict[str, torch.Tensor]:
    """`_full_state_dict` of `model` (the tensors `keep` accepts) and, with `pp_group` (a
    pipeline run: `model` = this rank's stages in a ModuleDict "stage<i>"), every stage's
    tensors exchanged over the pipeline group under the single-model names (on the CPU).
    Collective: call on every rank."""
    state = _full_state_dict(model, keep)
    if pp_group is None:
        return state
    state = {re.sub(r"^stage\d+\.", "", k): v.cpu() for k, v in state.items()}
    parts: list[dict[str, torch.Tensor] | None] = [None] * dist.get_world_size(pp_group)
    dist.all_gather_object(parts, state, group=pp_group)
    return {k: v for part in parts for k, v in (part or {}).items()}


def _dequantized_full(module: FrozenLinear) -> torch.Tensor:
    """The whole float weight of a quantized projection: each rank dequantizes its rows, then
    the rows are gathered (collective under FSDP2)."""
    local = module.dequantized()
    weight = module.weight
    if not is_dtensor(weight):
        return local.detach()
    from torch.distributed.tensor import DTensor

    sharded = DTensor.from_local(
        local, weight.device_mesh, weight.placements, shape=weight.shape, stride=local.stride()
    )
    return sharded.full_tensor().detach()


def _is_phi3(cfg: ModelConfig) -> bool:
    return cfg.hf_model_type == "phi3"


def _layer_map(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(our name, HF name) pairs inside block i, for the Llama family (one-to-one); Phi-3's
    fused tensors are in `_fused_map`, experts in `_experts_from_hf` / `expert_names`."""
    kind = hf_model_type(cfg)
    pairs = [(f"{ours}.weight", f"{hf}.weight") for ours, hf in norm_names(kind)]
    if cfg.qk_norm:
        pairs += [("attention.q_norm.weight", "self_attn.q_norm.weight")]
        pairs += [("attention.k_norm.weight", "self_attn.k_norm.weight")]
    attn = (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj"))
    for ours, hf in attn[3:] if _is_phi3(cfg) else attn:
        pairs.append((f"attention.{ours}.weight", f"self_attn.{hf}.weight"))
        if cfg.bias or (cfg.qkv_bias and ours != "wo"):
            pairs.append((f"attention.{ours}.bias", f"self_attn.{hf}.bias"))
    if cfg.is_moe:
        return pairs + [("moe.router.weight", router_name(kind))]
    mlp = (("w2", "down_proj"),) if _is_phi3(cfg) else (("w1", "gate_proj"), ("w3", "up_proj"))
    for ours, hf in mlp + (() if _is_phi3(cfg) else (("w2", "down_proj"),)):
        pairs.append((f"feed_forward.{ours}.weight", f"mlp.{hf}.weight"))
        if cfg.bias:
            pairs.append((f"feed_forward.{ours}.bias", f"mlp.{hf}.bias"))
    return pairs


def _fused_map(cfg: ModelConfig) -> list[tuple[str, str, int, int]]:
    """(our name, HF fused name, its first row there, its rows) inside block i, in row order:
    Phi-3's `qkv_proj` (q | k | v rows) and `gate_up_proj` (gate | up); empty for the others."""
    if not _is_phi3(cfg):
        return []
    q, kv, f = cfg.q_dim, cfg.kv_dim, cfg.ffn_dim
    qkv, gate_up = "self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"
    return [
        ("attention.wq.weight", qkv, 0, q),
        ("attention.wk.weight", qkv, q, kv),
        ("attention.wv.weight", qkv, q + kv, kv),
        ("feed_forward.w1.weight", gate_up, 0, f),
        ("feed_forward.w3.weight", gate_up, f, f),
    ]


def to_hf_state_dict(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our (full, clean) state dict -> HF parameter names and layouts."""
    _check_exportable(cfg)
    out: dict[str, torch.Tensor] = {}
    if cfg.family == "llama":
        out["model.embed_tokens.weight"] = sd["tok_embeddings.weight"]
        out["model.norm.weight"] = sd["norm.weight"]
        if not cfg.tie_embeddings:
            out["lm_head.weight"] = sd["output.weight"]
        if cfg.is_mla:  # DeepSeek-V2 / V3
            from .hf_deepseek import deepseek_to_hf

            return out | deepseek_to_hf(sd, cfg)
        for i in range(cfg.num_layers):
            for ours, hf in _layer_map(cfg):
                out[f"model.layers.{i}.{hf}"] = sd[f"layers.{i}.{ours}"]
            fused: dict[str, list[torch.Tensor]] = {}
            for ours, hf, _, _ in _fused_map(cfg):  # in row order
                fused.setdefault(hf, []).append(sd[f"layers.{i}.{ours}"])
            for hf, parts in fused.items():
                out[f"model.layers.{i}.{hf}"] = torch.cat(parts)
            kind = hf_model_type(cfg)
            for e in range(cfg.num_experts):  # stacked (E, ., .) -> one Linear per expert
                for w, name in expert_names(kind, e).items():
                    out[f"model.layers.{i}.{name}"] = sd[f"layers.{i}.moe.experts.{w}"][e]
        return out
    t = "transformer."
    out[t + "wte.weight"] = sd["tok_embeddings.weight"]
    out[t + "wpe.weight"] = sd["pos_embeddings.weight"]
    out[t + "ln_f.weight"], out[t + "ln_f.bias"] = sd["norm.weight"], sd["norm.bias"]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["output.weight"]
    for i in range(cfg.num_layers):
        p, h = f"layers.{i}.", f"{t}h.{i}."
        for ours, hf in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
            out[h + hf + ".weight"], out[h + hf + ".bias"] = (
                sd[p + ours + ".weight"],
                sd[p + ours + ".bias"],
            )
        qkv_w = torch.cat([sd[p + f"attention.{n}.weight"] for n in ("wq", "wk", "wv")])
        out[h + "attn.c_attn.weight"] = qkv_w.t()  # Conv1D: (h, 3h)
        out[h + "attn.c_attn.bias"] = torch.cat(
            [sd[p + f"attention.{n}.bias"] for n in ("wq", "wk", "wv")]
        )
        for ours, hf in (
            ("attention.wo", "attn.c_proj"),
            ("feed_forward.w1", "mlp.c_fc"),
            ("feed_forward.w2", "mlp.c_proj"),
        ):
            out[h + hf + ".weight"] = sd[p + ours + ".weight"].t()
            out[h + hf + ".bias"] = sd[p + ours + ".bias"]
    return out


def from_hf_state_dict(
    hf: dict[str, torch.Tensor], cfg: ModelConfig, *, rope_interleave: bool = True
) -> dict[str, torch.Tensor]:
    """HF names and layouts -> ours. Accepts GPT-2 files saved with or without `transformer.`.
    rope_interleave: a DeepSeek checkpoint's RoPE rows are interleaved pairs (its
    config.json's `rope_interleave`, `hf_deepseek.rope_interleaved`)."""
    _check_exportable(cfg)
    sd: dict[str, torch.Tensor] = {}
    if cfg.family == "llama":
        sd["tok_embeddings.weight"] = hf["model.embed_tokens.weight"]
        sd["norm.weight"] = hf["model.norm.weight"]
        if not cfg.tie_embeddings:
            sd["output.weight"] = hf.get("lm_head.weight", hf["model.embed_tokens.weight"])
        if cfg.is_mla:  # DeepSeek-V2 / V3
            from .hf_deepseek import deepseek_from_hf

            return sd | deepseek_from_hf(hf, cfg, interleaved=rope_interleave)
        for i in range(cfg.num_layers):
            for ours, name in _layer_map(cfg):
                if cfg.is_moe and name.startswith("block_sparse_moe.gate"):  # (transformers 5)
                    name = name if f"model.layers.{i}.{name}" in hf else "mlp.gate.weight"
                sd[f"layers.{i}.{ours}"] = hf[f"model.layers.{i}.{name}"]
            for ours, name, first, rows in _fused_map(cfg):
                sd[f"layers.{i}.{ours}"] = hf[f"model.layers.{i}.{name}"][first : first + rows]
            if cfg.is_moe:
                sd.update(_experts_from_hf(hf, cfg, i))
        return sd
    hf = {k.removeprefix("transformer."): v for k, v in hf.items()}
    sd["tok_embeddings.weight"] = hf["wte.weight"]
    sd["pos_embeddings.weight"] = hf["wpe.weight"]
    sd["norm.weight"], sd["norm.bias"] = hf["ln_f.weight"], hf["ln_f.bias"]
    if not cfg.tie_embeddings:
        sd["output.weight"] = hf.get("lm_head.weight", hf["wte.weight"])
    dim = cfg.dim
    for i in range(cfg.num_layers):
        p, h = f"layers.{i}.", f"h.{i}."
        for ours, name in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
            sd[p + ours + ".weight"], sd[p + ours + ".bias"] = (
                hf[h + name + ".weight"],
                hf[h + name + ".bias"],
            )
        qkv_w = hf[h + "attn.c_attn.weight"].t()  # (3h, h)
        qkv_b = hf[h + "attn.c_attn.bias"]
        for j, n in enumerate(("wq", "wk", "wv")):
            sd[p + f"attention.{n}.weight"] = qkv_w[j * dim : (j + 1) * dim]
            sd[p + f"attention.{n}.bias"] = qkv_b[j * dim : (j + 1) * dim]
        for ours, name in (
            ("attention.wo", "attn.c_proj"),
            ("feed_forward.w1", "mlp.c_fc"),
            ("feed_forward.w2", "mlp.c_proj"),
        ):
            sd[p + ours + ".weight"] = hf[h + name + ".weight"].t()
            sd[p + ours + ".bias"] = hf[h + name + ".bias"]
    return sd


def _experts_from_hf(
    hf: dict[str, torch.Tensor], cfg: ModelConfig, i: int
) -> dict[str, torch.Tensor]:
    pre, ours = f"model.layers.{i}.", f"layers.{i}.moe.experts."
    fused = hf.get(pre + "mlp.experts.gate_up_proj")
    if fused is not None:  # transformers 5: (E, 2f, h) = gate rows then up rows; (E, h, f)
        f = cfg.ffn_dim
        return {
            ours + "w1": fused[:, :f],
            ours + "w3": fused[:, f:],
            ours + "w2": hf[pre + "mlp.experts.down_proj"],
        }
    names = [expert_names(hf_model_type(cfg), e) for e in range(cfg.num_experts)]
    return {ours + w: torch.stack([hf[pre + n[w]] for n in names]) for w in ("w1", "w2", "w3")}


def export_hf(
    model: nn.Module,
    cfg: ModelConfig,
    out_dir: str | Path,
    *,
    dtype: torch.dtype | None = None,
    pp_group: dist.ProcessGroup | None = None,
    lora_scale: float | None = None,
) -> Path:
    """Write `model.safetensors` (HF names) and `config.json` to out_dir; returns out_dir.

    Collective when distributed: every rank gathers its DTensor shards; with `pp_group` (a
    pipeline run, `model` = this rank's stages in a ModuleDict "stage<i>") the stages' weights
    are exchanged over the pipeline group, and a tied model's head copy on the last stage is
    dropped (it equals the embedding). Only global rank 0 writes.
    dtype: cast the weights (default: keep the model's dtype). lora_scale: the model has LoRA
    adapters (`models.lora`), merged into the base weights with this scale (alpha / rank).
    """
    out = Path(out_dir)
    state = gathered_state_dict(model, pp_group=pp_group)
    if pp_group is not None and cfg.tie_embeddings:
        state.pop("output.weight", None)
    if dist.is_initialized() and dist.get_rank() != 0:
        return out
    if lora_scale is not None:
        state = merge_adapters(state, lora_scale)
    out.mkdir(parents=True, exist_ok=True)
    tensors = to_hf_state_dict(state, cfg)
    # safetensors wants contiguous, unshared CPU tensors (views of c_attn slices, .t()).
    tensors = {
        k: (v.to(dtype) if dtype else v).cpu().contiguous().clone() for k, v in tensors.items()
    }
    used = next(iter(tensors.values())).dtype
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(cfg, used), indent=2) + "\n")
    return out


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if path.is_file():
        return load_file(str(path))
    index = path / "model.safetensors.index.json"
    if index.exists():  # sharded HF checkpoint: weight_map name -> shard file
        raw = read_user_file(index, "model.name", what="a model.safetensors.index.json")
        files = sorted(set(json.loads(raw)["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(str(path / f)))
        return tensors
    single = path / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(
            f"{path}: no model.safetensors or model.safetensors.index.json "
            "(only safetensors are read, never pickle)"
        )
    return load_file(str(single))


@torch.no_grad()
def load_hf_state_dict(model: nn.Module, cfg: ModelConfig, path: str | Path) -> None:
    """Load HF safetensors weights (a file, or a directory, sharded or not) into `model`.

    The model must be materialized and unsharded (load before parallelizing, or load into a
    single-device copy); every parameter must be present (strict).
    """
    sd = from_hf_state_dict(
        _read_safetensors(Path(path)), cfg, rope_interleave=_rope_interleaved(Path(path))
    )
    own = model.state_dict()
    sd = {k: v.to(dtype=own[k].dtype) for k, v in sd.items() if k in own}
    model.load_state_dict(sd, strict=True)


def _rope_interleaved(path: Path) -> bool:
    """A DeepSeek checkpoint's RoPE layout, from the config.json beside its weights (True, the
    published layout, when there is none)."""
    from .hf_deepseek import rope_interleaved

    config = (path if path.is_dir() else path.parent) / "config.json"
    if not config.is_file():
        return True
    raw = read_user_file(config, "model.name", what="a Hugging Face config.json")
    hf = json.loads(raw)
    return rope_interleaved(hf) if isinstance(hf, dict) else True
