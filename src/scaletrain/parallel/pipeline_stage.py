"""Pipeline stages whose communication buffers are bounded by the micro-batches in flight.

torch 2.13's `PipelineStage` allocates, for every micro-batch of the step, a forward receive
buffer (`_setup_forward_recv_info`) and a gradient receive buffer (`_setup_backward_recv_info`)
and keeps them for the stage's life; its multi-stage runtime (`_PipelineScheduleRuntime`)
keeps every send's work, and with it the tensor sent, until the step ends. Both grow with the
number of micro-batches: GPT-3 175B with TP8 x PP8 interleaved (v = 3) and 64 micro-batches
held 38.65 GB of them per GPU (issue #37). Megatron-LM allocates a receive when it posts it
(`p2p_communication._communicate`).

`InFlightStage` is torch's stage with that lifetime: a receive buffer is allocated when its
receive is posted (`get_fwd_recv_ops` / `get_bwd_recv_ops`, the same `_make_tensor_from_meta`
torch uses) and the stage drops it once it has consumed it (after `forward_one_chunk`: the
received activation then lives on as the stage's saved input until its backward; after
`backward_one_chunk`: the received gradient lives on in torch's `backward_state` until W after
a split backward). The last stage also cuts each micro-batch's loss from its graph after its
backward (`let_go_of_graph`). Everything else is torch's.

`SendLedger` lets the multi-stage runtime's sends go early. With a ledger attached, a stage
fires the sends of a SEND_F / SEND_B action itself (`get_fwd_send_ops` / `get_bwd_send_ops`
fire what torch's runtime would fire at that point, the same way, `_batch_p2p`, and hand the
runtime nothing to keep) and the ledger waits each one where
`planner.time.pipeline_comms.send_releases` proves it complete (its receiver has consumed
it), leaving the rest to `drain` at the end of the step. The runtime's own hook for an action
type (`register_custom_function`) refuses SEND actions in 2.13. The single-stage schedules
(gpipe, 1f1b) batch a send with a receive and wait their sends themselves: no ledger.

The planner counts what this holds (`planner.memory.buffers.pp_boundary_bytes`); the dry-run
drives the stages through the same events (`dryrun.torch_compat.ActionSchedule`).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._utils import _make_tensor_from_meta
from torch.distributed.pipelining.schedules import _Action, _batch_p2p, _ComputationType
from torch.distributed.pipelining.stage import _RecvInfo

from scaletrain.planner.time.pipeline_comms import Op, send_releases

__all__ = ["InFlightStage", "SendLedger", "let_go_of_graph", "planner_op"]

_KIND = {
    _ComputationType.FORWARD: "F",
    _ComputationType.FULL_BACKWARD: "B",
    _ComputationType.BACKWARD_INPUT: "I",
    _ComputationType.BACKWARD_WEIGHT: "W",
    _ComputationType.SEND_F: "SEND_F",
    _ComputationType.RECV_F: "RECV_F",
    _ComputationType.SEND_B: "SEND_B",
    _ComputationType.RECV_B: "RECV_B",
    _ComputationType.UNSHARD: "UNSHARD",
    _ComputationType.RESHARD: "RESHARD",
    _ComputationType.REDUCE_GRAD: "REDUCE_GRAD",
}


def planner_op(action: _Action) -> Op:
    """torch's action as the planner's `Op` (kind letters of `planner.time.pipeline`)."""
    mb = action.microbatch_index
    return Op(action.stage_index, _KIND[action.computation_type], -1 if mb is None else mb)


def _without_buffers(infos: tuple[_RecvInfo, ...]) -> tuple[_RecvInfo, ...]:
    return tuple(
        _RecvInfo(i.input_name, i.source, None, i.tensor_meta, is_root_arg=i.is_root_arg)
        for i in infos
    )


def let_go_of_graph(loss: torch.Tensor | None) -> None:
    """Cut a micro-batch's loss from its graph once its backward ran. torch's schedule keeps
    every micro-batch's loss until the step ends (`_internal_losses`, for `losses`), and a
    loss's graph, even freed, keeps the leaves it reached, among them the last stage's received
    input: one (b, s, h) tensor per micro-batch (the trainer's loss is a new tensor, the fused
    loss divided by its share: `PipelineRuntime.staged_loss`). The value stays."""
    if isinstance(loss, torch.Tensor) and loss.grad_fn is not None and not loss._is_view():
        loss.detach_()


class InFlightStage(PipelineStage):
    """torch's `PipelineStage` whose receive buffers exist from the post of their receive until
    the stage consumed them (see the module docstring)."""

    ledger: SendLedger | None = None
    """Set by `SendLedger.attach`: told when this stage consumes a received message."""
    peak_received = 0
    """The most receive buffers alive at once so far, as the stage saved input they become
    included (weak references: a test's probe of what the runtime holds)."""
    _received: list[weakref.ref] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._losses_for_w: dict[int, torch.Tensor | None] = {}

    def _setup_forward_recv_info(self, num_microbatches: int, has_backward: bool) -> None:
        # torch's infos for one micro-batch, then the same infos without a buffer for all
        super()._setup_forward_recv_info(1, has_backward)
        proto = _without_buffers(self.args_recv_info[0])
        self.args_recv_info = {k: proto for k in range(num_microbatches)}

    def _setup_backward_recv_info(self, num_microbatches: int) -> None:
        super()._setup_backward_recv_info(1)
        proto = _without_buffers(self.grad_recv_info[0])
        self.grad_recv_info = {k: proto for k in range(num_microbatches)}
        self.chunks = num_microbatches

    def _allocate(self, infos: dict[int, tuple[_RecvInfo, ...]], k: int) -> None:
        """Give micro-batch k's receives their own buffers (torch's `_make_tensor_from_meta`)."""
        fresh = _without_buffers(infos[k])
        alive = [r for r in self._received or [] if r() is not None]
        for info in fresh:
            if not info.is_root_arg and info.tensor_meta is not None:
                info.buffer = _make_tensor_from_meta(info.tensor_meta, self.device)
                alive.append(weakref.ref(info.buffer))
        infos[k] = fresh
        self._received = alive
        self.peak_received = max(self.peak_received, len(alive))

    def get_fwd_recv_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        if not self.is_first:
            self._allocate(self.args_recv_info, fwd_chunk_id)
        return super().get_fwd_recv_ops(fwd_chunk_id)

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        if self.has_backward and not self.is_last:
            self._allocate(self.grad_recv_info, bwd_chunk_id)
        return super().get_bwd_recv_ops(bwd_chunk_id)

    def set_local_fwd_input(self, prev_stage_outputs: Any, mb_index: int) -> None:
        # the V's turn (no receive): torch stores the output in the info; give the micro-batch
        # its own infos first (they are shared until allocated)
        self.args_recv_info[mb_index] = _without_buffers(self.args_recv_info[mb_index])
        super().set_local_fwd_input(prev_stage_outputs, mb_index)

    def set_local_bwd_input(
        self, next_stage_bwd_outputs: tuple[torch.Tensor | None, ...], mb_index: int
    ) -> None:
        # torch stores the gradient in the info (the micro-batch's own infos first); a None
        # gradient zeroes a buffer instead: give it one
        if any(t is None for t in next_stage_bwd_outputs):
            self._allocate(self.grad_recv_info, mb_index)
        else:
            self.grad_recv_info[mb_index] = _without_buffers(self.grad_recv_info[mb_index])
        super().set_local_bwd_input(next_stage_bwd_outputs, mb_index)

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        ops = super().get_fwd_send_ops(fwd_chunk_id)
        if self.ledger is None:
            return ops
        self.ledger.fired(("SEND_F", self.stage_index, fwd_chunk_id), _batch_p2p(ops))
        return []

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        ops = super().get_bwd_send_ops(bwd_chunk_id)
        if self.ledger is None:
            return ops
        self.ledger.fired(("SEND_B", self.stage_index, bwd_chunk_id), _batch_p2p(ops))
        return []

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        if self.ledger is not None and not self.is_first:
            self.ledger.received(self.stage_index, "F", fwd_chunk_id)
        out = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        # the stage holds its input for backward (fwd_cache); the info lets go of it
        self.args_recv_info[fwd_chunk_id] = _without_buffers(self.args_recv_info[fwd_chunk_id])
        return out

    def backward_one_chunk(
        self,
        bwd_chunk_id: int,
        loss: torch.Tensor | None = None,
        full_backward: bool = True,
        last_backward: bool = False,
    ) -> None:
        if not self.has_backward:  # an eval schedule (torch's returns at once): no buffers
            return  # (before any training step the backward's receive infos do not exist)
        if self.ledger is not None and not self.is_last:
            self.ledger.received(self.stage_index, "back", bwd_chunk_id)
        super().backward_one_chunk(
            bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward
        )
        if not self.is_last:
            self.grad_recv_info[bwd_chunk_id] = _without_buffers(self.grad_recv_info[bwd_chunk_id])
        elif full_backward:
            let_go_of_graph(loss)
        else:  # the weight pass still runs the loss's graph
            self._losses_for_w[bwd_chunk_id] = loss

    def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False) -> None:
        super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
        let_go_of_graph(self._losses_for_w.pop(bwd_chunk_id, None))


class SendLedger:
    """The sends of a multi-stage schedule, fired by the runtime's SEND actions and waited as
    soon as their receiver has provably consumed them (see the module docstring)."""

    def __init__(self, schedule: Any, rank: int) -> None:
        orders = {
            r: [planner_op(s) for a in acts for s in (a.sub_actions or (a,))]
            for r, acts in schedule.pipeline_order_with_comms.items()
        }
        to_rank = schedule.stage_index_to_group_rank
        releases = send_releases(orders, lambda s: to_rank[s], schedule._num_stages)[rank]
        # (stage, 'F' | 'back', mb) of the compute that first receives -> sends let go there
        self._release: dict[tuple[int, str, int], list[tuple[str, int, int]]] = {}
        for i, sends in releases.items():
            a = orders[rank][i]
            at = (a.stage, "F" if a.kind == "F" else "back", a.microbatch)
            self._release[at] = [(s.kind, s.stage, s.microbatch) for s in sends]
        self._works: dict[tuple[str, int, int], list[dist.Work]] = {}
        self.peak_pending = 0
        """The most sends outstanding at once in the last steps (a test's probe)."""

    def attach(self, schedule: Any) -> None:
        """Have the schedule's stages fire their sends through this ledger."""
        for stage in schedule._stages:
            stage.ledger = self

    def fired(self, key: tuple[str, int, int], works: list[dist.Work]) -> None:
        """A send (kind, stage, micro-batch) went out."""
        self._works[key] = works
        self.peak_pending = max(self.peak_pending, len(self._works))

    def received(self, stage: int, kind: str, mb: int) -> None:
        """The stage is about to compute on a message it received: wait the sends this proves
        complete (no blocking: see `send_releases`)."""
        for key in self._release.get((stage, kind, mb), []):
            for w in self._works.pop(key, []):
                w.wait()

    def drain(self) -> None:
        """Wait every send left (the end of the step)."""
        for works in self._works.values():
            for w in works:
                w.wait()
        self._works.clear()
