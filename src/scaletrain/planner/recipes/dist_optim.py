"""The optimizer a NeMo run states (`PlanInput.dist_optimizer`, `grad_sync_dtype`,
`optimizer_dtype`, `fp8_params`: a published row's `layout` keys, a NeMo 1.x YAML's
`optim.name`, `optim.grad_sync_dtype`, `optim.dtype` and `fp8_params`, or NeMo 2.x's
grad_reduce_in_fp32) applied to the Megatron-Core recipes (`megatron.py`). Torch-free.

The recipe `nemo` counts Megatron-Core's DistributedOptimizer (zero 1): 16-bit weights, an fp32
gradient buffer over every parameter (4 B), fp32 master and Adam states sharded over dp x cp
(12 B / N). NeMo 1.x (NeMo-Framework-Launcher YAMLs and the DGX Cloud benchmarking recipes built
on them, containers up to 24.x) trains the same GPT model with the optimizer its YAML names.
Read at NVIDIA/NeMo v2.0.0 (e938df32; the exact NeMo commit of the 24.09 container was not
read), NVIDIA/apex 6424da3b and NVIDIA/Megatron-LM d98e8a6:

- `distributed_fused_adam` is Apex's DistributedFusedAdam through NeMo's
  MegatronDistributedFusedAdam (nemo/core/optim/distributed_adam.py: its process group is the
  data-parallel group with context parallelism, so N = dp x cp as for zero 1).
  NeMo's MegatronBaseModel.setup_optimization
  (nemo/collections/nlp/models/language_modeling/megatron_base_model.py) passes
  contiguous_grad_buffer (default True), dtype (optim.dtype, default fp32), param_sync_dtype =
  the model's dtype under megatron_amp_O2, and store_params / store_param_remainders: with
  fp8_params the master shard is stored (store_params), else with an fp32 optimizer over bf16
  weights only the low 16 bits of each fp32 master (store_param_remainders), else with the
  optimizer in the model's dtype none. Apex (apex/contrib/optimizers/distributed_fused_adam.py)
  then allocates, per rank:
  - DistributedFusedAdam._init_grad_buffer: one contiguous gradient buffer over every bucket of
    every parameter in grad_sync_dtype (which defaults to dtype in DistributedFusedAdam.__init__);
    MegatronDistributedFusedAdam.zero_grad points each parameter's main_grad at its view of it,
    where Transformer Engine's fused weight-gradient accumulation writes: `grad_bytes` =
    grad_sync_dtype's bytes on every parameter (2 under bf16, against Megatron-Core's 4);
  - StateBucket.__init__: exp_avg_shard and exp_avg_sq_shard in dtype, params_shard in dtype
    when store_params, param_remainders_shard in int16 when store_param_remainders, each of
    the bucket's shard size (1 / N of it): Adam states 2 x dtype bytes / N, master
    dtype bytes / N (fp8_params), 2 / N (remainders) or 0;
  - _start_bucket_grad_sync: the reduce-scatter's output, sync_grads_shard, is a new
    torch.empty of the bucket's shard in grad_sync_dtype (not a view of the buffer, without
    NCCL user buffers), which _finish_bucket_grad_sync keeps as grads_shard until zero_grad
    clears the buckets: grad_sync_dtype bytes / N from the last micro-batch's gradient sync
    through the step (`Recipe.grad_shard_step_bytes`, counted with the step).
  NeMo's MegatronGPTModel.configure_optimizers
  (nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py) marks the first
  stage's word embedding (and learned position embedding) _with_fp32_optimizer
  (with_fp32_embedding_grads, default True), which MegatronDistributedFusedAdam.init_params_bucket
  puts in buckets whose grad_sync_dtype is fp32 (`Recipe.fp32_embedding_grads`).
- `mcore_distributed_optim` is Megatron-Core's DistributedOptimizer, the recipe's own terms,
  except that NeMo's MegatronGPTModel.setup_mcore_distributed_parallel sets the DDP config's
  grad_reduce_in_fp32 = (optim.grad_sync_dtype == 'fp32'): a bf16 grad_sync_dtype makes the
  gradient buffer bf16 (2 B), and Megatron-Core's DistributedOptimizer
  ._copy_model_grads_to_main_grads (megatron/core/optimizer/distrib_optimizer.py) then gives each
  fp32 main shard shard_model_grad.float(), an fp32 copy of the rank's shard for the step
  (`Recipe.step_grad_fp32_copy`). The same grad_reduce_in_fp32 switch is Megatron-LM's
  (DistributedDataParallelConfig), so `grad_sync_dtype` applies to the `megatron` recipe too.
  NeMo 2.x trains with Megatron-Core's DistributedOptimizer (read at NVIDIA/NeMo v2.2.0,
  7192a2c9: nemo/collections/llm/recipes/optim/adam.py distributed_fused_adam_with_cosine_annealing
  sets use_distributed_optimizer=True, despite its name) and sets the same switch through its
  precision plugin: nemo/lightning/pytorch/plugins/mixed_precision.py MegatronMixedPrecision
  (grad_reduce_in_fp32) is copied onto the DDP config by nemo/lightning/pytorch/strategies/
  megatron_strategy.py MegatronStrategy (update_config_with_dtype_overrides); a run that turns
  it off states grad_sync_dtype 'bf16'.

The gradient reduction moves grad_sync_dtype's bytes (`Recipe.bucket_elem_bytes`, the time
model's dp reduce-scatter). Ignores: contiguous_param_buffer (the weights become views of one
buffer in param_sync_dtype, the same bytes; Apex notes the allocator may not reuse the original
parameters' blocks), the all-gather buckets Apex allocates per bucket without it (one bucket,
transient), fp8 weights' own bytes (the recipe's `weight_bytes`), Apex's bucket_cap_mb (the
time model keeps Megatron-Core's bucket count), the optimizer step's per-bucket temporaries
(pipeline_size 2 buckets), the fp32 embedding buckets' own gradient shard, and
contiguous_grad_buffer off (every YAML read sets it on; NeMo's default).
"""

from __future__ import annotations

from dataclasses import replace

from scaletrain.config import ConfigError
from scaletrain.config.choices import DistOptimizer, SyncDtype, literal_names

from ..types import PlanInput
from .registry import recipe_named
from .schema import DEFAULT_RECIPE, Recipe

__all__ = ["plan_recipe", "stated_optimizer"]

_MCORE = ("megatron", "nemo")
"""The recipes of Megatron-Core's GPT training (megatron.py)."""
_BYTES = {"fp32": 4.0, "bf16": 2.0}
_NEMO = "NVIDIA/NeMo v2.0.0 (e938df32) nemo/collections/nlp/models/language_modeling/"
_APEX = "NVIDIA/apex 6424da3b apex/contrib/optimizers/distributed_fused_adam.py"


def _check(plan: PlanInput, recipe: Recipe) -> None:
    """The stated fields' names, and the recipes and layouts they apply to."""
    for fld, val, names in (
        ("dist_optimizer", plan.dist_optimizer, literal_names(DistOptimizer) or ()),
        ("grad_sync_dtype", plan.grad_sync_dtype, literal_names(SyncDtype) or ()),
        ("optimizer_dtype", plan.optimizer_dtype, literal_names(SyncDtype) or ()),
    ):
        if val not in names:
            raise ConfigError(fld, val, f"use one of {', '.join(names)}")
    stated = (plan.dist_optimizer, plan.grad_sync_dtype, plan.optimizer_dtype)
    if plan.fp8_params is not None and plan.dist_optimizer != "apex_distributed_fused_adam":
        raise ConfigError(
            "fp8_params",
            plan.fp8_params,
            "fp8_params is modelled for Apex DistributedFusedAdam's master shard only: set "
            "dist_optimizer apex_distributed_fused_adam or leave fp8_params unstated",
        )
    if all(v == "unstated" for v in stated):
        return
    if recipe.name not in _MCORE:
        raise ConfigError(
            "dist_optimizer",
            plan.dist_optimizer,
            f"the optimizer fields are Megatron-Core / NeMo's: use recipe {' or '.join(_MCORE)}",
        )
    if plan.dist_optimizer == "apex_distributed_fused_adam" and recipe.name != "nemo":
        raise ConfigError(
            "dist_optimizer",
            plan.dist_optimizer,
            "Apex DistributedFusedAdam is NeMo's optimizer (optim.name distributed_fused_adam): "
            "use recipe nemo",
        )
    if plan.dist_optimizer != "unstated" and plan.layout.zero != 1:
        raise ConfigError(
            "parallel.zero",
            plan.layout.zero,
            f"{plan.dist_optimizer} shards the optimizer over dp x cp: set zero 1",
        )
    if plan.optimizer_dtype != "unstated" and plan.dist_optimizer != "apex_distributed_fused_adam":
        raise ConfigError(
            "optimizer_dtype",
            plan.optimizer_dtype,
            "optim.dtype is Apex DistributedFusedAdam's: set dist_optimizer "
            "apex_distributed_fused_adam or leave optimizer_dtype unstated",
        )


def stated_optimizer(plan: PlanInput, recipe: Recipe) -> Recipe:
    """`recipe` with the optimizer `plan` states applied (the module docstring); `recipe` itself
    when the plan states none or runs in fp32 (fp32 weights, gradients and states whatever
    the optimizer)."""
    _check(plan, recipe)
    if plan.precision == "fp32":
        return recipe
    if plan.dist_optimizer == "apex_distributed_fused_adam":
        o = _BYTES.get(plan.optimizer_dtype, 4.0)
        # Apex: grad_sync_dtype defaults to the optimizer dtype
        g = _BYTES[plan.grad_sync_dtype] if plan.grad_sync_dtype != "unstated" else o
        w = recipe.weight_bytes
        fp8_params = plan.precision == "fp8" if plan.fp8_params is None else plan.fp8_params
        if fp8_params:  # NeMo: fp8_params -> store_params (as te_fp8_gemm_inputs assumes)
            master = o
        elif o == w:  # the optimizer in the model's dtype: no master shard
            master = 0.0
        elif o == 4.0 and plan.precision == "bf16":  # store_param_remainders: int16
            master = 2.0
        else:
            master = o
        src = (
            f"{_NEMO}megatron_base_model.py MegatronBaseModel.setup_optimization; {_APEX} "
            "(recipes.dist_optim)"
        )
        return replace(
            recipe,
            grad_bytes=g,
            bucket_elem_bytes=g,
            master_bytes=master,
            shards_master=True,
            grad_buffer_full_under_zero1=True,
            optimizer_state_bytes=o,
            step_grad_fp32_copy=False,
            grad_shard_step_bytes=g,
            fp32_embedding_grads=True,
            sources={
                **recipe.sources,
                "grad_bytes": f"{_APEX} DistributedFusedAdam._init_grad_buffer: one contiguous "
                "buffer in grad_sync_dtype over every parameter (recipes.dist_optim)",
                "master_bytes": f"{src}: store_params / store_param_remainders",
                "optimizer_state_bytes": f"{_APEX} StateBucket.__init__: exp_avg / exp_avg_sq "
                "shards in the optimizer dtype",
                "optimizer": f"{_APEX} StateBucket.__init__: Adam's exp_avg / exp_avg_sq shards, "
                f"{o:g} B each (optim.dtype)",
                "grad_shard_step_bytes": f"{_APEX} _start_bucket_grad_sync / "
                "_finish_bucket_grad_sync: grads_shard",
                "fp32_embedding_grads": f"{_NEMO}megatron_gpt_model.py MegatronGPTModel."
                "configure_optimizers (with_fp32_embedding_grads)",
            },
        )
    if plan.grad_sync_dtype == "bf16":
        return replace(
            recipe,
            grad_bytes=2.0,
            bucket_elem_bytes=2.0,
            step_grad_fp32_copy=True,
            sources={
                **recipe.sources,
                "grad_bytes": f"{_NEMO}megatron_gpt_model.py MegatronGPTModel."
                "setup_mcore_distributed_parallel: grad_reduce_in_fp32 = (grad_sync_dtype == "
                "'fp32'); a bf16 gradient buffer (recipes.dist_optim)",
                "step_grad_fp32_copy": "NVIDIA/Megatron-LM d98e8a6 megatron/core/optimizer/"
                "distrib_optimizer.py DistributedOptimizer._copy_model_grads_to_main_grads: "
                "shard_model_grad.float()",
            },
        )
    return recipe


def plan_recipe(plan: PlanInput) -> Recipe | None:
    """The plan's framework recipe with the optimizer it states (`stated_optimizer`); None for
    the default recipe (scaletrain's own model)."""
    if plan.recipe == DEFAULT_RECIPE:
        return None
    return stated_optimizer(plan, recipe_named(plan.recipe))
