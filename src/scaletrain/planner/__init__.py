"""Torch-free analytic planner (see docs/DESIGN.md §5): memory, FLOPs, communication, time, cost.

Where things are (each subpackage's docstring says more):

- `types.py`: `PlanInput` in, `Estimate` out (`Estimate.to_json()` is `plan --json`).
- `estimate.py`: `estimate(plan)`: the worst rank's memory, the step time, tokens/s, MFU.
- `memory/`: bytes per rank: model states (ZeRO, offload), activations, the head and loss,
  buffers, the moments at which a rank peaks and the worst pipeline rank.
- `time/`: FLOPs, kernel efficiency, collectives, pipeline schedules and bubbles, step time,
  the run's cost.
- `recipes/`: what other frameworks (Megatron, DeepSpeed, torchtitan, NeMo, nanotron)
  allocate, and published runs to check them against.
- `search/`: the best layouts of a GPU count, and why each strategy family lost.
- `napkin/`: the textbook formulas behind `scaletrain napkin`.
- `output/`: tables, JSON, `explain`'s walk-through, plots.

For example, the ZeRO-3 / FSDP all-gather: its bytes held are `memory/states.py`
(`params.in_flight`) and `memory/rank_moments.py` (the gathered block in backward), its time is
`time/comm.py` (`fsdp_all_gather`) and its overlap with compute `time/exposure.py`.
"""

from .estimate import estimate
from .memory.activations import activation_bytes, korthikanti_layer_bytes, layer_activation_bytes
from .memory.buffers import buffer_terms
from .memory.head import head_activation_bytes
from .memory.rank import estimate_memory, pipeline_rank_memory
from .memory.states import (
    CONVENTIONS,
    OPTIMIZER_BYTES,
    StageParams,
    model_state_bytes,
    optimizer_bytes,
    stage_layer_counts,
    state_bytes_per_param,
)
from .time.comm import CommInputs, comm_terms, comm_time, comm_volumes
from .time.cost import Site, TrainingCost, napkin_cost, training_cost
from .time.flops import flops_per_token, forward_flops_per_token
from .time.pipeline import bubble_fraction, inflight_microbatches
from .time.step_time import default_efficiency
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
    "StageParams",
    "state_bytes_per_param",
    "activation_bytes",
    "layer_activation_bytes",
    "head_activation_bytes",
    "korthikanti_layer_bytes",
    "stage_layer_counts",
    "buffer_terms",
    "comm_terms",
    "CommInputs",
    "comm_volumes",
    "comm_time",
    "bubble_fraction",
    "default_efficiency",
    "training_cost",
    "napkin_cost",
    "Site",
    "TrainingCost",
    "CONVENTIONS",
    "OPTIMIZER_BYTES",
    "optimizer_bytes",
]
