"""Tensor parallelism of Multi-head Latent Attention (models/mla.py): heads split, latents whole.

The head-wise projections are split like Megatron's attention (Shoeybi et al. 2019): wq / wq_b
and wkv_b column-wise (whole heads per rank: tp must divide num_heads), wo row-wise. The
down-projections to the latents (wq_a, wkv_a, wk_rope) and the latent norms (q_norm, kv_norm)
are small and shared by every head, so every tp rank holds them whole (`ReplicatedLatent`) and
computes them on the whole (replicated) block input, as DeepSeek's own inference code and
Megatron-Core's MLA do.

Gradients: a rank's heads see only their part of the loss, so the gradient of each latent is
a partial sum over tp. The latents stay Replicate DTensors from the block input through the
norms into the column-parallel wq_b / wkv_b, whose backward yields that Partial gradient;
DTensor reduces it where a replicated weight or the block input needs it (as for Qwen3's q/k
norms). The RoPE key (wk_rope's output) is one tensor for all heads that the model
concatenates with its local heads' keys, so it leaves its Linear as a local tensor whose
gradient is declared Partial (`to_local(grad_placements=[Partial()])`): the same reduction,
taken by DTensor at the Linear's backward.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle

from scaletrain.models.mla import MLAttention

__all__ = ["ReplicatedLatent", "mla_tp_plan"]


class ReplicatedLatent(ParallelStyle):
    """A module whose parameters every tp rank holds whole (Replicate), run on the replicated
    block input. `local_output`: hand the output on as a local tensor whose gradient is a
    partial sum over tp (the RoPE key), else as the Replicate DTensor it is."""

    def __init__(self, *, local_output: bool = False) -> None:
        super().__init__()
        self.local_output = local_output

    @staticmethod
    def _input(module: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
        return tuple(
            x
            if isinstance(x, DTensor) or x is None
            else DTensor.from_local(x, mesh, [Replicate()], run_check=False)
            for x in inputs
        )

    def _output(self, module: nn.Module, out: DTensor, mesh: DeviceMesh):
        if self.local_output:
            return out.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
        return out

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module,
            device_mesh,
            None,  # every parameter replicated
            # torch's stubs type input_fn as returning None; a forward pre-hook may return
            # the replaced inputs (DTensor's own parallel styles do)
            input_fn=self._input,  # type: ignore[arg-type]
            output_fn=self._output,
        )


def mla_tp_plan(attention: MLAttention) -> dict[str, ParallelStyle]:
    """The plan of one block's `attention` (names relative to the block)."""
    plan: dict[str, ParallelStyle] = {
        "attention.wkv_a": ReplicatedLatent(),
        "attention.kv_norm": ReplicatedLatent(),
        "attention.wkv_b": ColwiseParallel(),
        "attention.wk_rope": ReplicatedLatent(local_output=True),
    }
    if attention.wq is not None:
        plan["attention.wq"] = ColwiseParallel()
    else:
        plan["attention.wq_a"] = ReplicatedLatent()
        plan["attention.q_norm"] = ReplicatedLatent()
        plan["attention.wq_b"] = ColwiseParallel()
    return plan
