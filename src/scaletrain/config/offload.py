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


def offload_states(mode: str) -> StateOffload:
    """The model-state part of an offload mode: 'none', 'optimizer' or 'params'."""
    states = mode.removesuffix("+activations")
    if states == "activations":
        return "none"
    assert states in ("none", "optimizer", "params"), mode  # checked by choices.OffloadMode
    return states  # type: ignore[return-value]  # narrowed by the assert


def offloads_activations(mode: str) -> bool:
    """Whether an offload mode moves the saved activations to host memory."""
    return mode.endswith("activations")
