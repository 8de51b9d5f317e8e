"""Torch-free analytic planner (see DESIGN.md §5): memory, FLOPs, communication, time, cost."""

from .comm import comm_terms, comm_time, comm_volumes
from .cost import TrainingCost, napkin_cost, training_cost
from .estimate import default_efficiency, estimate, estimate_memory
from .flops import flops_per_token, forward_flops_per_token
from .memory import (
    CONVENTIONS,
    OPTIMIZER_BYTES,
    activation_bytes,
    buffer_terms,
    head_activation_bytes,
    korthikanti_layer_bytes,
    layer_activation_bytes,
    model_state_bytes,
    stage_layer_counts,
    state_bytes_per_param,
)
from .pipeline import bubble_fraction, inflight_microbatches
from .rank_memory import pipeline_rank_memory
from .types import Estimate, MemoryBreakdown, PlanInput, TimeBreakdown

__all__ = [
    "estimate",
    "estimate_memory",
    "pipeline_rank_memory",
    "inflight_microbatches",
    "PlanInput",
    "Estimate",
    "MemoryBreakdown",
    "TimeBreakdown",
    "flops_per_token",
    "forward_flops_per_token",
    "model_state_bytes",
    "state_bytes_per_param",
    "activation_bytes",
    "layer_activation_bytes",
    "head_activation_bytes",
    "korthikanti_layer_bytes",
    "stage_layer_counts",
    "buffer_terms",
    "comm_terms",
    "comm_volumes",
    "comm_time",
    "bubble_fraction",
    "default_efficiency",
    "training_cost",
    "napkin_cost",
    "TrainingCost",
    "CONVENTIONS",
    "OPTIMIZER_BYTES",
]
