"""Rank function of the pipeline buffer test (module-level: `spawn` pickles it)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from scaletrain.config import Layout
from scaletrain.parallel import ParallelDims

from ._parity_fns import CONFIGS, SEQ_LEN, _build


def _divisor(m: int):
    """A loss divisor that keeps the mean (the micro-batch count), as a new tensor."""
    return lambda targets, loss: torch.tensor(float(m))


def pp_buffer_peaks(cases: list[tuple[str, int, int]]) -> dict:
    """Per (schedule, virtual, micro-batches): two pipelined steps of tiny-llama-4l on this
    rank's stages; each stage's peak of receive buffers alive at once, the peak of sends
    outstanding (None without a ledger) and the losses."""
    out = {}
    for schedule, virtual, m in cases:
        layout = Layout(pp=dist.get_world_size(), pp_schedule=schedule, pp_virtual=virtual)
        cfg = CONFIGS["tiny-llama-4l"]
        dims = ParallelDims.from_layout(layout, dist.get_world_size(), cfg, seq_len=SEQ_LEN)
        dims.build_mesh("cpu")
        _, runtime = _build("tiny-llama-4l", dims, m, {})
        g = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(2):
            x = torch.randint(0, cfg.vocab_size, (m, SEQ_LEN), generator=g)
            y = torch.randint(0, cfg.vocab_size, (m, SEQ_LEN), generator=g)
            # the trainer's step divides each micro-batch's loss (a new tensor on the last stage)
            losses.append(float(runtime.step(x, y, loss_divisor=_divisor(m))))
        out[(schedule, virtual, m)] = {
            "received": {ps.stage_index: ps.peak_received for ps in runtime._pipeline_stages},
            "sends": None if runtime.sends is None else runtime.sends.peak_pending,
            "losses": losses,
        }
    return out
