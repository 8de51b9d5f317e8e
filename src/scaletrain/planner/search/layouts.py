"""Layout search: enumerate every legal layout of a GPU count, drop those that do not fit, rank the
rest by step time, and say why each strategy family lost.

Legality is `scaletrain.config.layout_problems` (the one set of rules): the enumerator only
proposes degrees that divide the GPU count, and every candidate is checked by `layout_problems`
before it is evaluated. The pick follows the seeds' rule of thumb (plain DP when the model fits;
ZeRO, then TP, PP only when needed): among the layouts within `SIMPLER_LAYOUT_MARGIN` of the
fastest, the simplest (`complexity`) wins, and equal step times go to the simpler layout, then
to the one reserving less memory. Memory first: each candidate's worst-rank memory is computed
on the fast path (`estimate.reserved_and_step`, no dataclasses), a lower bound of its step
time only if it fits (`step_time.step_floor`), the step itself only where the pick can read it
(`_time_where_read`), and full `Estimate` objects only for the layouts reported. Pruning: for
a fixed layout, precision, AC and offload, activation memory grows with the micro-batch, so
once a micro-batch size does not fit the larger ones are skipped (not counted as evaluated);
offload is only tried where the same layout without it does not fit (offload adds host traffic
and saves nothing else).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import gc
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from scaletrain.config import (
    ConfigError,
    HardwareSpec,
    Layout,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    batch_problems,
    grad_accum_steps,
    layout_problems,
    offload_states,
    offloads_activations,
    option_problems,
)
from scaletrain.config.choices import PPSchedule
from scaletrain.config.lora import lora_problems

from ..estimate import Shortcut, plan_step, reserved_and_step
from ..memory.rank_terms import ModelTerms
from ..recipes.memory import recipe_problems
from ..recipes.registry import recipe_named
from ..time.calibration import Calibration
from ..types import Estimate, PlanInput
from .result import FamilyOutcome, SearchResult

__all__ = [
    "search",
    "family_of",
    "complexity",
    "Complexity",
    "rule_order",
    "FAMILIES",
    "SIMPLER_LAYOUT_MARGIN",
]

FAMILIES = ("pure DP", "ZeRO-1/2", "ZeRO-3/FSDP", "TP", "PP", "CP", "EP", "3D", "offload")
PIN_KEYS = (
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "zero",
    "sp",
    "pp_schedule",
    "pp_virtual",
    "micro_batch",
    "ac",
    "offload",
)
OFFLOAD_ORDER = (
    "none",
    "optimizer",
    "activations",
    "optimizer+activations",
    "params",
    "params+activations",
)
"""The offloads tried, plainest first (the search takes the first that fits): the
optimizer's states, then the activations (PCIe traffic every micro-batch), then FSDP2's
parameters. Activation offload only with ac = none (`config.MemoryConfig`)."""
_STATE_PARTS = tuple((o, offload_states(o)) for o in OFFLOAD_ORDER)
"""OFFLOAD_ORDER with each mode's model-state part (`config.offload_states`)."""
LORA_KEYS = ("lora_rank", "lora_targets", "lora_base")
"""PlanInput's LoRA fields, passed to `search` with the pins (a job's, never searched)."""
VIRTUAL_CHOICES = (2, 4)
"""Interleaved chunks per rank the search tries (v = 2 halves the bubble, 4 quarters it; more
chunks add p2p traffic and in-flight memory). Pin --pp-virtual to explore another value."""


_PROBE = Shortcut(memory_only=True)
"""A memory probe (`_search_layout`): no time model."""
_CANDIDATE = Shortcut(floor=True)
"""A candidate: timed by a lower bound of its step (`_Tally.floored`)."""

SIMPLER_LAYOUT_MARGIN = 0.10
"""A more complex layout (`complexity`) is picked over a simpler one only when its planned step is
more than 10% shorter. Why 10%: the planner's step-time error on published runs has a median
of about 12% (benchmarks/results/planner_vs_published.md), so a smaller predicted gain is inside
the model's own error and the ranking of the two is not something it can vouch for; and each
axis a layout adds costs what the step time does not count (more process groups and collectives
to fail or hang, stage balancing, harder debugging), which is why the rule of thumb says 'only
when needed'. A decision threshold, not a fitted constant: no row sets it."""


@dataclass(frozen=True, order=True)
class Complexity:
    """How far a layout is down the seeds' rule of thumb (plain DP when the model fits; ZeRO,
    then TP, PP only when needed): compared field by field in this order, smaller is simpler.
    A pipeline (schedules, stage balance, a bubble) weighs most, then context parallelism (ring
    attention), tensor parallelism (collectives on every layer's critical path), expert
    parallelism, the ZeRO stage (0 plain DP, 1, 2, 3) and offload (ZeRO-Offload's host
    traffic, the last step)."""

    pp: bool
    cp: bool
    tp: bool
    ep: bool
    zero: int
    offload: bool


def complexity(layout: Layout, offload: str = "none") -> Complexity:
    """The rule-of-thumb rank of `layout` (`Complexity`)."""
    return Complexity(
        pp=layout.pp > 1,
        cp=layout.cp > 1,
        tp=layout.tp > 1,
        ep=layout.ep > 1,
        zero=layout.zero,
        offload=offload != "none",
    )


def rule_order(
    fits: list[tuple[float, Complexity, float, int, Any]],
) -> list[tuple[float, Complexity, float, int, Any]]:
    """`fits` (step s, complexity, reserved, order, plan) in the order the pick follows: the
    layouts within SIMPLER_LAYOUT_MARGIN of the fastest, simplest first (then faster, then
    leaner), then the others, fastest first."""
    ranked = sorted(fits, key=lambda t: (not math.isfinite(t[0]), t[0], t[1], t[2], t[3]))
    if not ranked:
        return ranked
    limit = ranked[0][0] * (1 + SIMPLER_LAYOUT_MARGIN)
    inside = [t[0] <= limit for t in ranked]  # a non-finite step is never inside: kept after
    near = sorted((t for t, i in zip(ranked, inside) if i), key=lambda t: (t[1], t[0], t[2], t[3]))
    return near + [t for t, i in zip(ranked, inside) if not i]


def family_of(plan: PlanInput) -> str:
    """The strategy family a layout belongs to (the 'why the others lost' grouping)."""
    return _family(plan.layout, plan.offload)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _pinned(pins: dict[str, Any], key: str, options: list[Any]) -> list[Any]:
    if pins.get(key) is None:
        return options
    return [pins[key]] if pins[key] in options else []


def _degrees(
    model: ModelConfig, n: int, seq_len: int, pins: dict[str, Any]
) -> Iterator[tuple[int, int, int, int]]:
    """(tp, pp, cp, dp) whose product is n; cheap divisibility pre-filter (layout_problems
    re-checks each)."""
    divs = _divisors(n)
    tps = [
        t
        for t in divs
        if model.num_heads % t == 0 and model.num_kv_heads % t == 0 and model.ffn_dim % t == 0
    ]
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


def _schedules(pp: int, num_layers: int, pins: dict[str, Any]) -> list[tuple[PPSchedule, int]]:
    out: list[tuple[PPSchedule, int]]
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


@dataclass(frozen=True)
class _Job:
    """What every candidate of one search shares (the PlanInput fields other than the layout,
    micro-batch, AC and offload)."""

    model: ModelConfig
    hardware: HardwareSpec
    num_gpus: int
    seq_len: int
    global_batch: int
    precision: str
    optimizer: str
    compile: bool
    efficiency: float | Calibration
    pins: dict[str, Any]
    recipe: str = "scaletrain"
    lora: dict[str, Any] = field(default_factory=dict)
    """PlanInput's lora_* fields (empty: no LoRA)."""
    beta1: float = OptimConfig.beta1
    """optim.beta1 (PlanInput.beta1: Adafactor's optional first moment)."""
    fp8_all_gather: bool = False
    """PlanInput.fp8_all_gather (precision.fp8_all_gather under fp8)."""
    loss_chunk_tokens: int = 0
    """PlanInput.loss_chunk_tokens (memory.loss_chunk_tokens; 0: the trainer's rule)."""
    fp8_backend: str = "scaletrain"
    """PlanInput.fp8_backend (precision.fp8_backend resolved for the device)."""

    def first_plan(self, layout: Layout, mb: int, ac: str, offload: str) -> PlanInput:
        """The `PlanInput` of one candidate, built by its constructor (see `plan`)."""
        return PlanInput(
            self.model,
            self.hardware,
            self.num_gpus,
            layout,
            self.seq_len,
            self.global_batch,
            mb,
            self.precision,
            ac,
            offload,
            self.optimizer,
            self.compile,
            self.efficiency if isinstance(self.efficiency, float | int) else 0.0,
            recipe=self.recipe,
            calibration=self.efficiency if isinstance(self.efficiency, Calibration) else None,
            beta1=self.beta1,
            fp8_all_gather=self.fp8_all_gather,
            fp8_backend=self.fp8_backend,
            loss_chunk_tokens=self.loss_chunk_tokens,
            **self.lora,
        )

    @functools.cached_property
    def _plan_fields(self) -> dict[str, Any]:
        """Every field of this job's plans (the four `plan` replaces from a default), and the
        derived values none of those four changes (PlanInput.compute_bytes, .lora)."""
        first = self.first_plan(Layout(), 1, "none", "none")
        fields = {f.name: getattr(first, f.name) for f in dataclasses.fields(PlanInput)}
        return {**fields, "compute_bytes": first.compute_bytes, "lora": first.lora}

    def plan(self, layout: Layout, mb: int, ac: str, offload: str) -> PlanInput:
        """`first_plan`, as a copy of the job's fields with these four replaced: a frozen
        dataclass's __init__ sets its 25 fields one object.__setattr__ at a time (3% of the
        405B search's bytecodes), and PlanInput has no __post_init__ to skip
        (tests/planner/test_search.py holds the two equal). Its derived values (`_derived`,
        read by every rank) are set with it: the job's, and its grad_accum by the same
        function the descriptor would call."""
        plan = object.__new__(PlanInput)
        plan.__dict__.update(
            self._plan_fields,
            layout=layout,
            micro_batch=mb,
            ac=ac,
            offload=offload,
            grad_accum=grad_accum_steps(self.global_batch, mb, layout.dp),
        )
        return plan


@dataclass
class _Tally:
    """Running results as plain numbers; Estimates are built at the end for the kept plans."""

    fits: list[tuple[float, Complexity, float, int, PlanInput]] = field(default_factory=list)
    """(step s to 9 significant digits, complexity, reserved bytes, order, plan): equal step
    times go to the simpler layout, then to the one that reserves less memory (more headroom,
    same speed); `rule_order` ranks them. Order is the index in this list. Until
    `_time_where_read` runs, the fits in `floored` hold a lower bound of their step."""
    floored: dict[int, float] = field(default_factory=dict)
    """order -> the largest parameter count of a rank (what `estimate.plan_step` reads) of
    the fits timed by `step_time.step_floor` so far."""
    miss: dict[str, tuple[float, PlanInput]] = field(default_factory=dict)
    candidates: dict[str, int] = field(default_factory=dict)
    evaluated: int = 0
    legal: int = 0
    refused: dict[str, str] = field(default_factory=dict)
    """family -> the first illegal layout of it and the rule that refused it"""
    terms: ModelTerms | None = None
    """The searched model's memory terms, shared by every layout (`rank_terms.ModelTerms`)."""
    shortcuts: dict[tuple[float, float, bool], Shortcut] = field(default_factory=dict)
    """`_settled`'s shortcuts, by (closest miss, GPU memory, candidate)."""

    def record(self, plan: PlanInput, fam: str, candidate: bool) -> bool:
        """Evaluate `plan` (memory first; time only if it fits and is a candidate, not a
        probe); True if it fits."""
        cap = plan.hardware.memory_bytes
        shortcut = _PROBE if not candidate else _CANDIDATE
        if fam in self.miss:
            # a miss by at least the family's closest changes nothing (below): its worst rank
            # need not be found once one rank misses by that much
            shortcut = self._settled(self.miss[fam][0], cap, candidate)
        reserved, step, max_params = reserved_and_step(plan, terms=self.terms, shortcut=shortcut)
        self.evaluated += 1
        if candidate:
            self.candidates[fam] = self.candidates.get(fam, 0) + 1
        if step == math.inf:
            # (a layout that fits the GPU missed the host's RAM: over 0, a closest miss)
            over = max(0.0, reserved - cap)
            if fam not in self.miss or over < self.miss[fam][0]:
                self.miss[fam] = (over, plan)
            return False
        if candidate:  # (timed by a lower bound: `_time_where_read`)
            key = (float(f"{step:.9g}"), complexity(plan.layout, plan.offload), reserved)
            self.floored[len(self.fits)] = max_params
            self.fits.append((*key, len(self.fits), plan))
        return True

    def _settled(self, closest: float, cap: float, candidate: bool) -> Shortcut:
        """The shortcut of a plan whose family's closest miss is `closest` bytes over `cap`
        (one per value: a family's closest changes a few times a search)."""
        key = (closest, cap, candidate)
        shortcut = self.shortcuts.get(key)
        if shortcut is None:
            shortcut = self.shortcuts[key] = Shortcut(
                memory_only=not candidate,
                settle_at=miss_threshold(cap, closest),
                floor=candidate,
            )
        return shortcut


def miss_threshold(cap: float, closest: float) -> float:
    """The least reserved bytes r (a float) with r > cap and max(0, r - cap) >= closest: a
    plan of a family whose closest miss is `closest` bytes over `cap` that reaches r misses
    by at least as much, which changes nothing (`_Tally.record` keeps a closer miss only).
    One comparison per rank instead of that test (`Shortcut.settle_at`), and the same
    answer: the test only turns true as r grows (r - cap rounds monotonically), so it holds
    from its least float on, found by stepping from cap + closest to the neighbouring floats
    (a step or two: the sum and the difference each round by at most half a unit)."""

    def settles(r: float) -> bool:
        return r > cap and max(0.0, r - cap) >= closest

    r = cap + closest
    while not settles(r):
        r = math.nextafter(r, math.inf)
    while settles(below := math.nextafter(r, -math.inf)):
        r = below
    return r


def _family(layout: Layout, offload: str) -> str:
    """family_of without building a PlanInput: 'offload', else '3D' with two or more of TP,
    PP, CP and EP, else the one it runs, else its ZeRO stage's."""
    if offload != "none":
        return "offload"
    tp, pp, cp, ep = layout.tp > 1, layout.pp > 1, layout.cp > 1, layout.ep > 1
    if tp + pp + cp + ep >= 2:
        return "3D"
    if tp or pp or cp or ep:
        return "TP" if tp else "PP" if pp else "CP" if cp else "EP"
    return _ZERO_FAMILY[layout.zero]


_ZERO_FAMILY = {0: "pure DP", 1: "ZeRO-1/2", 2: "ZeRO-1/2", 3: "ZeRO-3/FSDP"}
"""A layout's family by ZeRO stage, when it runs no other axis (`_family`)."""


def _layouts(job: _Job) -> Iterator[tuple[Layout, list[int], list[str]]]:
    """(layout, candidate micro-batches, offload options) of every proposed layout."""
    model, pins, gb = job.model, job.pins, job.global_batch
    zeros = _pinned(pins, "zero", [0, 1, 2, 3])
    for tp, pp, cp, dp in _degrees(model, job.num_gpus, job.seq_len, pins):
        if gb % dp:
            continue
        mbs = _pinned(pins, "micro_batch", _divisors(gb // dp))
        eps = [1]
        if model.is_moe:
            eps = [e for e in _divisors(model.num_experts) if (dp * cp) % e == 0]
        for ep in _pinned(pins, "ep", eps):
            for sp in _pinned(pins, "sp", [False, True] if tp > 1 else [False]):
                for sched, v in _schedules(pp, model.num_layers, pins):
                    lmbs = mbs
                    if sched == "gpipe" and pins.get("pp_schedule") != "gpipe":
                        # GPipe has 1F1B's bubble and more activations in flight: it is only
                        # a candidate where 1F1B is illegal (fewer micro-batches than stages).
                        lmbs = [b for b in mbs if grad_accum_steps(gb, b, dp) < pp]
                    for zero in zeros:
                        layout = Layout(
                            dp=dp,
                            zero=zero,
                            tp=tp,
                            sp=sp,
                            pp=pp,
                            pp_schedule=sched,
                            pp_virtual=v,
                            cp=cp,
                            ep=ep,
                        )
                        # what the trainer runs (`option_problems`, which reads an offload's
                        # model-state part only: asked once per part); parameter offload is
                        # only tried with ZeRO-3 (ZeRO-2 keeps gathered weights on the GPU)
                        runs: dict[str, bool] = {}
                        offloads = []
                        for o, part in _STATE_PARTS:
                            if part == "params" and zero != 3:
                                continue
                            ok = runs.get(part)
                            if ok is None:
                                problems = option_problems(
                                    layout,
                                    offload=part,
                                    optimizer=job.optimizer,
                                    precision=job.precision,
                                    fp8_all_gather=job.fp8_all_gather,
                                )
                                ok = runs[part] = not problems
                            if ok:
                                offloads.append(o)
                        offloads = _pinned(pins, "offload", offloads)
                        if lmbs and offloads:
                            yield layout, lmbs, offloads


class _Legal:
    """`layout_problems` for one layout: the rules without the batch once, then the batch
    rules once per micro-batch size asked (pruned sizes are never checked)."""

    def __init__(self, job: _Job, layout: Layout, tally: _Tally) -> None:
        self.job, self.layout, self.tally = job, layout, tally
        self.seen: dict[int, bool] = {}
        self.base: bool | None = None

    def __call__(self, mb: int) -> bool:
        ok = self.seen.get(mb)
        if ok is None:
            job = self.job
            if self.base is None:
                own = job.recipe == "scaletrain"
                problems = layout_problems(
                    self.layout,
                    job.model,
                    world_size=job.num_gpus,
                    seq_len=job.seq_len,
                    trainer_rules=own,
                )
                problems += recipe_problems(
                    job.recipe, self.layout, lora=job.lora["lora_rank"] if job.lora else 0
                )
                if job.lora:  # what LoRA runs (tp, pp, ep; NF4's block rules)
                    lora = LoraConfig(
                        rank=job.lora["lora_rank"],
                        targets=",".join(job.lora["lora_targets"]),
                        base_dtype=job.lora["lora_base"],
                    )
                    problems += lora_problems(lora, job.model, self.layout, job.precision)
                self.base = not problems
                if problems:
                    p = problems[0]
                    self.tally.refused.setdefault(
                        _family(self.layout, "none"),
                        f"{self.layout.label()}: {p.field} = {p.value}: {p.fix}",
                    )
            ok = self.seen[mb] = self.base and not batch_problems(
                self.layout, job.global_batch, mb, trainer_rules=job.recipe == "scaletrain"
            )
        return ok


def _scan(
    job: _Job,
    tally: _Tally,
    layout: Layout,
    mbs: list[int],
    legal: _Legal,
    ac: str,
    offloads: list[str],
    start: int,
) -> int:
    """Evaluate the legal micro-batches of mbs[start:] at one AC level; returns the index of
    the first size that fits with no offload option (len(mbs) if all fit): larger ones need
    more memory still."""
    plain = _family(layout, "none")
    # (offload, its family): activation offload only with ac = none, as the trainer refuses
    # it under AC (the checkpoint keeps the inputs on device)
    tried = [
        (off, plain if off == "none" else _family(layout, off))
        for off in offloads
        if ac == "none" or not offloads_activations(off)
    ]
    for i in range(start, len(mbs)):
        if not legal(mbs[i]):
            continue
        tally.legal += 1
        fitted = False
        for off, fam in tried:
            if tally.record(job.plan(layout, mbs[i], ac, off), fam, True):
                fitted = True
                break  # offload only where the plainer option fails
        if not fitted:
            return i
    return len(mbs)


def _search_layout(
    job: _Job, tally: _Tally, layout: Layout, mbs: list[int], offloads: list[str], acs: list[str]
) -> None:
    """Every (micro-batch, AC, offload) of one layout, memory-pruned."""
    legal = _Legal(job, layout, tally)
    first = next((i for i, mb in enumerate(mbs) if legal(mb)), None)
    if first is None:
        return
    # Memory probe: the most frugal variant (smallest micro-batch, the heaviest AC, the most
    # offload). If even it does not fit, no variant of this layout does: record the miss under
    # the layout's own family (not "offload") and skip the rest.
    states_only = [o for o in offloads if not offloads_activations(o)]
    probes = [(acs[-1], states_only[-1])] if states_only else []
    if "none" in acs and offloads_activations(offloads[-1]):
        probes.append(("none", offloads[-1]))  # activation offload can beat full AC
    fam = _family(layout, "none")
    if not any(tally.record(job.plan(layout, mbs[first], a, o), fam, False) for a, o in probes):
        return
    # At equal micro-batch more recompute is only slower: a heavier AC level starts at the
    # first size the lighter level could not fit.
    start = first
    for ac in acs:
        first_miss = _scan(job, tally, layout, mbs, legal, ac, offloads, start)
        if job.pins.get("ac") is None:
            start = first_miss


def _time_where_read(tally: _Tally, top_k: int) -> None:
    """Time, by the full step model (`estimate.plan_step`), the fits whose step the pick can
    read; the others keep the lower bound they were timed by (`step_time.step_floor`).

    What `_result` reads of the fits: the fastest, the layouts within SIMPLER_LAYOUT_MARGIN of
    it (`rule_order`), the top_k in the rule's order and each family's first in it. Walking
    the floored fits by their floor, ascending (a floor is at most its step, also to 9
    digits: rounding is monotonic):
    1. until a floor exceeds the margin of the fastest step so far: then every fit it leaves
       is slower than the margin of the true fastest, so the fastest and all within its
       margin have their steps;
    2. if fewer than top_k are within the margin, until a floor exceeds the step of the
       (top_k - within)-th fastest of the others: the rest rank after it (the rule orders the
       others by step first; an equal floor is timed, as it may tie);
    3. per family with none within the margin, until a floor exceeds the family's fastest step.
    The fits left floored then rank where they cannot be read: after every timed fit a pick
    reads, as their floors exceed its step. A floor and its step are both finite for finite
    hardware figures: the search counts the same fits. The 405B search on 16,384 GPUs times
    about a third of its 9,400 fits so (the others are slower than the margin, mostly
    activation offload, whose PCIe time the floor counts)."""
    fits, floored = tally.fits, tally.floored
    if not floored:
        return

    def time(i: int) -> float:
        floor, cplx, reserved, order, plan = fits[i]
        step = float(f"{plan_step(plan, floored.pop(i), terms=tally.terms):.9g}")
        # (`step_time.step_floor`; a NaN of degenerate figures, e.g. a subnormal efficiency,
        # passes on to the CLI's one-line refusal of non-finite results)
        assert not floor > step, (floor, step, plan.layout)
        fits[i] = (step, cplx, reserved, order, plan)
        return step

    waiting = sorted(floored, key=lambda i: fits[i][0])
    fastest = min((t[0] for i, t in enumerate(fits) if i not in floored), default=math.inf)
    for i in waiting:  # 1.
        if fits[i][0] > fastest * (1 + SIMPLER_LAYOUT_MARGIN):
            break
        fastest = min(fastest, time(i))
    limit = fastest * (1 + SIMPLER_LAYOUT_MARGIN)  # (`rule_order`'s)
    timed = [t for i, t in enumerate(fits) if i not in floored]
    within = {_family(t[4].layout, t[4].offload) for t in timed if t[0] <= limit}
    others = sorted(t[0] for t in timed if t[0] > limit)
    rest = top_k - sum(t[0] <= limit for t in timed)
    waiting = [i for i in waiting if i in floored]
    for i in waiting:  # 2.
        if rest <= 0 or (len(others) >= rest and fits[i][0] > others[rest - 1]):
            break
        bisect.insort(others, time(i))
    best: dict[str, float] = {}
    for t in timed:
        fam = _family(t[4].layout, t[4].offload)
        best[fam] = min(best.get(fam, math.inf), t[0])
    for i in [i for i in waiting if i in floored]:  # 3.
        fam = _family(fits[i][4].layout, fits[i][4].offload)
        if fam in within or fits[i][0] > best.get(fam, math.inf):
            continue
        best[fam] = min(best.get(fam, math.inf), time(i))


def _result(tally: _Tally, model: ModelConfig, top_k: int, t0: float) -> SearchResult:
    """Build Estimates for the kept plans only: the top k, each family's best and closest miss."""
    from ..estimate import estimate

    built: list[tuple[PlanInput, Estimate]] = []  # a few dozen at most: the kept plans

    def est(plan: PlanInput) -> Estimate:
        """The Estimate of a kept plan, built once (a plan can be both top and a family's
        best); matched by identity: two equal plans are the same candidate anyway."""
        for seen, e in built:
            if seen is plan:
                return e
        built.append((plan, estimate(plan, terms=tally.terms)))
        return built[-1][1]

    _time_where_read(tally, top_k)
    ranked = rule_order(tally.fits)
    top = [est(plan) for *_, plan in ranked[:top_k]]
    fastest = min(tally.fits, key=lambda t: (not math.isfinite(t[0]), *t[:4]), default=None)
    families = {f: FamilyOutcome(f, candidates=tally.candidates.get(f, 0)) for f in FAMILIES}
    for *_, plan in ranked:  # a family's best is its first layout in the rule's order
        fam = families.get(_family(plan.layout, plan.offload))
        if fam is not None and fam.best is None:
            fam.best = est(plan)
    for f, (_, plan) in tally.miss.items():
        families[f].closest_miss = est(plan)
    for f, why in tally.refused.items():
        families[f].refusal = why
    if not model.is_moe:
        del families["EP"]
    return SearchResult(
        top,
        families,
        tally.evaluated,
        tally.legal,
        len(tally.fits),
        time.perf_counter() - t0,
        fastest=None if fastest is None else est(fastest[-1]),
        margin=SIMPLER_LAYOUT_MARGIN,
    )


def search(
    model: ModelConfig,
    hardware: HardwareSpec,
    num_gpus: int,
    *,
    seq_len: int,
    global_batch: int,
    precision: str = "bf16",
    top_k: int = 5,
    optimizer: str = "adamw",
    compile: bool = False,
    efficiency: float | Calibration = 0.0,
    recipe: str = "scaletrain",
    **pins: Any,
) -> SearchResult:
    """Every legal layout of `num_gpus` GPUs that fits, ranked by the rule of thumb
    (`rule_order`: within SIMPLER_LAYOUT_MARGIN of the fastest the simplest first, then by
    step time); `best` is the pick, `fastest` the shortest planned step.

    pins: any subset of dp, tp, pp, cp, ep, zero, sp, pp_schedule, pp_virtual, micro_batch, ac,
    offload fixes that option (None = search it). Each candidate's memory is computed first
    (`estimate.reserved_and_step`); its time only if it fits; full Estimates only for the
    layouts returned. recipe: whose allocations to plan (recipes/registry.py); a foreign
    recipe also drops the layouts and AC modes its framework cannot run (`recipe_problems`).
    efficiency: the matmul rate, a fraction of peak (0: the default model), or the
    `Calibration` a run on this hardware measured (`time/calibration.py`).
    pins may also carry the job's LoRA, PlanInput's lora_rank / lora_targets / lora_base
    (fixed, not searched; the layouts LoRA runs: `config.lora.lora_problems`), and its
    optim.beta1 as `beta1` (PlanInput.beta1: Adafactor's first moment), and the job's
    `fp8_all_gather`, `fp8_backend` and `loss_chunk_tokens` (PlanInput's fields of those
    names), the same for every candidate.
    """
    lora = {k: pins.pop(k) for k in LORA_KEYS if k in pins}
    beta1 = float(pins.pop("beta1", OptimConfig.beta1))
    fp8_all_gather = bool(pins.pop("fp8_all_gather", False))
    fp8_backend = str(pins.pop("fp8_backend", "scaletrain"))
    loss_chunk_tokens = int(pins.pop("loss_chunk_tokens", 0))
    with _collector_paused():
        return _search(
            _Job(
                model,
                hardware,
                num_gpus,
                seq_len,
                global_batch,
                precision,
                optimizer,
                compile,
                efficiency,
                pins,
                recipe,
                lora,
                beta1,
                fp8_all_gather,
                loss_chunk_tokens,
                fp8_backend,
            ),
            top_k,
        )


def _search(job: _Job, top_k: int) -> SearchResult:
    """`search` of one job."""
    t0 = time.perf_counter()
    rec = recipe_named(job.recipe)
    for k in job.pins:
        if k not in PIN_KEYS:
            raise ConfigError(f"search.{k}", job.pins[k], f"pin one of {', '.join(PIN_KEYS)}")
    pins, model = job.pins, job.model
    tally = _Tally(terms=ModelTerms(model))
    acs = [a for a in _pinned(pins, "ac", ["none", "selective", "full"]) if a in rec.ac_modes]
    if acs:
        for layout, mbs, offloads in _layouts(job):
            _search_layout(job, tally, layout, mbs, offloads, acs)
    return _result(tally, model, top_k, t0)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """CPython's cyclic garbage collector paused while the search runs (then restored as it
    was). The search allocates millions of short-lived objects that form no reference cycle
    (plans, moments, the pipeline orders it walks) and fills caches holding hundreds of
    thousands more; the collector ran ~2,000 generational passes per 405B search, each full
    one traversing every object alive: 0.6 of its cold CPU-s and 0.1 of its warm ones
    (llama3-405b / 16,384 H100, measured with gc.callbacks). Reference counting still frees
    what the search drops; a cycle made meanwhile waits for the next collection. (`timeit`
    pauses it the same way.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
