"""Profiler events -> op classes, per-phase times and per-op arithmetic intensity.

Op time is *self* time (an op's own duration minus its children's), so summing over all events
counts every microsecond once. On CUDA it is the self device time (the kernels an op launched),
on CPU the self CPU time.

Arithmetic intensity = FLOPs / bytes moved (seed 004, "Arithmetic intensity"). FLOPs come from
the profiler (`with_flops`: matmuls) or are estimated here (attention kernels from their shapes,
one FLOP per output element for elementwise arithmetic, zero for pure data movement). Bytes are
estimated from the recorded input shapes x dtype sizes plus an output of the op's result shape;
they ignore cache reuse (an upper bound on DRAM traffic for small tensors that stay in cache) and
the re-reads a tiled kernel makes (a lower bound for large matmuls): the roofline placement is
an estimate, as every roofline is.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .phases import RANGE_PREFIX

__all__ = ["OpStat", "OpAnalysis", "analyse_events", "op_class", "OP_CLASSES"]

OP_CLASSES = ("attention", "matmul", "elementwise/norm", "communication", "other")

_DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "long": 8,
    "int": 4,
    "short": 2,
    "bool": 1,
    "unsigned char": 1,
    "signed char": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::complex<float>": 8,
}
_MATMUL = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::matmul",
    "aten::linear",
    "aten::addmv",
    "aten::mv",
    "aten::dot",
    "aten::_scaled_mm",
    "aten::convolution",
    "aten::_convolution",
    "aten::mkldnn_convolution",
)
_COMM = (
    "c10d::",
    "gloo:",
    "nccl:",
    "record_param_comms",
    "allreduce",
    "all_reduce",
    "allgather",
    "all_gather",
    "reduce_scatter",
    "_reduce_scatter",
    "all_to_all",
    "alltoall",
    "broadcast",
    "barrier",
    "c10d_functional",
)
_ATTENTION_KERNELS = (
    "scaled_dot_product",
    "flash_attention",
    "efficient_attention",
    "cudnn_attention",
)
# ops that only reshape, alias or allocate: their time is dispatch overhead, not data traffic
_NO_DATA = {
    "aten::view",
    "aten::reshape",
    "aten::transpose",
    "aten::t",
    "aten::permute",
    "aten::expand",
    "aten::as_strided",
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::detach",
    "aten::detach_",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::slice",
    "aten::select",
    "aten::alias",
    "aten::_unsafe_view",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::split",
    "aten::chunk",
    "aten::unbind",
    "aten::lift_fresh",
    "aten::_reshape_alias",
    "aten::contiguous",
    "aten::split_with_sizes",
    "aten::narrow",
    "aten::result_type",
    "aten::is_nonzero",
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::set_",
    "aten::zeros",
    "aten::ones",
    "aten::full",
    "aten::scalar_tensor",
}
# ops that move data without arithmetic (0 FLOPs, AI = 0)
_MOVE = (
    "copy",
    "to_copy",
    "clone",
    "cat",
    "stack",
    "index",
    "embedding",
    "gather",
    "scatter",
    "fill",
    "zero",
    "repeat",
    "masked_fill",
    "where",
    "tril",
    "triu",
    "flip",
    "roll",
    "foreach_copy",
    "constant_pad",
)


def _is_move(name: str) -> bool:
    base = name.removeprefix("aten::").lstrip("_")
    return base == "to" or base.startswith(_MOVE)


def op_class(name: str) -> str:
    """The class of an op by name (attention is decided by context, see `analyse_events`)."""
    low = name.lower()
    if any(k in low for k in _COMM):
        return "communication"
    if any(k in low for k in _ATTENTION_KERNELS):
        return "attention"
    if name in _MATMUL:
        return "matmul"
    if not name.startswith("aten::") or name in _NO_DATA:
        return "other"
    return "elementwise/norm"


def _flatten_shapes(shapes: Any, dtypes: list[str]) -> list[tuple[list[int], str]]:
    """(shape, dtype) of every tensor input, tensor lists flattened; non-tensors dropped."""
    out: list[tuple[list[int], str]] = []
    for i, s in enumerate(shapes or []):
        dt = dtypes[i] if i < len(dtypes) else ""
        if isinstance(s, list) and s and all(isinstance(x, list) for x in s):
            out.extend((x, dt) for x in s)  # a TensorList: every element has the list's dtype
        elif isinstance(s, list) and (s or dt in _DTYPE_BYTES):
            out.append((s, dt))
    return out


def _numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _flops_and_bytes(
    name: str, shapes: Any, dtypes: list[str], profiler_flops: int, default_bytes: int
) -> tuple[float, float]:
    tensors = _flatten_shapes(shapes, dtypes)
    if not tensors:
        return 0.0, 0.0
    size = [_DTYPE_BYTES.get(dt, default_bytes) for _, dt in tensors]
    read = sum(_numel(s) * b for (s, _), b in zip(tensors, size, strict=True))
    dims = [s for s, _ in tensors]
    flops = float(profiler_flops or 0)
    out_elems = max(_numel(s) for s in dims)
    if name in ("aten::mm", "aten::addmm") and len(dims) >= 2:
        a, b = dims[-2], dims[-1]
        if len(a) == 2 and len(b) == 2:
            out_elems = a[0] * b[1]  # (m, k) @ (k, n) -> (m, n)
    elif name in ("aten::bmm", "aten::baddbmm") and len(dims) >= 2:
        a, b = dims[-2], dims[-1]
        if len(a) == 3 and len(b) == 3:
            out_elems = a[0] * a[1] * b[2]  # (b, m, k) @ (b, k, n) -> (b, m, n)
    elif any(k in name for k in _ATTENTION_KERNELS) and len(dims) >= 3 and len(dims[0]) == 4:
        bsz, heads, t, hd = dims[0]
        s = dims[1][-2] if len(dims[1]) == 4 else t
        # QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add; backward kernels do ~2.5x that
        # (dQ, dK, dV, dP plus the recomputed P of flash kernels); causal masking not halved
        # here because the kernels' work on CPU is not halved either.
        flops = flops or 4.0 * bsz * heads * t * s * hd * (2.5 if "backward" in name else 1.0)
        out_elems = bsz * heads * t * hd
    elif not flops and not _is_move(name) and op_class(name) == "elementwise/norm":
        flops = float(out_elems)  # one FLOP per output element: an elementwise estimate
    in_place = name.endswith("_") and not name.endswith("__")
    out_bytes = out_elems * size[0]
    return flops, float(read + (out_bytes if not in_place else _numel(dims[0]) * size[0]))


@dataclass
class OpStat:
    """One op name + input shapes, aggregated over the profiled steps."""

    name: str
    shapes: str
    op_class: str
    compute: bool
    """Ran in the forward/loss/backward/recompute phases (the model's work, not the optimizer)."""
    count: int = 0
    time_s: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def achieved_flops(self) -> float:
        return self.flops / self.time_s if self.time_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shapes": self.shapes,
            "class": self.op_class,
            "compute_phase": self.compute,
            "count": self.count,
            "time_s": self.time_s,
            "flops": self.flops,
            "bytes": self.bytes,
            "intensity": self.intensity,
            "achieved_flops": self.achieved_flops,
        }


@dataclass
class OpAnalysis:
    """Everything `analyse_events` extracts from one profile (times summed over the steps)."""

    phase_s: dict[str, float] = field(default_factory=dict)
    """Durations of the scaletrain::<phase> ranges."""
    class_s: dict[str, float] = field(default_factory=dict)
    """Self op time per class, all phases."""
    compute_class_s: dict[str, float] = field(default_factory=dict)
    """Self op time per class in forward/loss/backward/recompute (the model's own work)."""
    phase_op_s: dict[str, float] = field(default_factory=dict)
    """Self op time per phase (what of a phase's wall time is spent inside ops); ops that
    started outside every phase range are under "outside" (work the phases lost)."""
    phase_overlap_s: float = 0.0
    """Seconds counted by two phase ranges at once (their durations' sum minus their union):
    zero when the phases tile the step without double counting."""
    comm_op_s: dict[str, float] = field(default_factory=dict)
    """Wall seconds of the root collective ops by name (each op's span, summed; the
    calibration's per-collective factor reads them: measure/calibrate.py)."""
    comm_total_s: float = 0.0
    comm_exposed_s: float = 0.0
    """Collective + P2P time the training thread spent inside communication ops."""
    p2p_exposed_s: float = 0.0
    """The point-to-point part of it (pipeline sends/receives: bubble waits show up here)."""
    ops: list[OpStat] = field(default_factory=list)


_COMPUTE_PHASES = ("forward", "loss", "backward", "recompute")


def _intervals(events, name: str, thread: int | None = None) -> list[tuple[float, float]]:
    out = [
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.name == name and (thread is None or e.thread == thread)
    ]
    return sorted(out)


def _inside(iv: list[tuple[float, float]], starts: list[float], t: float) -> bool:
    i = bisect.bisect_right(starts, t) - 1
    return i >= 0 and iv[i][0] <= t <= iv[i][1]


def _phase_of(phase_iv: list[tuple[float, float, str]], starts: list[float], t: float) -> str:
    i = bisect.bisect_right(starts, t) - 1
    if i >= 0 and phase_iv[i][0] <= t <= phase_iv[i][1]:
        return phase_iv[i][2]
    return "outside"


def _union_s(iv: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of (start_us, end_us) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(iv):
        if e > end:
            total += e - max(s, end)
            end = e
    return total / 1e6


def _is_comm_root(e) -> bool:
    p = e.cpu_parent
    while p is not None:
        if op_class(p.name) == "communication":
            return False
        p = p.cpu_parent
    return True


def _phase_ranges(events, res: OpAnalysis) -> list[tuple[float, float, str]]:
    """The scaletrain::<phase> ranges as sorted (start, end, phase); their durations summed
    into `res.phase_s`."""
    phase_iv: list[tuple[float, float, str]] = []
    for e in events:
        if e.name.startswith(RANGE_PREFIX) and e.name != RANGE_PREFIX + "attention":
            phase = e.name[len(RANGE_PREFIX) :]
            phase_iv.append((e.time_range.start, e.time_range.end, phase))
            res.phase_s[phase] = res.phase_s.get(phase, 0.0) + e.time_range.elapsed_us() / 1e6
    phase_iv.sort()
    res.phase_overlap_s = sum(res.phase_s.values()) - _union_s([(a, b) for a, b, _ in phase_iv])
    return phase_iv


def _attention_spans(events) -> Callable[[float], bool]:
    """Whether an op starting at a time ran for attention: forward ops inside an
    attention-core range; backward ops run by an autograd node created by one of those ops
    (matched on the autograd sequence number)."""
    attn_iv = _intervals(events, RANGE_PREFIX + "attention")
    attn_starts = [s for s, _ in attn_iv]
    attn_seq = {
        e.sequence_nr
        for e in events
        if e.sequence_nr >= 0 and _inside(attn_iv, attn_starts, e.time_range.start)
    }
    bwd_iv = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.name.startswith("autograd::engine::evaluate_function") and e.sequence_nr in attn_seq
    )
    bwd_starts = [s for s, _ in bwd_iv]
    return lambda t: _inside(attn_iv, attn_starts, t) or _inside(bwd_iv, bwd_starts, t)


def _add_op_stat(
    stats: dict[tuple[str, str, bool], OpStat],
    e,
    cls: str,
    t: float,
    in_model: bool,
    default_bytes: int,
) -> None:
    """Count one attention/matmul/elementwise event (`t` seconds) into its (name, shapes,
    compute phase) row of `stats`."""
    shapes = e.input_shapes
    key = (e.name, str(shapes), in_model)
    st = stats.get(key)
    if st is None:
        st = stats[key] = OpStat(e.name, str(shapes), cls, in_model)
    fl, by = _flops_and_bytes(
        e.name,
        shapes,
        list(getattr(e, "input_dtypes", []) or []),
        int(e.flops or 0),
        default_bytes,
    )
    if any(op_class(c.name) == "attention" for c in e.cpu_children):
        fl = 0.0  # a composite attention op: its kernel child carries the FLOPs
    st.count += 1
    st.time_s += t
    st.flops += fl
    st.bytes += by


def analyse_events(events, *, device: str = "cpu", default_bytes: int = 4) -> OpAnalysis:
    """Attribute every profiler event to a phase (by start time) and a class (by name and by
    whether it ran inside an attention core, forward or backward)."""
    res = OpAnalysis()
    phase_iv = _phase_ranges(events, res)
    phase_starts = [s for s, _, _ in phase_iv]
    # the training thread is the one that ran the phase ranges
    main_thread = next((e.thread for e in events if e.name.startswith(RANGE_PREFIX)), None)
    in_attention = _attention_spans(events)
    stats: dict[tuple[str, str, bool], OpStat] = {}
    comm_any: list[tuple[float, float]] = []
    comm_main: list[tuple[float, float]] = []
    comm_p2p: list[tuple[float, float]] = []
    class_s: dict[str, float] = defaultdict(float)
    compute_s: dict[str, float] = defaultdict(float)
    phase_op: dict[str, float] = defaultdict(float)
    comm_named: dict[str, float] = defaultdict(float)
    for e in events:
        if e.name.startswith(RANGE_PREFIX) or e.name.startswith("ProfilerStep"):
            continue
        t = (e.self_device_time_total if device == "cuda" else e.self_cpu_time_total) / 1e6
        start = e.time_range.start
        cls = op_class(e.name)
        if cls == "communication":
            if _is_comm_root(e):
                iv = (e.time_range.start, e.time_range.end)
                comm_any.append(iv)
                comm_named[e.name] += (iv[1] - iv[0]) / 1e6
                if e.thread == main_thread:  # the training thread was inside it: exposed
                    comm_main.append(iv)
                    if "send" in e.name or "recv" in e.name:
                        comm_p2p.append(iv)
        elif cls in ("matmul", "elementwise/norm") and in_attention(start):
            cls = "attention"
        phase = _phase_of(phase_iv, phase_starts, start)
        class_s[cls] += t
        phase_op[phase] += t
        if phase in _COMPUTE_PHASES:
            compute_s[cls] += t
        if cls in ("attention", "matmul", "elementwise/norm") and t > 0:
            _add_op_stat(stats, e, cls, t, phase in _COMPUTE_PHASES, default_bytes)
    res.class_s, res.compute_class_s, res.phase_op_s = (
        dict(class_s),
        dict(compute_s),
        dict(phase_op),
    )
    # wall time covered by communication (union: async sends/receives overlap each other)
    res.comm_op_s = dict(comm_named)
    res.comm_total_s = _union_s(comm_any)
    res.comm_exposed_s = _union_s(comm_main)
    res.p2p_exposed_s = _union_s(comm_p2p)
    res.ops = sorted(stats.values(), key=lambda s: -s.time_s)
    return res
