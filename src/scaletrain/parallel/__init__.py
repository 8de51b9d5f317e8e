"""Distributed training strategies applied from outside the model (see `parallelize`)."""

from .data_parallel import apply_ddp, apply_manual_grad_sync, maybe_no_sync, sync_gradients
from .dims import MESH_AXES, ParallelDims
from .fsdp import apply_fsdp, mp_policy
from .parallelize import parallelize
from .router_balance import update_router_biases
from .tensor_parallel import apply_tp, loss_context
from .zero import clip_grad_norm_, local_state_bytes, wrap_optimizer

__all__ = [
    "ParallelDims",
    "MESH_AXES",
    "parallelize",
    "apply_tp",
    "apply_fsdp",
    "apply_ddp",
    "apply_manual_grad_sync",
    "sync_gradients",
    "mp_policy",
    "maybe_no_sync",
    "loss_context",
    "wrap_optimizer",
    "clip_grad_norm_",
    "local_state_bytes",
    "update_router_biases",
]
