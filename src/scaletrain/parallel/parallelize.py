"""`parallelize()`: every strategy applied to a meta-device model, in one fixed order.

TP/SP -> CP -> EP -> AC -> compile -> FSDP/ZeRO-2/3 -> DDP/ZeRO-1 (STYLE.md #2; torchtitan's
order: sharding styles that change module structure first, wrappers that own communication of
whole parameters last). Each step is a no-op at degree 1. The trainer then calls
`scaletrain.models.materialize(model)` and builds its optimizer with `wrap_optimizer`.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import DTensor

from scaletrain.config import ConfigError, MemoryConfig, PrecisionConfig
from scaletrain.precision import maybe_apply_fp8

from .data_parallel import apply_ddp, apply_manual_grad_sync
from .dims import ParallelDims
from .fsdp import apply_fsdp, mp_policy
from .tensor_parallel import apply_tp

__all__ = ["parallelize"]


def _check(dims: ParallelDims, memory: MemoryConfig) -> None:
    # the layout rules (tp over DDP, ep vs dp*cp, ...) were checked when `dims` was built
    # (`ParallelDims.from_layout`, `config.composition_problems`); these involve memory options
    if memory.offload == "optimizer" and (dims.zero >= 2 or dims.tp > 1 or dims.ep > 1):
        raise ConfigError("memory.offload", memory.offload,
                          "optimizer-only offload runs with DDP / ZeRO-1 (plain parameters): "
                          "with FSDP, TP or EP use memory.offload=params with parallel.zero=2 "
                          "or 3 (FSDP2 keeps parameters, gradients and optimizer states on the "
                          "host)")
    if memory.offload == "params" and dims.zero < 2:
        raise ConfigError("memory.offload", memory.offload,
                          "parameter offload needs FSDP: set parallel.zero=2 or 3")
    if memory.offload == "params" and dims.mesh is None:
        raise ConfigError("memory.offload", memory.offload, "parameter offload uses FSDP2, "
                          "which needs a process group and mesh: launch with torchrun/--nproc")


def parallelize(model: nn.Module, dims: ParallelDims, *, precision: PrecisionConfig,
                memory: MemoryConfig, compile: bool = False, loss_parallel: bool = True
                ) -> nn.Module:
    """Apply fp8 linears, TP/SP, CP, EP, AC, compile, then FSDP (ZeRO-2/3, HSDP) or DDP (ZeRO-0/1).

    `dims.build_mesh()` must have been called. With tp > 1 and `loss_parallel`, the model
    returns vocabulary-sharded DTensor logits: compute the loss and its backward inside
    `tensor_parallel.loss_context(dims.submesh("tp"))`.
    """
    _check(dims, memory)
    if hasattr(model, "loss_chunk_tokens"):  # the fused head + loss (models.loss)
        model.loss_chunk_tokens = memory.loss_chunk_tokens
    # fp8 linears first: Float8Linear is an nn.Linear, so the TP plans and FSDP apply unchanged
    maybe_apply_fp8(model, precision)
    if dims.tp > 1:
        apply_tp(model, dims.submesh("tp"), sp=dims.sp, loss_parallel=loss_parallel)
    if dims.cp > 1:
        from .context_parallel import apply_cp

        apply_cp(model, dims.submesh("cp"))
    if dims.ep > 1:
        from .expert_parallel import apply_ep

        apply_ep(model, dims.submesh("ep"))
    if memory.ac != "none":
        from .ac import apply_ac

        apply_ac(model, memory.ac)
    if compile:
        # In place (`Module.compile`): no `_orig_mod.` wrapper, so names and the FSDP/AC
        # structure stay those of the plain model. Per block: every block has the same code,
        # so one compiled graph is reused L times.
        for block in model.layers.values():  # type: ignore[union-attr]
            block.compile()
    offload = memory.offload == "params"
    # Parameter offload is an FSDP2 policy, so it applies FSDP even over a 1-rank mesh.
    needs_fsdp = dims.zero >= 2 and (dims.fsdp_enabled or offload)
    if precision.dtype == "fp8" and precision.fp8_all_gather:
        if dims.tp > 1:
            raise ConfigError("precision.fp8_all_gather", True, "the float8 all-gather wraps "
                              "plain weight shards, not tensor-parallel DTensors: set "
                              "fp8_all_gather=false with parallel.tp > 1")
        if needs_fsdp:
            from scaletrain.precision.fp8_fsdp import enable_fp8_all_gather

            enable_fp8_all_gather(model)
    if needs_fsdp:
        # Expert-parallel experts (ep = dp*cp) are already split over the data-parallel ranks
        # and their gradients already scaled to the mean by EP: FSDP leaves them alone.
        experts = {p for p in model.parameters() if dims.ep > 1 and isinstance(p, DTensor)}
        apply_fsdp(model, dims.fsdp_mesh(), reshard_after_forward=dims.zero == 3,
                   mp=mp_policy(precision.dtype, precision.reduce_dtype),
                   offload_params=offload, ignored_params=experts)
    elif dims.ddp_enabled and dims.ep > 1:
        apply_manual_grad_sync(model, dims.submesh("dp_cp"))
    elif dims.ddp_enabled:
        apply_ddp(model, dims.submesh("dp_cp"), compression=precision.grad_compression,
                  powersgd_rank=precision.powersgd_rank,
                  powersgd_start_step=precision.powersgd_start_step)
    return model
