"""Count collectives as they run: calls and bytes sent per rank, per op and per process group.

Where the counting happens: every torch.distributed entry point (`all_reduce`,
`all_gather_into_tensor`, `reduce_scatter_tensor`, `all_to_all_single`, `broadcast`,
`send`/`recv`/`isend`/`irecv`, `batch_isend_irecv`, DDP's reducer, FSDP2, ZeroRedundancyOptimizer,
torch.distributed.pipelining) ends in a `c10d::*` dispatcher op, and DTensor's redistributions
call the functional collectives `_c10d_functional::*`, also dispatcher ops. A
`TorchDispatchMode` sees both kinds, whichever Python or C++ path issued them, so nothing has to
be monkey-patched and nothing is counted twice (the mode is off while the op it intercepted runs,
so the backend call inside a functional collective is not seen again). DTensor operands are
let through (`NotImplemented`) so DTensor desugars them into the plain collectives we count —
the same trick as torch's `CommDebugMode`, which counts ops but records no sizes.

Bytes are the *standard ring-algorithm bytes sent by one rank* (Thakur et al. 2005; Chan et al.
2007; NCCL's ring algorithms), the convention `scaletrain.planner.time.comm` uses, so a measured /
predicted ratio is meaningful. With S the payload of the call on this rank and n the group size:
  all-reduce                  2(n-1)/n * S
  all-gather                  (n-1)/n * S_full      (S_full = the gathered output = n * input)
  reduce-scatter              (n-1)/n * S_full      (S_full = the unreduced input)
  all-to-all                  S - (the chunk addressed to this rank itself); = (n-1)/n * S for
                              even splits, exact for the uneven splits of MoE dispatch
  broadcast                   (n-1)/n * S           (a pipelined chain: every rank but the last
                              forwards S once; averaged over the n ranks)
  send                        S;   recv 0 sent (its bytes are counted in `received`)
gather / scatter / reduce (unused by scaletrain) are recorded as `other:<op>` calls with 0 bytes.
It ignores: what the backend really does (gloo's broadcast is a flat tree, its all-reduce on
small tensors is not a ring), protocol headers, and the `wait_tensor` / barrier ops (no payload).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CommCounts", "CommEvent", "OpCount", "count_collectives", "ring_bytes_sent"]

_RING_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: (n - 1) / n,
    "send": lambda n: 1.0,
    "recv": lambda n: 0.0,
}


def ring_bytes_sent(kind: str, full_bytes: float, group_size: int) -> float:
    """Bytes one rank sends for a collective of `kind` under the ring convention above.

    `full_bytes`: all-reduce / broadcast / send: the tensor; all-gather: the gathered output;
    reduce-scatter: the unreduced input; all-to-all: this rank's input buffer (even splits).
    """
    if group_size <= 1 and kind not in ("send", "recv"):
        return 0.0
    return _RING_FACTOR[kind](group_size) * full_bytes


@dataclass
class OpCount:
    calls: int = 0
    bytes_sent: float = 0.0
    """Ring-convention bytes this rank sent (see the module docstring)."""
    payload: int = 0
    """Raw local tensor bytes handed to the op (input side), for cross-checks."""
    received: int = 0
    """Point-to-point bytes received (recv only)."""


@dataclass(frozen=True)
class CommEvent:
    """One collective call as counted: kind, process-group name and size, bytes."""

    kind: str
    group: str
    group_size: int
    bytes_sent: float
    payload: int
    received: int = 0


@dataclass
class CommCounts:
    """What `count_collectives` saw on this rank. Keys of `by_op`: `kind` (all_reduce,
    all_gather, reduce_scatter, all_to_all, broadcast, send, recv); of `by_group`:
    (kind, group name, group size)."""

    by_op: dict[str, OpCount] = field(default_factory=dict)
    by_group: dict[tuple[str, str, int], OpCount] = field(default_factory=dict)
    events: list[CommEvent] = field(default_factory=list)
    """Every call in issue order (to classify calls by group and size afterwards)."""

    @property
    def total_bytes(self) -> float:
        return sum(c.bytes_sent for c in self.by_op.values())

    @property
    def total_calls(self) -> int:
        return sum(c.calls for c in self.by_op.values())

    def add(
        self, kind: str, group: str, size: int, *, sent: float, payload: int, received: int = 0
    ) -> None:
        self.events.append(CommEvent(kind, group, size, sent, payload, received))
        for key, table in ((kind, self.by_op), ((kind, group, size), self.by_group)):
            c = table.setdefault(key, OpCount())  # type: ignore[arg-type]
            c.calls += 1
            c.bytes_sent += sent
            c.payload += payload
            c.received += received

    def bytes_in_groups(self, groups: set[str]) -> float:
        """Bytes sent in collectives over any of the named process groups."""
        return sum(c.bytes_sent for (_, g, _), c in self.by_group.items() if g in groups)

    def to_json(self) -> dict[str, Any]:
        return {
            "total_bytes": self.total_bytes,
            "total_calls": self.total_calls,
            "by_op": {k: vars(v) for k, v in sorted(self.by_op.items())},
            "by_group": [
                {"op": k, "group": g, "group_size": n, **vars(v)}
                for (k, g, n), v in sorted(self.by_group.items())
            ],
        }


def _nbytes(t: Any) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


def _pg(group: Any) -> tuple[str, int, int]:
    """(name, size, this rank's index) of a ProcessGroup object or a functional group name."""
    if isinstance(group, str):
        from torch.distributed.distributed_c10d import _resolve_process_group

        group = _resolve_process_group(group)  # type: ignore[arg-type]  # GroupName is a str NewType
    elif isinstance(group, torch.ScriptObject):  # how a dispatcher op hands over its group
        group = torch.distributed.ProcessGroup.unbox(group)
    return group.group_name, group.size(), group.rank()


def _a2a_sent(inp: torch.Tensor, in_splits: list[int] | None, size: int, rank: int) -> int:
    """All-to-all bytes leaving this rank: the input minus the rows addressed to itself."""
    total = _nbytes(inp)
    if size <= 1:
        return 0
    if not in_splits:
        return total - total // size
    row = total // max(1, inp.shape[0]) if inp.dim() else total
    return total - int(in_splits[rank]) * row


def _c10d(name: str, a: tuple) -> tuple[str, Any, float, int, int] | None:
    """(kind, group, ring bytes, payload, received) of one `c10d::` op call, else None."""
    if name in ("allreduce_", "allreduce_coalesced_"):
        s = _nbytes(a[0])
        return "all_reduce", a[1], s, s, 0
    if name == "_allgather_base_":  # (output, input, pg)
        return "all_gather", a[2], _nbytes(a[0]), _nbytes(a[1]), 0
    if name == "allgather_":  # (list[list] outputs, inputs, pg)
        return "all_gather", a[2], _nbytes(a[0]), _nbytes(a[1]), 0
    if name == "allgather_into_tensor_coalesced_":
        return "all_gather", a[2], _nbytes(a[0]), _nbytes(a[1]), 0
    if name in ("_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_"):  # (out, in, pg)
        return "reduce_scatter", a[2], _nbytes(a[1]), _nbytes(a[1]), 0
    if name == "reduce_scatter_":  # (outputs, list[list] inputs, pg)
        return "reduce_scatter", a[2], _nbytes(a[1]), _nbytes(a[1]), 0
    if name == "broadcast_":
        s = _nbytes(a[0])
        return "broadcast", a[1], s, s, 0
    if name == "send":
        s = _nbytes(a[0])
        return "send", a[1], s, s, 0
    if name in ("recv_", "recv_any_source_"):
        return "recv", a[1], 0, 0, _nbytes(a[0])
    return None


def _funcol(name: str, a: tuple) -> tuple[str, Any, float, int, int] | None:
    """Same for `_c10d_functional::` ops (group given by name, last positional argument)."""
    if name in ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_"):
        s = _nbytes(a[0])
        return "all_reduce", a[2], s, s, 0
    if name in (
        "all_gather_into_tensor",
        "all_gather_into_tensor_out",
        "all_gather_into_tensor_coalesced",
    ):  # (input(s), group_size, group_name)
        s = _nbytes(a[0])
        return "all_gather", a[2], s * int(a[1]), s, 0
    if name in ("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
        s = _nbytes(a[0])  # (input(s), op, group_size, group_name): input is the full tensor
        return "reduce_scatter", a[3], s, s, 0
    if name == "broadcast":
        s = _nbytes(a[0])
        return "broadcast", a[2], s, s, 0
    return None


class _Counter(TorchDispatchMode):
    def __init__(self, counts: CommCounts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor desugar into plain collectives first
        out = func(*args, **kwargs)
        ns, name = func.namespace, func._overloadpacket.__name__
        if ns in ("c10d", "_c10d_functional", "_c10d_functional_autograd", "c10d_functional"):
            self._record(ns, name, args)
        return out

    def _record(self, ns: str, name: str, a: tuple) -> None:
        if name in ("alltoall_base_", "all_to_all_single"):
            if ns == "c10d":  # (output, input, pg, out_splits, in_splits)
                inp, group, splits = a[1], a[2], a[4]
            else:  # (input, out_splits, in_splits, group_name)
                inp, group, splits = a[0], a[3], a[2]
            gname, size, rank = _pg(group)
            self.counts.add(
                "all_to_all",
                gname,
                size,
                sent=_a2a_sent(inp, list(splits), size, rank),
                payload=_nbytes(inp),
            )
            return
        if name == "alltoall_":  # (outputs, inputs, pg): the input list entry per peer
            gname, size, rank = _pg(a[2])
            self.counts.add(
                "all_to_all",
                gname,
                size,
                sent=_nbytes(a[1]) - _nbytes(a[1][rank]),
                payload=_nbytes(a[1]),
            )
            return
        rec = _c10d(name, a) if ns == "c10d" else _funcol(name, a)
        if rec is None:
            group = next((x for x in a if isinstance(x, torch.ScriptObject)), None)
            if ns == "c10d" and group is not None and "barrier" not in name:
                # gather / scatter / reduce: no ring convention here; visible, 0 bytes counted
                gname, size, _ = _pg(group)
                self.counts.add("other:" + name, gname, size, sent=0.0, payload=_nbytes(a[0]))
            return  # barrier, wait_tensor: no payload
        kind, group, full, payload, received = rec
        gname, size, _ = _pg(group)
        self.counts.add(
            kind,
            gname,
            size,
            sent=ring_bytes_sent(kind, full, size),
            payload=payload,
            received=received,
        )


@contextlib.contextmanager
def count_collectives() -> Iterator[CommCounts]:
    """Count every collective and point-to-point op this rank issues inside the block.

        with count_collectives() as c:
            loss.backward()
        c.total_bytes, c.by_op["all_reduce"].calls

    Counts ops issued by this thread (and the autograd engine's, which inherits the mode); a
    collective issued on a thread created inside the block is not seen.
    """
    counts = CommCounts()
    with _Counter(counts):
        yield counts
