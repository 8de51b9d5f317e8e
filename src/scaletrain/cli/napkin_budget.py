"""The reports of `scaletrain napkin`'s budget tools, about throughput, time and money
(tokenizer, deadline, rentbuy, run; their flags: `napkin._budget_tool_flags`): each formula
with the numbers filled in, its source and what it ignores (the formulas: planner/napkin/,
planner/time/cost.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from scaletrain.config import GB, hardware_preset

from .napkin_tools import _model, _n

__all__ = ["BUDGET_REPORTS"]


def _tokenizer(args: argparse.Namespace) -> list[str]:
    from scaletrain.planner.napkin.budget import tokenizer_budget

    step_s = args.step_s or args.global_batch * args.seq_len / args.tokens_per_s
    tb = tokenizer_budget(
        args.global_batch,
        args.seq_len,
        step_s,
        tokens_per_s_per_core=args.tokens_per_s_per_core,
        workers=args.workers,
        h2d_bytes_per_s=args.pcie_gbps * GB,
    )
    r = args.tokens_per_s_per_core
    return [
        f"tokens per step = global batch x seq = {args.global_batch} x {args.seq_len} = "
        f"{tb.tokens_per_step:,}",
        f"   GPUs consume {tb.tokens_per_step:,} / {step_s:.4g} s step = "
        f"{_n(tb.needed_tokens_per_s)} tokens/s",
        f"   one core at {_n(r)} tokens/s: {tb.tokens_per_step:,} / {_n(r)} = "
        f"{1000 * tb.one_core_s:.1f} ms per batch vs the {1000 * step_s:.1f} ms step",
        f"   {args.workers} workers: {1000 * tb.one_core_s:.1f} / {args.workers} = "
        f"{1000 * tb.workers_s:.1f} ms; cores needed = ceil({_n(tb.needed_tokens_per_s)} / "
        f"{_n(r)}) = {tb.cores_needed}",
        f"   utilization = min(1, pipeline / compute rate) = min(1, {args.workers} x "
        f"{_n(r)} / {_n(tb.needed_tokens_per_s)}) = {100 * tb.utilization:.1f}% "
        "(prefetch overlapping the two; seed 004 Eq. 10-11)",
        f"   batch of int64 ids: {tb.tokens_per_step:,} x 8 B = "
        f"{tb.batch_bytes / 1e3:.1f} KB; over {args.pcie_gbps:g} GB/s: "
        f"{1000 * tb.h2d_s:.3f} ms",
        "   source: seed 004 Example 1.1; ignores storage reads, packing/padding, "
        "Python/GIL overhead, worker imbalance",
    ]


def _sustained(args: argparse.Namespace) -> tuple[float, str]:
    hw = hardware_preset(args.gpu)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else hw.flops(args.precision)
    src = "given" if args.peak_tflops else f"{hw.name} datasheet, {args.precision}"
    return peak * args.efficiency, (
        f"peak {peak / 1e12:g} TFLOP/s ({src}) x efficiency "
        f"{args.efficiency:g} = {peak * args.efficiency / 1e12:g} "
        "TFLOP/s"
    )


def _flops(args: argparse.Namespace) -> Any:
    from scaletrain.planner.napkin.budget import train_flops

    params = args.params
    if params is None and args.model is not None:
        params = float(_model(args.model).num_params())
    return train_flops(flops=args.flops, params=params, tokens=args.tokens)


def _deadline(args: argparse.Namespace) -> list[str]:
    from scaletrain.planner.napkin.budget import min_gpus

    f = _flops(args)
    sus, how = _sustained(args)
    one = f.flops / sus
    g = min_gpus(f.flops, sus, args.days)
    return [
        f"training FLOPs C = {f.formula}",
        f"   sustained per GPU = {how}",
        f"   one GPU: C / sustained = {one:.3g} s = {one / 86400 / 365.25:.1f} years",
        f"   GPUs = ceil(C / (sustained x {args.days:g} days x 86400)) = {g:,}",
        f"   with {g:,} GPUs: {one / g / 86400:.1f} days",
        "   source: seed 004 Napkin Math 1.5 (iron law, C = 6ND: Kaplan et al. 2020); "
        "ignores communication growing with the GPU count, restarts, the largest "
        "batch that still converges",
    ]


def _rentbuy(args: argparse.Namespace) -> list[str]:
    from scaletrain.planner.napkin.budget import rent_vs_buy

    f = _flops(args)
    sus, how = _sustained(args)
    hw = hardware_preset(args.gpu)
    price = args.usd_per_gpu_hour if args.usd_per_gpu_hour is not None else hw.usd_per_hour
    hours = f.flops / (sus * args.gpus) / 3600
    kwh = args.gpus * hw.power_w * hours * args.pue / 1000
    rb = rent_vs_buy(
        args.gpus,
        hours,
        usd_per_gpu_hour=price,
        buy_usd_per_gpu=args.buy_usd_per_gpu,
        kwh_per_run=kwh,
        usd_per_kwh=args.usd_per_kwh,
    )
    out = [
        f"training FLOPs C = {f.formula}; sustained per GPU = {how}",
        f"   run time on {args.gpus:,} GPUs = C / ({args.gpus:,} x sustained) = "
        f"{hours:,.1f} h = {hours / 24:.1f} days",
        f"   rent = gpus x hours x $/GPU-hour = {args.gpus:,} x {hours:,.1f} x {price:g} = "
        f"${rb.rent_usd:,.0f} (${rb.rent_usd / 1e6:.2f}M)",
        f"   buy  = gpus x price = {args.gpus:,} x {args.buy_usd_per_gpu:,.0f} = "
        f"${rb.buy_usd:,.0f} (${rb.buy_usd / 1e6:.1f}M)",
    ]
    if args.usd_per_kwh:
        out.append(
            f"   an owner's electricity per run = {args.gpus:,} x {hw.power_w:g} W x "
            f"{hours:,.1f} h x PUE {args.pue:g} x ${args.usd_per_kwh:g}/kWh = "
            f"${rb.energy_usd:,.0f}"
        )
    out += [
        f"   break-even = buy / (rent - owner's electricity) = {rb.runs_to_break_even:.1f} "
        "training runs",
        "   source: seed 004 Napkin Math 1.5; ignores hosts, network, hosting and staff, "
        "depreciation and resale, financing, an owner's idle time",
    ]
    return out


def _run(args: argparse.Namespace) -> list[str]:
    from scaletrain.planner.time.cost import Site, napkin_cost

    f = _flops(args)
    sus, how = _sustained(args)
    hw = hardware_preset(args.gpu)
    price = args.usd_per_gpu_hour if args.usd_per_gpu_hour is not None else hw.usd_per_hour
    nodes = -(-args.gpus // hw.gpus_per_node)
    c = napkin_cost(
        f.flops,
        args.gpus,
        sus,
        site=Site(
            power_w=hw.power_w,
            usd_per_gpu_hour=price,
            pue=args.pue,
            host_power_w=args.host_watts,
            num_hosts=nodes,
            kg_co2_per_kwh=args.grid_co2,
        ),
    )
    hours = c.seconds / 3600
    return [
        f"training FLOPs C = {f.formula}; sustained per GPU = {how}",
        f"   time = C / (gpus x sustained) = {c.seconds:,.0f} s = {hours:,.2f} h = "
        f"{c.seconds / 86400:.2f} days",
        f"   GPU-hours = {c.gpu_hours:,.0f}; cost = GPU-hours x {price:g} $/h = ${c.usd:,.0f}",
        f"   energy = (gpus x board power + nodes x host power) x hours x PUE = "
        f"({args.gpus:,} x {hw.power_w:g} W + {nodes:,} x {args.host_watts:g} W) x "
        f"{hours:,.2f} h x {args.pue:g} = {c.kwh:,.1f} kWh",
        f"     board power {hw.power_w:g} W: the {hw.name} datasheet TDP "
        "(config/hardware.py); nodes = ceil(gpus / gpus per node)",
        f"   CO2 = energy x grid = {c.kwh:,.1f} kWh x {args.grid_co2:g} kg/kWh = "
        f"{c.kg_co2:,.0f} kg ({c.kg_co2 / 1000:.2f} t)",
        "   source: seed 004 Napkin Math 1.11 (energy corollary of the iron law); ignores "
        "idle/restarts, network and storage power, embodied carbon; TDP bounds the draw",
    ]


BUDGET_REPORTS: dict[str, Callable[[argparse.Namespace], list[str]]] = {
    "tokenizer": _tokenizer,
    "deadline": _deadline,
    "rentbuy": _rentbuy,
    "run": _run,
}
"""Budget tool name -> the lines it prints."""
