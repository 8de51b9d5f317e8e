"""Meta-device materialization with a rank-independent, device-independent initialization.

Every parameter is drawn on the CPU from its own generator, seeded by (seed, parameter name).
The name is the fully qualified name with wrapper prefixes removed, so a pipeline stage that
holds layers "4".."7", a tensor- or FSDP-sharded copy, and the single-device model all get
exactly the same values for the same parameter. Sharded (DTensor) parameters draw the full
tensor and keep their local shard: O(full size) work per rank, the price of bit-identical
weights whatever the world size.

Init (GPT-2, Radford et al. 2019, sec. 2.3; as in nanoGPT): normal(0, init_std) for linear,
embedding, router and expert weights; residual output projections (attention `wo`, MLP `w2`,
expert `w2`) get std / sqrt(2 L) so the residual stream's variance does not grow with depth;
biases zero; norm weights one (a (1 + w) RMSNorm's w zero). LoRA adapters (`models.lora`): A
as PEFT's (uniform in +-1/sqrt(fan_in)), B zero. A frozen projection stored quantized
(`models.quantized`) draws its whole float weight the same way, quantizes it whole and keeps
its rows (`store_full_weight`).
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn

from scaletrain.dtensor import is_dtensor

from .attention import RotaryEmbedding
from .moe import MoE
from .quantized import FrozenLinear, is_quantized_storage

__all__ = ["materialize", "init_weights", "clean_fqn", "copy_full_into", "store_full_weight"]

# Prefixes that wrappers insert into parameter names: activation checkpointing
# (checkpoint_wrapper), torch.compile, FSDP1. Stripped so names match the bare model's.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
_RESIDUAL_OUTPUTS = (
    "attention.wo.weight",
    "feed_forward.w2.weight",
    "moe.experts.w2",
    "moe.shared_experts.w2",
)


def clean_fqn(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _find_config(model: nn.Module):
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "init_std"):
            return cfg
    raise ValueError("materialize: no module with a ModelConfig `config` attribute found")


def _full_value(
    fqn: str, module: nn.Module, shape: torch.Size, *, std: float, num_layers: int, seed: int
) -> torch.Tensor:
    """The full (unsharded) fp32 initial value of one parameter, drawn on the CPU."""
    leaf = fqn.rsplit(".", 1)[-1]
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or type(module).__name__ == "RMSNorm":
        one = leaf == "weight" and not getattr(module, "plus_one", False)  # Gemma's 1 + w
        return torch.ones(shape) if one else torch.zeros(shape)
    if leaf == "bias" or leaf in ("b1", "b2", "b3") or ".lora_B." in fqn:
        return torch.zeros(shape)  # (LoRA's B: the adapted model starts as the base)
    if fqn.endswith(_RESIDUAL_OUTPUTS):
        std = std / math.sqrt(2 * num_layers)
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(fqn.encode())) % 2**62)
    if ".lora_A." in fqn:  # PEFT's: kaiming_uniform_(a=sqrt(5)), i.e. U(+-1/sqrt(fan_in))
        bound = 1.0 / math.sqrt(shape[1])
        return torch.empty(shape).uniform_(-bound, bound, generator=gen)
    return torch.empty(shape).normal_(0.0, std, generator=gen)


@torch.no_grad()
def init_weights(model: nn.Module, *, seed: int = 0) -> None:
    """Initialize every parameter in place (see module docstring); buffers are not touched."""
    cfg = _find_config(model)
    for mod_name, module in model.named_modules():
        stored = _stored_names(module)
        if stored:  # a quantized frozen weight: drawn whole as a float weight, then stored
            fqn = clean_fqn(f"{mod_name}.weight")
            full = _full_value(
                fqn, module, module.weight.shape, std=cfg.init_std, num_layers=cfg.num_layers,
                seed=seed,
            )  # fmt: skip
            store_full_weight(module, full)
        for p_name, param in module.named_parameters(recurse=False):
            if p_name in stored:
                continue
            fqn = clean_fqn(f"{mod_name}.{p_name}" if mod_name else p_name)
            if fqn == "output.weight" and cfg.tie_embeddings:
                fqn = "tok_embeddings.weight"  # a pipeline's head copy of the tied embedding
            full = _full_value(
                fqn, module, param.shape, std=cfg.init_std, num_layers=cfg.num_layers, seed=seed
            )
            copy_full_into(param, full)


def _stored_names(module: nn.Module) -> tuple[str, ...]:
    """The parameters holding a quantized frozen weight (none for other modules)."""
    if isinstance(module, FrozenLinear) and module.quantized:
        return module.storage_names()
    return ()


@torch.no_grad()
def store_full_weight(module: FrozenLinear, full: torch.Tensor) -> None:
    """Quantize the whole float weight `full` into `module`'s stored form (on the device its
    parameters live on) and copy each piece into its parameter, keeping this rank's rows
    when sharded: the same stored values in one process as over any number of shards."""
    device = to_local_device(module.weight)
    for name, value in module.stored_pieces(full.to(device)).items():
        copy_full_into(getattr(module, name), value)


def to_local_device(t: torch.Tensor) -> torch.device:
    return t.to_local().device if is_dtensor(t) else t.device


@torch.no_grad()
def copy_full_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the whole value `full` into `param`, or this rank's shard of it when `param` is a
    DTensor. An NF4 value (a tensor subclass) is split along rows as FSDP2 splits it
    (`torch.chunk`, which NF4Tensor implements on its codes and scales; `config.lora`
    checked that the rows and blocks split evenly) and copied as it is: a dtype
    conversion would dequantize it."""
    if is_quantized_storage(full):
        if is_dtensor(param):
            mesh = param.device_mesh
            assert mesh.ndim == 1, "NF4 shards over a 1-D mesh (config.lora)"
            full = torch.chunk(full, mesh.size(), dim=0)[mesh.get_local_rank()]
            param = param.to_local()
        param.copy_(full)
        return
    if is_dtensor(param):
        # A DTensor (FSDP2 / tensor parallel): keep this rank's shard of the full value. The
        # import is local on purpose: the model package stays free of torch.distributed, and
        # this branch only runs when a caller already sharded the model.
        from torch.distributed.tensor import distribute_tensor

        local = param.to_local()
        shard = distribute_tensor(
            full.to(device=local.device, dtype=local.dtype),
            param.device_mesh,
            param.placements,
            src_data_rank=None,
        )
        local.copy_(shard.to_local())
    else:
        param.copy_(full.to(device=param.device, dtype=param.dtype))


def materialize(
    model: nn.Module, *, device: str | torch.device = "cpu", seed: int = 0, init: bool = True
) -> None:
    """Allocate a meta-built (possibly parallelized) model on `device` and initialize it.

    `to_empty` + `init_weights(seed)` + recomputation of the buffers (RoPE tables; the
    DeepSeek router's balancing bias, zero), in place. Same weights for the same seed
    whatever the device or world size.
    `init=False` leaves the weights undrawn (the dry-run: fake tensors hold no values, and
    drawing them was most of a large model's build time there); memory is the same.
    """
    model.to_empty(device=device)
    for m in model.modules():
        if isinstance(m, FrozenLinear):
            m.allocate_shared(device)
    if init:
        init_weights(model, seed=seed)
    for m in model.modules():
        if isinstance(m, RotaryEmbedding):
            m.reset_tables()
        if isinstance(m, MoE):
            m.aux_loss = None
        reset = getattr(m, "reset_state", None)
        if reset is not None:  # DeepSeekMoE: its bias starts at zero
            reset()
