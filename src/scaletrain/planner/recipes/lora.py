"""LoRA / QLoRA under a framework recipe (`Recipe.lora`): one rank's model states, FSDP2 units
in flight and activations when a frozen base carries trainable adapters. Torch-free.

The sizes per block (adapters, frozen projections at rest and as FSDP2 gathers them, the
dequantization temporaries) are `memory.lora.lora_terms`'s; what changes against the default
recipe is the dtype of everything and what the framework's modules save:
- at rest: the frozen projections in `lora.base_dtype` ('auto' and 'bf16': the recipe's
  `weight_bytes`; 'nf4': torchao's NF4Tensor, `memory.lora.stored_bytes_per_value`), every other
  frozen parameter (embedding, norms, head) and the adapters at `weight_bytes`, sharded over the
  FSDP2 group at ZeRO-3 (torchtune's `training.shard_model`: fully_shard on every decoder layer,
  then on the root);
- gradients: the adapters only, at `grad_bytes` (/ shards from ZeRO-2);
- a master copy (`Recipe.master_bytes`, DeepSpeed's fp32 partitions): the adapters only,
  sharded as the recipe shards its master (ZeRO-3, or ZeRO-1 with `Recipe.shards_master`);
- optimizer states: the adapters only, `memory.states.optimizer_bytes` scaled to
  `Recipe.optimizer_state_bytes` when the recipe keeps them in the parameter dtype (/ shards
  from ZeRO-1);
- in flight at ZeRO-3: (1 + `fsdp_prefetch_units`) layer units as gathered (the frozen
  projections in their gathered form, norms and adapters at `weight_bytes`) and the root
  (embedding, final norm, head: FSDP2 does not reshard the root after forward), one unit's
  unsharded adapter gradients and their reduce-scatter input; under DeepSpeed's per-module
  fetch (`Recipe.fsdp_prefetch_params`: stage3.py fetch_sub_module) instead the largest module
  as gathered (a frozen projection in its gathered form, or the embedding at `weight_bytes`)
  and the prefetch bucket of `fsdp_prefetch_params` values at the block's mean gathered bytes
  per value, and one block's adapter gradients (DeepSpeed reduces through its ipg bucket,
  `recipes.memory._recipe_buffers`: no reduce-scatter copy-in here);
- activations per block (ac none): `memory.lora.lora_layer_activation_bytes` with the residual
  stream's RMSNorm saving its fp32 upcast (r = 4: torchtune/modules/rms_norm.py RMSNorm.forward
  normalises x.float(); a frozen scale saves no normalized output), no autocast (the model runs
  in its own dtype), and, with `Recipe.sdpa_kv_expanded`, K and V saved at the query heads
  (torchtune/modules/attention.py MultiHeadAttention.forward expands them before SDPA); under
  ac 'full' the block's input (checkpoint_wrapper, NO_REENTRANT) and, while one block is
  recomputed, its whole set;
- a quantized base's dequantization temporaries (`memory.lora.dequantize_work_bytes` with the
  NF4 tensor's own dtype, the recipe's `weight_bytes`: torchao's NF4Tensor.get_original_weight
  computes in the dtype the weight was quantized from), one projection at a time Under
  compile (torchtune's training.compile_model compiles every TransformerSelfAttentionLayer,
  recipes/lora_finetune_*.py _setup_model; AutoModel compiles each decoder layer) Inductor
  fuses the dequantization and the partitioner recomputes it in the backward: one
  projection's weight in the compute dtype (`memory.lora.compiled_dequantize_bytes`).
DeepSpeed (PEFT under the HF Trainer, Recipe.sources['lora']): the same terms with the frozen
base partitioned by zero.Init at ZeRO-3, bf16 under bf16 (an 'auto' base is `weight_bytes`),
and the adapters' fp32 master partition (`Recipe.master_bytes`).
With adapter dropout (`PlanInput.lora_dropout` > 0) the block's saved set, and the recomputed
block's under ac 'full', also hold each dropout module's dropped copy and mask
(`memory.lora.lora_dropout_bytes`).
Ignores: pipeline and tensor parallelism (a LoRA recipe runs neither: recipes.memory
.lora_refusals), bitsandbytes' own NF4 layout and dequantization under a framework recipe (an 'nf4'
base is counted as torchao's NF4Tensor whatever `PlanInput.lora_quantizer` says).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from scaletrain.config.lora import tp_shapes

from ..memory.head import MicroBatchShape
from ..memory.lora import (
    compiled_dequantize_bytes,
    dequantize_work_bytes,
    first_block_saving,
    gathered_bytes_per_value,
    lora_layer_activation_bytes,
    lora_terms,
)
from ..memory.states import optimizer_bytes
from ..types import PlanInput
from .schema import Recipe

__all__ = ["RecipeLora", "recipe_lora", "recipe_optimizer_bytes"]

NORM_UPCAST_BYTES = 4
"""Bytes per element an eager RMSNorm over x.float() saves (its fp32 upcast)."""


def recipe_optimizer_bytes(plan: PlanInput, recipe: Recipe) -> float:
    """Optimizer-state bytes per trained parameter under `recipe`: `optimizer_bytes`, scaled
    to `Recipe.optimizer_state_bytes` per element for AdamW and SGD (whose states are
    zeros_like the parameter, torch/optim/adamw.py _init_group) when the recipe sets it."""
    ob = optimizer_bytes(plan.optimizer, plan.beta1)
    if recipe.optimizer_state_bytes and plan.optimizer in ("adamw", "sgd"):
        return ob * recipe.optimizer_state_bytes / 4.0
    return ob


@dataclass(frozen=True, slots=True)
class RecipeLora:
    """One rank's LoRA terms under a recipe (bytes; `recipe_lora`)."""

    weights: float
    master: float
    """The adapters' master copy (`Recipe.master_bytes`; 0 for a recipe without one)."""
    grads: float
    optimizer: float
    in_params: float
    in_grads: float
    reduce_scatter: float
    activations: float
    """Every block's saved activations of one micro-batch."""
    recompute: float
    """One block's ac-none set while it is recomputed (ac 'full'), else 0."""
    dequantize: float
    """The largest projection's dequantization temporaries (0 for an unquantized base)."""
    adapters: float
    """Trainable parameters on the rank (before sharding)."""


def recipe_lora(plan: PlanInput, recipe: Recipe, params: float, root: float) -> RecipeLora:
    """The LoRA terms of a single-stage rank holding `params` base parameters (`root` of them
    the embedding, final norm and head) under `recipe` (module docstring)."""
    assert plan.lora is not None
    rank, targets, base = plan.lora
    m, L = plan.model, plan.layout
    layers = m.num_layers
    fp32 = plan.precision == "fp32"
    wb = 4.0 if fp32 else recipe.weight_bytes
    gb = 4.0 if fp32 else recipe.grad_bytes
    lt = lora_terms(m, rank, targets, base, plan.precision, tp=1)
    # an unquantized base is the model's own dtype under this recipe
    plain = base in ("auto", "bf16")
    base_bytes = (wb if base == "auto" else 2.0) if plain else 0.0
    stored = base_bytes * lt.frozen if plain else lt.stored
    gathered = base_bytes * lt.frozen if plain else lt.gathered
    adapters = layers * lt.adapters
    other = params - layers * lt.frozen  # embedding, norms, head (frozen)
    N, z = L.zero_shards, L.zero
    weights = (wb * other + layers * stored + wb * adapters) / (N if z >= 3 else 1)
    grads = gb * adapters / (N if z >= 2 else 1)
    mb_master = 0.0 if fp32 else recipe.master_bytes
    master = mb_master * adapters / (N if z >= 3 or (z >= 1 and recipe.shards_master) else 1)
    optim = recipe_optimizer_bytes(plan, recipe) * adapters / (N if z >= 1 else 1)
    in_params = in_grads = rs = 0.0
    if z >= 3 and N > 1 and recipe.fsdp_prefetch_params:
        # DeepSpeed ZeRO-3: one module gathered at a time plus the prefetch bucket (module
        # docstring); the gathered base is what zero.Init partitioned (the frozen weights in
        # their stored form), the embedding in the parameter dtype
        big = max(
            max(
                float(r) * c * gathered_bytes_per_value(base, r, c, plan.precision)
                for r, c in (sh.weight for sh in tp_shapes(m, rank, 1).values())
            ),
            wb * m.param_counts().embedding,
        )
        per_value = base_bytes if plain else lt.gathered / lt.frozen
        in_params = big + per_value * recipe.fsdp_prefetch_params
        in_grads = gb * lt.adapters
    elif z >= 3 and N > 1:
        norms = (params - root) / layers - lt.frozen if layers else 0.0
        unit = gathered + wb * (norms + lt.adapters)
        in_params = unit * (1 + recipe.fsdp_prefetch_units) + wb * root
        in_grads = gb * lt.adapters
        rs = gb * lt.adapters  # the reduce-scatter input, in the parameter dtype
    mb = MicroBatchShape.of(plan)
    am = dataclasses.replace(m, num_kv_heads=m.num_heads) if recipe.sdpa_kv_expanded else m
    none_layer = lora_layer_activation_bytes(
        am,
        lt,
        mb,
        r=NORM_UPCAST_BYTES,
        autocast=False,
        dropout=plan.lora_dropout,
        fused_qkv=plan.lora_fused_qkv,
    )
    e = plan.compute_bytes
    if plan.ac == "full":
        acts = layers * e * mb.tokens * m.dim
        recompute = none_layer
    else:
        acts = layers * none_layer - first_block_saving(m, tokens=mb.tokens, r=NORM_UPCAST_BYTES)
        recompute = 0.0
    work = 0.0
    if not plain:
        # eager: torchao's get_original_weight's temporaries; under compile (the recipe's
        # framework compiles the blocks that hold the projections) the fused kernel's output
        work = max(
            compiled_dequantize_bytes(base, *sh.weight, plan.precision)
            if plan.compile
            else dequantize_work_bytes(base, *sh.weight, plan.precision, wb)
            for sh in tp_shapes(m, rank, 1).values()
        )
    return RecipeLora(
        weights=weights,
        master=master,
        grads=grads,
        optimizer=optim,
        in_params=in_params,
        in_grads=in_grads,
        reduce_scatter=rs,
        activations=acts,
        recompute=recompute,
        dequantize=work,
        adapters=adapters,
    )
