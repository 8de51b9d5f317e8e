"""The bottleneck verdict and what to do about it (seed 004: profile -> classify -> apply the
matching technique -> re-profile; Table 7, the D-A-M bottleneck table, and Table 1, techniques
mapped to the iron law T = O / (R_peak * eta)).

Rules, checked in this order (the first that holds names the bottleneck):
  data-bound           the loader wait + host copy is >= 25% of the step (the accelerator idles)
  pipeline-bound       pp > 1 and the planner's bubble fraction (p-1)/m >= 25%, or exposed
                       point-to-point time (stages waiting on each other) >= 25%
  communication-bound  exposed collective time (the training thread inside a collective) >= 25%
  attention-bound      the attention core is the largest class of forward/backward op time
                       (memory-bound when its time-weighted intensity is under the ridge point)
  memory-bound         >= 50% of forward/backward op time is in ops under the ridge point
  compute-bound        otherwise: the step is spent in ops above the ridge (matmuls)
The 25% / 50% thresholds are ours: a phase that large is where a fix pays first.

Recommendations are checked against the planner (`scaletrain.planner.estimate`) where the
planner models the change; without a planner the advice is given unchecked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from scaletrain.config import fmt_bytes

from .driver import ProfileResult

__all__ = ["Verdict", "Recommendation", "classify", "ridge_point", "memory_bound_share"]

DATA_FRACTION = 0.25
COMM_FRACTION = 0.25
BUBBLE_FRACTION = 0.25
MEMORY_SHARE = 0.5


@dataclass
class Recommendation:
    technique: str
    why: str
    planner: str | None = None
    """What the planner predicts for the change (None: not modelled / planner unavailable)."""


@dataclass
class Verdict:
    kind: str
    """data-bound | communication-bound | pipeline-bound | attention-bound | memory-bound |
    compute-bound"""
    detail: str
    evidence: list[str] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "detail": self.detail,
            "evidence": self.evidence,
            "recommendations": [dataclasses.asdict(r) for r in self.recommendations],
        }


def ridge_point(r: ProfileResult) -> float:
    """FLOP/byte where the roofline bends: peak FLOP/s / memory bandwidth (Williams et al.
    2009). Below it an op is limited by bandwidth, above it by arithmetic."""
    return r.peak_flops / r.memory_bw


def memory_bound_share(
    r: ProfileResult, *, classes: tuple[str, ...] = ("attention", "matmul", "elementwise/norm")
) -> float:
    """Share of those classes' forward/backward op time spent in ops under the ridge point
    (the optimizer's elementwise update is a separate phase, reported on its own)."""
    ridge = ridge_point(r)
    ops = [o for o in r.analysis.ops if o.op_class in classes and o.compute]
    total = sum(o.time_s for o in ops)
    return sum(o.time_s for o in ops if o.intensity < ridge) / total if total else 0.0


def _what_if(r: ProfileResult, **changes: Any) -> Any:
    """The planner's estimate with `changes` applied to this run's PlanInput (None if none)."""
    if r.plan is None:
        return None
    try:
        from scaletrain.planner import estimate

        model_changes = changes.pop("model", None)
        plan = r.plan
        if model_changes:
            plan = dataclasses.replace(plan, model=dataclasses.replace(plan.model, **model_changes))
        return estimate(dataclasses.replace(plan, **changes))
    except Exception:  # an illegal what-if (e.g. batch not divisible) is simply not checked
        return None


def _delta(r: ProfileResult, est: Any) -> str:
    p = r.predicted
    if est is None or p is None:
        return "planner: not modelled"
    act = fmt_bytes(est.memory.activations - p["activations_bytes"], sign=True)
    # throughput, not step time: some changes (bigger batches) change the work per step
    tput = est.tokens_per_s / p["tokens_per_s"] - 1 if p["tokens_per_s"] else 0.0
    fits = "" if est.memory.fits else ", does NOT fit"
    return (
        f"planner predicts activations {act}, tokens/s {tput:+.0%}, "
        f"MFU {p['mfu']:.1%} -> {est.mfu:.1%}{fits}"
    )


def _data(r: ProfileResult) -> list[Recommendation]:
    cfg = r.config.get("data", {})
    data = r.phase_s.get("data", 0.0)
    rest = r.step_s - data
    recs = [
        Recommendation(
            "prefetch batches in the background (--data.prefetch=2 or more)"
            if cfg.get("prefetch", 1) == 0
            else "more loader workers / a faster input pipeline",
            f"the step waits {data * 1e3:,.0f} ms for data; with loading overlapped the step "
            f"approaches max(compute {rest * 1e3:,.0f} ms, load time per step) "
            f"(projected {max(rest, data) * 1e3:,.0f} ms instead of {r.step_s * 1e3:,.0f} ms)",
        )
    ]
    if cfg.get("delay_s", 0.0):
        recs.append(
            Recommendation(
                "remove --data.delay_s",
                f"an artificial {cfg['delay_s']} s delay per batch is configured",
            )
        )
    return recs


def _attention(r: ProfileResult) -> list[Recommendation]:
    backend = r.config.get("model", {}).get("attention", "sdpa")
    if backend == "naive":
        est = _what_if(r, model={"attention": "sdpa"})
        return [
            Recommendation(
                "fused attention: --model.attention=sdpa (flash / memory-efficient kernels)",
                "the naive core materializes (T, T) scores and probabilities in memory and reads "
                "them back (FlashAttention: same FLOPs, far less memory traffic)",
                _delta(r, est),
            )
        ]
    seq = r.config.get("batch", {}).get("seq_len", 0)
    return [
        Recommendation(
            "attention is already fused: shorten sequences or split them across ranks "
            "(context parallelism, --parallel.cp)",
            f"attention cost grows as seq_len^2 (seq_len {seq}); cp=2 needs twice the ranks",
            _delta(
                r,
                _what_if(
                    r, layout=dataclasses.replace(r.plan.layout, cp=2), num_gpus=2 * r.plan.num_gpus
                ),
            )
            if r.plan is not None
            else None,
        )
    ]


def _memory(r: ProfileResult) -> list[Recommendation]:
    recs = [
        Recommendation(
            "operator fusion: --train.compile=true (torch.compile fuses "
            "elementwise and normalization ops)",
            "most op time is in ops under the ridge point: each reads and "
            "writes its tensor once per op",
            _delta(r, _what_if(r, compile=True)),
        )
    ]
    if r.config.get("precision", {}).get("dtype") == "fp32" and r.device == "cuda":
        recs.append(
            Recommendation(
                "reduced precision (--precision.dtype=bf16): half the bytes",
                "memory-bound ops run at bandwidth / bytes per element",
                _delta(r, _what_if(r, precision="bf16")),
            )
        )
    return recs


def _compute(r: ProfileResult) -> list[Recommendation]:
    recs: list[Recommendation] = []
    batch = r.config.get("batch", {})
    mb, gb = batch.get("micro_batch", 1), batch.get("global_batch", 1)
    if r.plan is not None and gb % (2 * mb * r.plan.layout.dp) == 0:
        recs.append(
            Recommendation(
                f"larger micro-batch (--batch.micro_batch={2 * mb})",
                "bigger matmuls run closer to peak and amortize per-op overhead",
                _delta(r, _what_if(r, micro_batch=2 * mb)),
            )
        )
    elif r.plan is not None:
        recs.append(
            Recommendation(
                f"larger micro-batch (--batch.micro_batch={2 * mb} --batch.global_batch={2 * gb})",
                "bigger matmuls run closer to peak and amortize per-step fixed costs",
                _delta(r, _what_if(r, micro_batch=2 * mb, global_batch=2 * gb)),
            )
        )
    dtype = r.config.get("precision", {}).get("dtype", "fp32")
    if dtype == "fp32":
        est = _what_if(r, precision="bf16")
        recs.append(
            Recommendation(
                "lower precision (--precision.dtype=bf16; fp8 on Hopper+)",
                "raises R_peak in the iron law where the hardware has faster low-precision units"
                + (" (the cpu preset has none)" if r.hardware == "cpu" else ""),
                _delta(r, est),
            )
        )
    recs.append(
        Recommendation(
            "better kernels: --train.compile=true, tuned BLAS / cuBLASLt",
            "raises eta in T = O / (R_peak * eta)",
            _delta(r, _what_if(r, compile=True)),
        )
    )
    return recs


def _comm(r: ProfileResult) -> list[Recommendation]:
    return [
        Recommendation(
            "overlap communication with compute (FSDP prefetch, DDP bucketed "
            "all-reduce during backward) and use bigger buckets",
            "the training thread waits inside collectives",
        ),
        Recommendation(
            "a different layout: keep tp inside a node, raise grad accumulation "
            "to amortize gradient sync, or use HSDP across nodes",
            "see `scaletrain plan` with the same model and GPU count",
            _delta(r, _what_if(r, global_batch=2 * r.plan.global_batch))
            if r.plan is not None
            else None,
        ),
    ]


def _pipeline(r: ProfileResult) -> list[Recommendation]:
    if r.plan is None:
        return []
    m = r.plan.grad_accum
    return [
        Recommendation(
            f"more micro-batches per step (m={m} -> {2 * m}) or an interleaved "
            "/ zero-bubble schedule",
            "bubble = (p-1)/m of the compute time",
            _delta(r, _what_if(r, global_batch=2 * r.plan.global_batch)),
        )
    ]


def _extras(r: ProfileResult, v: Verdict) -> Verdict:
    """Secondary findings whatever the verdict: AC recompute and optimizer share."""
    step = r.step_s or 1e-12
    recompute = r.phase_s.get("recompute", 0.0) / step
    ac = r.config.get("memory", {}).get("ac", "none")
    if ac != "none":
        v.evidence.append(
            f"activation-checkpoint recompute {recompute:.0%} of the step "
            f"(memory.ac={ac}; one extra forward costs ~1/3 of fwd+bwd)"
        )
        if recompute >= 0.15:
            cheaper = "selective" if ac == "full" else "none"
            v.recommendations.append(
                Recommendation(
                    f"less recomputation (--memory.ac={cheaper}) if memory allows",
                    f"recompute is {recompute:.0%} of the step",
                    _delta(r, _what_if(r, ac=cheaper)),
                )
            )
    opt = r.phase_s.get("optimizer", 0.0) / step
    if opt >= 0.25:
        v.evidence.append(
            f"optimizer step {opt:.0%} of the step: a fixed cost per step that "
            "larger batches (more tokens per update) amortize"
        )
    return v


def classify(r: ProfileResult) -> Verdict:
    """Name the bottleneck of a profile and list the matching techniques (module docstring)."""
    return _extras(r, _classify(r))


def _classify(r: ProfileResult) -> Verdict:
    step = r.step_s or 1e-12
    a = r.analysis
    data = r.phase_s.get("data", 0.0) / step
    comm = (a.comm_exposed_s - a.p2p_exposed_s) / step
    p2p = a.p2p_exposed_s / step
    bubble = (r.predicted or {}).get("bubble_fraction", 0.0)
    compute = {
        k: v
        for k, v in a.compute_class_s.items()
        if k in ("attention", "matmul", "elementwise/norm")
    }
    total = sum(compute.values()) or 1e-12
    share = {k: v / total for k, v in compute.items()}
    mem = memory_bound_share(r)
    ridge = ridge_point(r)
    evidence = [
        f"data wait {data:.0%} of the step",
        f"exposed collectives {comm:.0%}",
        "forward/backward op time: " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(share.items())),
        f"{mem:.0%} of op time in ops under the ridge point ({ridge:.1f} FLOP/B)",
    ]
    if p2p or bubble:
        evidence.append(
            f"pipeline: exposed P2P {p2p:.0%} of the step, bubble (planner "
            f"formula (p-1)/m) {bubble:.0%} of compute"
        )
    attn = [o for o in a.ops if o.op_class == "attention"]
    attn_t = sum(o.time_s for o in attn)
    attn_ai = (sum(o.intensity * o.time_s for o in attn) / attn_t) if attn_t else 0.0
    if data >= DATA_FRACTION:
        return Verdict(
            "data-bound", f"{data:.0%} of the step waits for the input pipeline", evidence, _data(r)
        )
    if bubble >= BUBBLE_FRACTION or p2p >= COMM_FRACTION:
        return Verdict(
            "pipeline-bound",
            f"stages wait on each other: exposed P2P {p2p:.0%} of "
            f"the step, bubble {bubble:.0%} of compute (planner formula)",
            evidence,
            _pipeline(r),
        )
    if comm >= COMM_FRACTION:
        return Verdict(
            "communication-bound",
            f"{comm:.0%} of the step is exposed collectives",
            evidence,
            _comm(r),
        )
    if share and max(share, key=lambda k: share[k]) == "attention":
        kind = "memory-bound" if attn_ai < ridge else "compute-bound"
        return Verdict(
            "attention-bound",
            f"the attention core takes {share['attention']:.0%} "
            f"of forward/backward op time ({kind}: time-weighted intensity "
            f"{attn_ai:.1f} FLOP/B vs ridge {ridge:.1f})",
            evidence,
            _attention(r),
        )
    if mem >= MEMORY_SHARE:
        return Verdict(
            "memory-bound", f"{mem:.0%} of op time is under the ridge point", evidence, _memory(r)
        )
    return Verdict(
        "compute-bound",
        f"{1 - mem:.0%} of op time is in ops above the ridge point (matmuls)",
        evidence,
        _compute(r),
    )
