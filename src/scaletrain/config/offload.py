"""What `memory.offload` moves to host memory: model states (the optimizer's, or FSDP2's
parameters, gradients and optimizer states) and/or the activations autograd saves.

`memory.offload` is one name (`choices.OffloadMode`): 'none', 'optimizer', 'params',
'activations', or a state offload '+activations'. Everything that acts on the states reads
`offload_states`; what acts on the saved activations reads `offloads_activations`.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["StateOffload", "offload_states", "offloads_activations"]

StateOffload = Literal["none", "optimizer", "params"]


_STATES: dict[str, StateOffload] = {
    "none": "none",
    "optimizer": "optimizer",
    "params": "params",
    "activations": "none",
    "optimizer+activations": "optimizer",
    "params+activations": "params",
}
"""Every mode of `choices.OffloadMode` -> its state part (a table: the planner's search asks
for every rank of every layout it evaluates)."""


def offload_states(mode: str) -> StateOffload:
    """The model-state part of an offload mode: 'none', 'optimizer' or 'params'."""
    states = _STATES.get(mode)
    assert states is not None, mode  # checked by choices.OffloadMode
    return states


def offloads_activations(mode: str) -> bool:
    """Whether an offload mode moves the saved activations to host memory."""
    return mode.endswith("activations")
