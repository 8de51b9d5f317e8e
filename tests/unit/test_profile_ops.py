"""Pieces of `scaletrain profile` without a training run: op classes, FLOPs/bytes estimates
(arithmetic intensity), and the phase clock's hooks including AC recompute detection."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from scaletrain.config import hardware_preset
from scaletrain.profile import analyse_events, op_class
from scaletrain.profile.ops import _flops_and_bytes
from scaletrain.profile.phases import PhaseClock, TimedBatches, install_hooks


@pytest.mark.parametrize(
    "name,cls",
    [
        ("aten::mm", "matmul"),
        ("aten::addmm", "matmul"),
        ("aten::bmm", "matmul"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("aten::native_layer_norm", "elementwise/norm"),
        ("aten::gelu", "elementwise/norm"),
        ("aten::view", "other"),
        ("autograd::engine::evaluate_function: MmBackward0", "other"),
        ("c10d::allreduce_", "communication"),
        ("gloo:all_reduce", "communication"),
    ],
)
def test_op_class(name, cls):
    assert op_class(name) == cls


def test_matmul_intensity_from_shapes():
    m, k, n = 2048, 128, 512
    flops, nbytes = _flops_and_bytes(
        "aten::mm", [[m, k], [k, n]], ["float", "float"], 2 * m * k * n, 4
    )
    assert flops == 2 * m * k * n
    assert nbytes == 4 * (m * k + k * n + m * n)  # read A and B, write C
    ridge = hardware_preset("cpu").flops("fp32") / hardware_preset("cpu").memory_bw
    assert flops / nbytes > ridge  # a big matmul is compute-bound on the roofline


def test_naive_attention_scores_are_memory_bound():
    # (B*nh, T, hd) @ (B*nh, hd, T) -> (B*nh, T, T): the output dominates the bytes
    bh, t, hd = 8, 512, 16
    flops, nbytes = _flops_and_bytes(
        "aten::bmm", [[bh, t, hd], [bh, hd, t]], ["float", "float"], 2 * bh * t * t * hd, 4
    )
    assert nbytes == 4 * (2 * bh * t * hd + bh * t * t)
    ridge = hardware_preset("h100-sxm").flops("fp32") / hardware_preset("h100-sxm").memory_bw
    assert flops / nbytes < ridge


def test_elementwise_estimates():
    flops, nbytes = _flops_and_bytes(
        "aten::add", [[4, 8], [4, 8], []], ["float", "float", "Scalar"], 0, 4
    )
    assert flops == 32 and nbytes == 3 * 32 * 4  # 1 FLOP/element; read 2, write 1
    flops, nbytes = _flops_and_bytes(
        "aten::copy_", [[4, 8], [4, 8], []], ["c10::BFloat16", "float", "Scalar"], 0, 4
    )
    assert flops == 0 and nbytes == 32 * 2 + 32 * 4 + 32 * 2  # in place: written back once


class _Tiny(nn.Module):
    def __init__(self, recompute: bool) -> None:
        super().__init__()
        self.recompute = recompute
        # a multi-module segment: non-reentrant checkpointing may stop its recomputation early
        # (by raising), which the clock must survive
        self.a = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh())
        self.b = nn.Linear(32, 4)

    def forward(self, x):
        h = checkpoint(self.a, x, use_reentrant=False) if self.recompute else self.a(x)
        return self.b(torch.relu(h))


@pytest.mark.parametrize("recompute", [False, True])
def test_phase_clock_tiles_the_step(recompute):
    model = _Tiny(recompute)
    clock = PhaseClock()
    handles = install_hooks([model], clock, pipelined=False)
    batches = TimedBatches(iter([torch.randn(8, 16)] * 2), clock)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            clock.start_step()
            out = model(next(batches))
            out.square().mean().backward()
            clock.switch("optimizer")
            model.zero_grad()
            clock.end_step()
    for h in handles:
        h.remove()
    seen = set(clock.totals)
    assert {"data", "forward", "loss", "backward", "post", "optimizer"} <= seen
    assert ("recompute" in seen) == recompute
    assert not clock.in_backward and clock._recompute_depth == 0 and not clock._module_stack
    a = analyse_events(prof.events())
    # the trace's ranges are the clock's phases, with the same durations: the two clocks read
    # the time a few instructions apart, so they differ by what a preemption between those
    # reads costs (a scheduler slice, up to ~4 ms at HZ=250, seen on a loaded 2-core host with
    # 4 threads: 1.0 ms), not by the phase's length
    assert set(a.phase_s) == seen
    for k, v in clock.totals.items():
        assert a.phase_s[k] == pytest.approx(v, rel=0.05, abs=5e-3)
    assert a.class_s.get("matmul", 0) > 0 and a.compute_class_s.get("matmul", 0) > 0


def test_communication_time_is_a_union_of_intervals():
    from scaletrain.profile.ops import _union_s

    # async sends/receives overlap: covered wall time, not the sum of durations
    assert _union_s([(0, 10), (5, 15), (20, 30)]) == pytest.approx(25e-6)
    assert _union_s([]) == 0.0
