"""Layout search: enumerate every legal layout of a GPU count, drop those that do not fit, rank the
rest by step time, and say why each strategy family lost.

Legality is `scaletrain.config.layout_problems` (the one set of rules): the enumerator only
proposes degrees that divide the GPU count, and every candidate is checked by `layout_problems`
before it is evaluated. Pruning (memory first): for a fixed layout, precision, AC and offload,
activation memory grows with the micro-batch, so once a micro-batch size does not fit the larger
ones are skipped (not counted as evaluated); offload is only tried where the same layout without
it does not fit (offload adds host traffic and saves nothing else).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from scaletrain.config import GB, ConfigError, HardwareSpec, Layout, ModelConfig, layout_problems

from .types import Estimate, PlanInput

__all__ = ["search", "SearchResult", "FamilyOutcome", "family_of", "FAMILIES",
           "default_estimate"]

EstimateFn = Callable[[PlanInput], Estimate]

FAMILIES = ("pure DP", "ZeRO-1/2", "ZeRO-3/FSDP", "TP", "PP", "CP", "EP", "3D", "offload")
PIN_KEYS = ("dp", "tp", "pp", "cp", "ep", "zero", "sp", "pp_schedule", "pp_virtual",
            "micro_batch", "ac", "offload")
VIRTUAL_CHOICES = (2, 4)
"""Interleaved chunks per rank the search tries (v = 2 halves the bubble, 4 quarters it; more
chunks add p2p traffic and in-flight memory). Pin --pp-virtual to explore another value."""


def default_estimate() -> EstimateFn:
    """The planner core's `estimate` (imported lazily: the core may land after this module)."""
    from .estimate import estimate  # type: ignore[import-not-found,unused-ignore]
    return estimate  # type: ignore[no-any-return]


def family_of(plan: PlanInput) -> str:
    """The strategy family a layout belongs to (the 'why the others lost' grouping)."""
    L = plan.layout
    if plan.offload != "none":
        return "offload"
    axes = [n for n, d in (("TP", L.tp), ("PP", L.pp), ("CP", L.cp), ("EP", L.ep)) if d > 1]
    if len(axes) >= 2:
        return "3D"
    if axes:
        return axes[0]
    return {0: "pure DP", 1: "ZeRO-1/2", 2: "ZeRO-1/2", 3: "ZeRO-3/FSDP"}[L.zero]


def layout_of(e: Estimate) -> str:
    from .report import layout_label

    return layout_label(e)


@dataclass
class FamilyOutcome:
    family: str
    best: Estimate | None = None
    """The family's fastest layout that fits (None when none fits)."""
    closest_miss: Estimate | None = None
    """The family's layout that missed the memory budget by the least."""
    candidates: int = 0

    def reason(self, winner: Estimate | None) -> str:
        if self.best is not None and winner is not None:
            if self.best is winner:
                return "winner"
            slow = self.best.time.step_s / winner.time.step_s
            return (f"best member {self.best.time.step_s:.3f} s/step vs "
                    f"{winner.time.step_s:.3f} s ({slow:.2f}x slower)")
        if self.closest_miss is not None:
            mem = self.closest_miss.memory
            return (f"never fits: best needs {mem.reserved / GB:.1f} GB > "
                    f"{mem.capacity / GB:.1f} GB (rank {mem.rank}, {layout_of(self.closest_miss)})")
        if self.family == "offload" and winner is not None:
            return "not needed: layouts fit without offload (it only adds host traffic)"
        return "no legal layout of this family for this GPU count"


@dataclass
class SearchResult:
    top: list[Estimate]
    """Fitting layouts, fastest first (at most top_k)."""
    families: dict[str, FamilyOutcome]
    evaluated: int
    """Layouts whose estimate was computed (pruned ones not counted)."""
    legal: int
    """Candidates that passed layout_problems."""
    fitting: int
    elapsed_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> Estimate | None:
        return self.top[0] if self.top else None

    def why_others_lost(self) -> dict[str, str]:
        return {f: o.reason(self.best) for f, o in self.families.items()
                if o.best is not self.best or self.best is None}


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _pinned(pins: dict[str, Any], key: str, options: list[Any]) -> list[Any]:
    if pins.get(key) is None:
        return options
    return [pins[key]] if pins[key] in options else []


def _degrees(model: ModelConfig, n: int, seq_len: int, pins: dict[str, Any]
             ) -> Iterator[tuple[int, int, int, int]]:
    """(tp, pp, cp, dp) whose product is n; cheap divisibility pre-filter (layout_problems
    re-checks each)."""
    divs = _divisors(n)
    tps = [t for t in divs if model.num_heads % t == 0 and model.num_kv_heads % t == 0
           and model.ffn_dim % t == 0]
    pps = [p for p in divs if p <= model.num_layers]
    cps = [c for c in divs if c == 1 or seq_len % (2 * c) == 0]
    for tp in _pinned(pins, "tp", tps):
        for pp in _pinned(pins, "pp", pps):
            for cp in _pinned(pins, "cp", cps):
                if n % (tp * pp * cp):
                    continue
                dp = n // (tp * pp * cp)
                if pins.get("dp") is not None and pins["dp"] != dp:
                    continue
                yield tp, pp, cp, dp


def _schedules(pp: int, num_layers: int, pins: dict[str, Any]) -> list[tuple[str, int]]:
    if pp == 1:
        out = [("1f1b", 1)]
    else:
        out = [("gpipe", 1), ("1f1b", 1), ("zero-bubble", 1)]
        vs = (pins["pp_virtual"],) if pins.get("pp_virtual") else VIRTUAL_CHOICES
        out += [("interleaved", v) for v in vs if v >= 2 and pp * v <= num_layers]
    if pins.get("pp_schedule") is not None:
        out = [s for s in out if s[0] == pins["pp_schedule"]]
        if pp == 1 and not out:
            out = [(pins["pp_schedule"], 1)]
    if pins.get("pp_virtual") is not None:
        out = [s for s in out if s[1] == pins["pp_virtual"]]
    return out


def _plain(plan: PlanInput) -> PlanInput:
    # A probe's miss belongs to the family of its layout, not to "offload".
    return dataclasses.replace(plan, offload="none")


def _miss(fam: FamilyOutcome, e: Estimate) -> None:
    miss = fam.closest_miss
    over = e.memory.reserved - e.memory.capacity
    if miss is None or over < miss.memory.reserved - miss.memory.capacity:
        fam.closest_miss = e


def search(model: ModelConfig, hardware: HardwareSpec, num_gpus: int, *, seq_len: int,
           global_batch: int, precision: str = "bf16", top_k: int = 5,
           optimizer: str = "adamw", compile: bool = False, efficiency: float = 0.0,
           estimate_fn: EstimateFn | None = None, **pins: Any) -> SearchResult:
    """Every legal layout of `num_gpus` GPUs, ranked by step time (fitting ones only).

    pins: any subset of dp, tp, pp, cp, ep, zero, sp, pp_schedule, pp_virtual, micro_batch, ac,
    offload fixes that option (None = search it).
    """
    for k in pins:
        if k not in PIN_KEYS:
            raise ConfigError(f"search.{k}", pins[k], f"pin one of {', '.join(PIN_KEYS)}")
    est = estimate_fn or default_estimate()
    t0 = time.perf_counter()
    families = {f: FamilyOutcome(f) for f in FAMILIES}
    fits: list[Estimate] = []
    evaluated = legal = 0
    acs = _pinned(pins, "ac", ["none", "selective", "full"])
    zeros = _pinned(pins, "zero", [0, 1, 2, 3])
    for tp, pp, cp, dp in _degrees(model, num_gpus, seq_len, pins):
        if global_batch % dp:
            continue
        mbs = _pinned(pins, "micro_batch", _divisors(global_batch // dp))
        eps = [1]
        if model.is_moe:
            eps = [e for e in _divisors(model.num_experts) if (dp * cp) % e == 0]
        for ep in _pinned(pins, "ep", eps):
            for sp in _pinned(pins, "sp", [False, True] if tp > 1 else [False]):
                for sched, v in _schedules(pp, model.num_layers, pins):
                    for zero in zeros:
                        layout = Layout(dp=dp, zero=zero, tp=tp, sp=sp, pp=pp,
                                        pp_schedule=sched, pp_virtual=v, cp=cp, ep=ep)
                        offloads = ["none", "optimizer"] + (["params"] if zero == 3 else [])
                        offloads = _pinned(pins, "offload", offloads)
                        lmbs = mbs
                        if sched == "gpipe" and pins.get("pp_schedule") != "gpipe":
                            # GPipe has 1F1B's bubble and more activations in flight: it is
                            # only a candidate where 1F1B is illegal (fewer micro-batches
                            # than stages).
                            lmbs = [b for b in mbs if global_batch // (b * dp) < pp]
                        if not lmbs or not offloads or not acs:
                            continue
                        # Memory probe: the most frugal variant (smallest micro-batch, the
                        # heaviest AC, the most offload). If even it does not fit, no variant
                        # of this layout does: record the miss, skip the rest.
                        probe = PlanInput(model, hardware, num_gpus, layout, seq_len,
                                          global_batch, lmbs[0], precision, acs[-1], offloads[-1],
                                          optimizer, compile, efficiency)
                        if not layout_problems(layout, model, world_size=num_gpus,
                                               global_batch=global_batch, micro_batch=lmbs[0],
                                               seq_len=seq_len):
                            e = est(probe)
                            evaluated += 1
                            if not e.memory.fits:
                                _miss(families[family_of(_plain(probe))], e)
                                continue
                        # At equal micro-batch more recompute is only slower: a heavier AC
                        # level starts at the first size the lighter level could not fit.
                        start = 0
                        for ac in acs:
                            first_miss = len(lmbs)
                            for i in range(start, len(lmbs)):
                                mb = lmbs[i]
                                if layout_problems(layout, model, world_size=num_gpus,
                                                   global_batch=global_batch, micro_batch=mb,
                                                   seq_len=seq_len):
                                    continue
                                legal += 1
                                any_fit = False
                                for off in offloads:
                                    plan = PlanInput(model, hardware, num_gpus, layout, seq_len,
                                                     global_batch, mb, precision, ac, off,
                                                     optimizer, compile, efficiency)
                                    e = est(plan)
                                    evaluated += 1
                                    fam = families[family_of(plan)]
                                    fam.candidates += 1
                                    if e.memory.fits:
                                        fits.append(e)
                                        if fam.best is None or e.time.step_s < fam.best.time.step_s:
                                            fam.best = e
                                        any_fit = True
                                        break  # offload only where the plainer option fails
                                    _miss(fam, e)
                                if not any_fit:
                                    first_miss = i
                                    break  # larger micro-batches need more memory still
                            if pins.get("ac") is None:
                                start = first_miss
    if not model.is_moe:
        del families["EP"]
    fits.sort(key=lambda e: e.time.step_s)
    return SearchResult(fits[:top_k], families, evaluated, legal, len(fits),
                        time.perf_counter() - t0)
