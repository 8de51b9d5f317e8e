"""The moments of a rank's step at which its memory can peak, and a rank's result.

Each moment is a dataclass of its named byte terms; its `total` adds them in the order the
planner always has (outputs stay bit-identical). `rank.rank_memory` builds a rank's
moments and keeps the largest; `RankMemory.moment` names it and `explain` prints it. What each
term counts and its source are in `rank_moments.py` and `rank.py` where the moment is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

__all__ = [
    "ForwardBackward",
    "NormBackward",
    "MlpForwardEnd",
    "OptimizerStep",
    "ZeroBlockBackward",
    "ZeroStageBackward",
    "ZeroEndOfBackward",
    "ZeroPipelineReduce",
    "ZeroForward",
    "LossBackward",
    "HeadWeightPass",
    "EmbeddingBackward",
    "Moment",
    "RankMemory",
]


# The moments are built per rank on the search's hot path, so they are plain slotted dataclasses
# built by keyword (never mutated after construction) but not frozen: frozen ones cost 30% of the
# search's layouts/s (their __init__ sets each field through object.__setattr__; measured on
# llama3-405b / 16,384 H100). Each sums its `total` once, as it is built: the rank's peak and the
# search's miss shortcut read it up to three times (a property summed it each time).


@dataclass(kw_only=True, slots=True)
class ForwardBackward:
    """Forward/backward with the activations stored (no ZeRO-2/3 units): states, every buffer,
    the stored activations with the gradients that exist by then."""

    name: ClassVar[str] = "forward/backward peak with activations stored"
    states: float
    buffers: float
    acts_and_grads: float

    total: float = field(init=False, repr=False, compare=False)
    """The moment's bytes, its terms summed once when it is built (`__post_init__`)."""

    def __post_init__(self) -> None:
        self.total = self.states + self.buffers + self.acts_and_grads


@dataclass(kw_only=True, slots=True)
class NormBackward(ForwardBackward):
    """A norm's backward without ZeRO-2/3 units (pp = 1; `rank.rank_memory`): states, the
    buffers alive outside a linear (no fp8 cast, no SP gather in flight), the stored
    activations with the norm's temporaries and gradients (`norm_backward_bytes`) and the
    gradients that exist by then."""

    name: ClassVar[str] = "a norm's backward (fp32 temporaries)"


@dataclass(kw_only=True, slots=True)
class MlpForwardEnd(ForwardBackward):
    """The end of the last block's MLP forward without ZeRO-2/3 units (pp = 1;
    `rank.rank_memory`): states, the buffers but fp8's backward cast, the blocks' stored
    activations and what the forward holds unsaved (`mlp_forward_end_bytes`), the gradients
    of earlier micro-batches."""

    name: ClassVar[str] = "the end of the last block's MLP forward (fp8)"


@dataclass(kw_only=True, slots=True)
class OptimizerStep:
    """The optimizer step: after backward the 16-bit weight casts (autocast) / unsharded FSDP
    units are freed and no FSDP collective is in flight; DDP buckets persist."""

    name: ClassVar[str] = "optimizer step"
    states: float
    params_in_flight: float
    buffers: float
    fsdp: float
    fp8_quantize: float
    grads: float
    grads_in_flight: float
    step_temp: float

    total: float = field(init=False, repr=False, compare=False)
    """The moment's bytes, its terms summed once when it is built (`__post_init__`)."""

    def __post_init__(self) -> None:
        self.total = (
            self.states
            - self.params_in_flight
            + self.buffers
            - self.fsdp
            - self.fp8_quantize
            + self.grads
            - self.grads_in_flight
            + self.step_temp
        )


@dataclass(kw_only=True, slots=True)
class ZeroBlockBackward:
    """A block's backward under ZeRO-2/3 (see `_zero_moments`)."""

    name: ClassVar[str] = "block backward under ZeRO-2/3"
    states: float
    buffers: float
    fsdp: float
    root_unit: float
    head_grad: float
    unit_copies: float
    acts_and_grads: float
    held_logits: float

    total: float = field(init=False, repr=False, compare=False)
    """The moment's bytes, its terms summed once when it is built (`__post_init__`)."""

    def __post_init__(self) -> None:
        self.total = (
            self.states
            + self.buffers
            - self.fsdp
            + self.root_unit
            + self.head_grad
            + self.unit_copies
            + self.acts_and_grads
            + self.held_logits
        )


@dataclass(kw_only=True, slots=True)
class ZeroStageBackward:
    """A pipeline stage's backward under ZeRO-2/3: torch's stage keeps every unit gathered
    and its gradients unsharded until the stage's REDUCE_GRAD (see `zero_moments`)."""

    name: ClassVar[str] = "pipeline stage backward, FSDP units gathered"
    states: float
    params_in_flight: float
    buffers: float
    fsdp: float
    stage_gathered: float
    """Every unit of the rank gathered, in the compute dtype."""
    grads: float
    """The unsharded gradients held then (`pipeline_fsdp.FsdpRank.grad_bytes`)."""
    stored_acts: float
    held_logits: float

    total: float = field(init=False, repr=False, compare=False)
    """The moment's bytes, its terms summed once when it is built (`__post_init__`)."""

    def __post_init__(self) -> None:
        self.total = (
            self.states
            - self.params_in_flight
            + self.buffers
            - self.fsdp
            + self.stage_gathered
            + self.grads
            + self.stored_acts
            + self.held_logits
        )


@dataclass(kw_only=True, slots=True)
class ZeroPipelineReduce:
    """A stage's REDUCE_GRAD under ZeRO-2/3 pipelining: the reduce-scatter of its first FSDP
    unit, the rank's other units still gathered with their unsharded gradients
    (`pipeline_fsdp.pipeline_reduce_moment`)."""

    name: ClassVar[str] = "a pipeline stage's gradient reduce-scatter (REDUCE_GRAD)"
    states: float
    """Sharded parameters and optimizer states, and the buffers but FSDP's."""
    gathered: float
    """The units still gathered (compute dtype)."""
    grads: float
    """Unsharded gradients still held, the reduced unit's among them."""
    sharded_grads: float
    """The sharded gradients of the stages and units reduced before."""
    reduce_scatter: float
    """The unit's fp32 reduce-scatter input and output."""
    stored_acts: float

    total: float = field(init=False, repr=False, compare=False)
    """The moment's bytes, its terms summed once when it is built (`__post_init__`)."""

    def __post_init__(self) -> None:
        self.total = (
            self.states
            + self.gathered
            + self.grads
            + self.sharded_grads
            + self.reduce_scatter
            + self.stored_acts
        )


@dataclass(kw_only=True, slots=True)
class ZeroEndOfBackward:
    """The end of backward under ZeRO-2/3: the root unit's post-backward (`_zero_moments`)."""

    name: ClassVar[str] = "end of backward, root unit's reduce-scatter"
    states: float
    buffers: float
    fsdp: float
    reduce_scatter: float
    grads: float
    root_grad: float
    held_logits: float
    root_sharded_grads: float

    total: float = field(init=False, repr=False, compare=False)
    """The moment's bytes, its terms summed once when it is built (`__post_init__`)."""

    def __post_init__(self) -> None:
        # the ZeRO-3 root terms are added as one sum (all 0.0 without a root unit to wait on)
        self.total = (
            self.states
            + self.buffers
            - self.fsdp
            + self.reduce_scatter
            + self.grads
            + (self.root_grad + self.held_logits - self.root_sharded_grads)
        )


@dataclass(kw_only=True, slots=True)
class ZeroForward:
    """A block's unshard in forward under ZeRO-3 (`rank_moments._zero_forward`)."""

    name: ClassVar[str] = "a block's forward under ZeRO-3 (all-gather copy-out or compute)"
    states: float
    buffers: float
    root_unit: float
    unit_copies: float
    acts_and_grads: float

    total: float = field(init=False, repr=False, compare=False)
    """The moment's bytes, its terms summed once when it is built (`__post_init__`)."""

    def __post_init__(self) -> None:
        self.total = (
            self.states + self.buffers + self.root_unit + self.unit_copies + self.acts_and_grads
        )


@dataclass(kw_only=True, slots=True)
class LossBackward:
    """The last stage's loss backward (see `_loss_moment`)."""

    name: ClassVar[str] = "loss backward on the last stage"
    states: float
    buffers: float
    fsdp: float
    fp8_quantize: float
    stored_acts: float
    head_acts: float
    grads: float
    loss_temp: float
    head_grad: float
    """The head weight's gradient the fused loss returns (`head.head_grad_bytes`)."""

    total: float = field(init=False, repr=False, compare=False)
    """The moment's bytes, its terms summed once when it is built (`__post_init__`)."""

    def __post_init__(self) -> None:
        self.total = (
            self.states
            + self.buffers
            - self.fsdp
            - self.fp8_quantize
            + self.stored_acts
            + self.head_acts
            + self.grads
            + self.loss_temp
            + self.head_grad
        )


@dataclass(kw_only=True, slots=True)
class HeadWeightPass:
    """The last stage's weight pass (W) of a split backward (see `head_weight_moment`)."""

    name: ClassVar[str] = "head weight pass (W) on the last stage"
    states: float
    buffers: float
    fsdp: float
    fp8_quantize: float
    stored_acts: float
    head_acts: float
    grads: float
    weight_grad_temp: float
    """The head weight's gradient being made (`split_backward.head_weight_pass_bytes`)."""

    total: float = field(init=False, repr=False, compare=False)
    """The moment's bytes, its terms summed once when it is built (`__post_init__`)."""

    def __post_init__(self) -> None:
        self.total = (
            self.states
            + self.buffers
            - self.fsdp
            - self.fp8_quantize
            + self.stored_acts
            + self.head_acts
            + self.grads
            + self.weight_grad_temp
        )


@dataclass(kw_only=True, slots=True)
class EmbeddingBackward:
    """The first stage's embedding backward (`rank_moments.embedding_moment`): the last
    gradient of an unpipelined backward, or a later micro-batch's on a ZeRO-0/1 pipeline."""

    name: ClassVar[str] = "embedding backward on the first stage"
    states: float
    other_grads: float
    held_logits: float
    embedding_temp: float
    runtime_context: float
    stored_acts: float = 0.0
    """The other micro-batches' stored activations (a pipeline's steady state)."""
    cast_grads: float = 0.0
    """The stage's autocast cast gradients waiting for the end of this backward."""

    total: float = field(init=False, repr=False, compare=False)
    """The moment's bytes, its terms summed once when it is built (`__post_init__`)."""

    def __post_init__(self) -> None:
        # (the pipeline's terms last: 0.0 elsewhere, which leaves those sums bit-identical)
        self.total = (
            self.states
            + self.other_grads
            + self.held_logits
            + self.embedding_temp
            + self.runtime_context
            + self.stored_acts
            + self.cast_grads
        )


Moment = (
    ForwardBackward
    | NormBackward
    | MlpForwardEnd
    | OptimizerStep
    | ZeroBlockBackward
    | ZeroStageBackward
    | ZeroEndOfBackward
    | ZeroPipelineReduce
    | ZeroForward
    | LossBackward
    | HeadWeightPass
    | EmbeddingBackward
)


@dataclass(kw_only=True, slots=True)
class RankMemory:
    """Memory of one pipeline rank: its peak (the largest of its moments) and the terms the
    breakdown reports. Built for every rank the search evaluates: not frozen, for the moments'
    reason above."""

    reserved: float
    total: float
    states: dict
    """`memory.states.model_state_bytes` of the rank."""
    buffer_terms: dict
    buffers: float
    """Sum of the buffer terms, with the loss and embedding backward temporaries and the
    head gradient the fused loss returns."""
    activations: float
    per_layer: float
    step_temp: float
    params: float
    rank: int
    in_flight: float
    moment: str
    """The name of the moment that set the peak."""
    host: float = 0.0
    """Host bytes this rank fills at its peak (`rank._host_bytes`)."""
    host_terms: tuple[tuple[str, float], ...] = ()
    """Those bytes by what they hold (optimizer states, parameters, activations)."""
    settled: bool = False
    """True where the search's miss shortcut settled the rank at its optimizer step
    (`rank.rank_memory`'s `settle_at`): `reserved` and `total` are that moment's, a lower bound
    of the rank's peak, and the activations and host bytes were not computed (0)."""
