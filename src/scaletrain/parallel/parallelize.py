"""`parallelize()`: every strategy applied to a meta-device model, in one fixed order.

TP/SP -> CP -> EP -> AC -> compile -> FSDP/ZeRO-2/3 -> DDP/ZeRO-1 (STYLE.md #2; torchtitan's
order: sharding styles that change module structure first, wrappers that own communication of
whole parameters last). Each step is a no-op at degree 1. The trainer then calls
`scaletrain.models.materialize(model)` and builds its optimizer with `wrap_optimizer`.
"""

from __future__ import annotations

from scaletrain.config import (
    MemoryConfig,
    PrecisionConfig,
    fsdp_reshard_after_forward,
    offload_states,
)
from scaletrain.config.layout import ddp_reducer, option_problems
from scaletrain.models.moe import MoE
from scaletrain.models.quantized import is_quantized_storage
from scaletrain.models.transformer import Transformer
from scaletrain.precision import maybe_apply_fp8

from .data_parallel import apply_ddp, apply_manual_grad_sync, is_expert
from .dims import ParallelDims
from .fsdp import apply_fsdp, mp_policy
from .tensor_parallel import apply_tp

__all__ = ["parallelize", "uses_ddp", "uses_fsdp"]


def _check(dims: ParallelDims, memory: MemoryConfig, precision: PrecisionConfig, moe: bool) -> None:
    # the layout rules (tp over DDP, ep vs dp*cp, ...) were checked when `dims` was built
    # (`ParallelDims.from_layout`, `config.composition_problems`); these involve the options
    problems = option_problems(
        dims.layout,
        offload=memory.offload,
        fp8_all_gather=precision.fp8_all_gather,
        precision=precision.dtype,
        grad_compression=precision.grad_compression,
        moe=moe,
    )
    if problems:
        raise problems[0]


def uses_fsdp(dims: ParallelDims, memory: MemoryConfig) -> bool:
    """Whether `parallelize` wraps the model in FSDP2: ZeRO-2/3 over a sharded axis, or
    parameter offload (an FSDP2 policy, applied even over a 1-rank mesh)."""
    return dims.zero >= 2 and (dims.fsdp_enabled or offload_states(memory.offload) == "params")


def uses_ddp(dims: ParallelDims, memory: MemoryConfig) -> bool:
    """Whether `parallelize` wraps the model in torch's DDP: ZeRO-0/1 data parallelism over
    plain parameters of an unpipelined model. Tensor- and expert-parallel parameters are
    DTensors, and torch's pipeline schedules interleave micro-batches' forwards and backwards,
    which DDP's reducer (one backward per forward) miscounts (pp2 x dp2 gradient norm 2.25 vs
    2.04): those sync their gradients once after backward (`apply_manual_grad_sync`)."""
    return not uses_fsdp(dims, memory) and ddp_reducer(dims.layout)


def parallelize(
    model: Transformer,
    dims: ParallelDims,
    *,
    precision: PrecisionConfig,
    memory: MemoryConfig,
    compile: bool = False,
    loss_parallel: bool = True,
    ddp: bool = True,
    fp8_device: str | None = None,
) -> Transformer:
    """Apply fp8 linears, TP/SP, CP, EP, AC, compile, then FSDP (ZeRO-2/3, HSDP) or DDP (ZeRO-0/1).

    `dims.build_mesh()` must have been called. With tp > 1 and `loss_parallel`, the model
    returns vocabulary-sharded DTensor logits: compute the loss and its backward inside
    `tensor_parallel.loss_context(dims.submesh("tp"))`. `ddp=False` leaves out the DDP wrapper
    where `uses_ddp` (the dry-run: DDP's reducer reads parameter storage to verify shapes across
    ranks, which fake tensors do not have; the local computation is the same). `fp8_device`:
    the device type fp8's backend is chosen for (`precision.apply_fp8`'s `device_type`).
    """
    _check(dims, memory, precision, moe=any(isinstance(m, MoE) for m in model.modules()))
    model.loss_chunk_tokens = memory.loss_chunk_tokens  # the fused head + loss (models.loss)
    # fp8 linears first: Float8Linear is an nn.Linear, so the TP plans and FSDP apply unchanged
    maybe_apply_fp8(
        model,
        precision,
        device_type=fp8_device,
        all_gather=precision.fp8_all_gather and uses_fsdp(dims, memory),
    )
    _apply_model_parallel(model, dims, loss_parallel=loss_parallel)
    _apply_ac_and_compile(model, ac=memory.ac, compile=compile)
    _apply_data_parallel(model, dims, precision=precision, memory=memory, ddp=ddp)
    return model


def _apply_model_parallel(model: Transformer, dims: ParallelDims, *, loss_parallel: bool) -> None:
    """TP/SP, then CP, then EP: the strategies that change module structure or shard inputs."""
    if dims.tp > 1:
        # MoE experts: split over tp without expert parallelism, else whole per tp rank for EP
        # to split (the rule lives in config.layout_problems)
        apply_tp(
            model,
            dims.submesh("tp"),
            sp=dims.sp,
            loss_parallel=loss_parallel,
            shard_experts=dims.ep == 1,
        )
    if dims.cp > 1:
        from .context_parallel import apply_cp

        apply_cp(model, dims.submesh("cp"))
    if dims.ep > 1:
        from .expert_parallel import apply_ep

        apply_ep(model, dims.submesh("ep"))


def _apply_ac_and_compile(model: Transformer, *, ac: str, compile: bool) -> None:
    """Activation checkpointing, then per-block compile (inside the AC wrappers)."""
    if ac != "none":
        from .ac import apply_ac

        apply_ac(model, ac)
    if compile:
        # In place (`Module.compile`): no `_orig_mod.` wrapper, so names and the FSDP/AC
        # structure stay those of the plain model. Per block: every block has the same code,
        # so one compiled graph is reused L times.
        for block in model.layers.values():  # TransformerBlock, or its AC wrapper
            block.compile()


def _apply_data_parallel(
    model: Transformer,
    dims: ParallelDims,
    *,
    precision: PrecisionConfig,
    memory: MemoryConfig,
    ddp: bool,
) -> None:
    """FSDP2 (ZeRO-2/3, HSDP, offload) or DDP (ZeRO-0/1) or the manual gradient sync, then
    the experts' replica average: the wrappers owning whole-parameter communication, last."""
    offload = offload_states(memory.offload) == "params"
    needs_fsdp = uses_fsdp(dims, memory)
    if precision.dtype == "fp8" and precision.fp8_all_gather and needs_fsdp:
        from scaletrain.precision.fp8_fsdp import enable_fp8_all_gather

        enable_fp8_all_gather(model)
    if needs_fsdp:
        # Expert-parallel experts are already split over an ep sub-axis of the data-parallel
        # ranks and their gradients scaled to the ep group's mean by EP: FSDP leaves them
        # alone; their replicas (ep < dp*cp) are averaged below.
        experts = {p for p in model.parameters() if is_expert(p)}
        apply_fsdp(
            model,
            dims.fsdp_mesh(),
            # ZeRO-3, but for a split-backward pipeline's stages (their units stay gathered
            # from torch's UNSHARD to its RESHARD: `config.fsdp_reshard_after_forward`)
            reshard_after_forward=fsdp_reshard_after_forward(dims.layout),
            mp=mp_policy(precision.dtype, precision.reduce_dtype),
            offload_params=offload,
            ignored_params=experts,
        )
    elif uses_ddp(dims, memory):
        if ddp:
            apply_ddp(
                model,
                dims.submesh("dp_cp"),
                init_sync=not any(is_quantized_storage(p) for p in model.parameters()),
                compression=precision.grad_compression,
                powersgd_rank=precision.powersgd_rank,
                powersgd_start_step=precision.powersgd_start_step,
            )
    elif dims.ddp_enabled:  # DTensor parameters or pipeline stages (see `uses_ddp`)
        apply_manual_grad_sync(model, dims.submesh("dp_cp"))
    if dims.ep > 1 and dims.submesh("ep_replicate").size() > 1:
        # experts held by dp*cp/ep ranks each: their gradients averaged over those replicas
        apply_manual_grad_sync(model, dims.submesh("ep_replicate"), experts=True)
