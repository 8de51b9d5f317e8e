"""`scaletrain plan` / `scaletrain explain`: evaluate one layout, or search the best (no torch)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, cast

from scaletrain.cli import _plan_output as _output
from scaletrain.cli._job import (
    ResolvedJob,
    add_job_flags,
    flag_for,
    resolve_from_flags,
    unplanned,
)
from scaletrain.cli._types import check_finite_output, finite_float, finite_json
from scaletrain.cli._verdict import verdict_line
from scaletrain.config import (
    ConfigError,
    Layout,
    check_layout,
    fmt_bytes,
    option_problems,
    split_overrides,
)
from scaletrain.config.choices import PPSchedule, ZeroStage

__all__ = ["add_arguments", "run", "DEGREE_FLAGS"]

DEGREE_FLAGS = ("dp", "zero", "tp", "sp", "pp", "pp_schedule", "pp_virtual", "cp", "ep")
"""Flags that pin the layout: any of them given -> evaluate exactly that layout."""


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    add_job_flags(parser)  # the same flags and defaults as `scaletrain dryrun`
    a = parser.add_argument
    a("--json", action="store_true", help="print the docs/DESIGN.md §4 JSON (a list for searches)")
    a("--top", type=int, default=5, metavar="K", help="layouts shown by a search")
    a("--plot", metavar="FILE.png", help="write the memory breakdown (and pipeline) plot")
    a("--tokens", type=finite_float, metavar="N", help="training tokens for the time/cost line")
    a(
        "--recipe",
        default="scaletrain",
        metavar="NAME",
        help="plan what this framework allocates: scaletrain (default), megatron, deepspeed, "
        "torchtitan, nanotron, nemo (megatron's memory, NeMo's overlapped communication), "
        "llm-foundry, torchtune (bf16 states, LoRA / QLoRA), automodel (NeMo AutoModel: "
        "FSDP2 over bf16 parameters and Adam states, LoRA), and framework versions "
        "deepspeed-0.4 (DeepSpeed 0.4's ZeRO-1 of 2021 with torch 1.x) and "
        "deepspeed-bigscience-2022 (BigScience's 2022 fork), and deepspeed-hf (DeepSpeed around "
        "a Hugging Face GPT-2: its eager kernels); an "
        "unset --zero, --sp, --pp-schedule or --ac takes that framework's documented default "
        "(printed; `explain` cites each source)",
    )
    a(
        "--comm-overlap",
        metavar="LIST",
        help="with --recipe and a pinned layout: communication the run overlaps beyond its "
        "framework's defaults, comma-separated: tp (Transformer Engine userbuffers: Megatron "
        "--tp-comm-overlap, NeMo tp_comm_overlap), pp_p2p, dp_param_gather",
    )
    a(
        "--preflight",
        "--verify",
        dest="preflight",
        action="store_true",
        help="dry-run the best layout under fake tensors (its worst rank) and compare",
    )
    # [hardware] price, efficiency and energy (TOML hardware.*; a flag wins)
    a(
        "--usd-per-gpu-hour",
        type=finite_float,
        metavar="USD",
        help="price per GPU-hour (default: the preset's rough cloud rate)",
    )
    a(
        "--efficiency",
        type=finite_float,
        metavar="F",
        help="achievable fraction of peak matmul FLOP/s (0..1; default: the planner's model)",
    )
    a(
        "--pue",
        type=finite_float,
        metavar="X",
        help="data-centre PUE, energy multiplier (default 1.2)",
    )
    a(
        "--grid-co2",
        type=finite_float,
        metavar="KG",
        help="grid intensity, kg CO2 per kWh (default 0.43)",
    )
    a(
        "--host-watts",
        type=finite_float,
        metavar="W",
        help="host power per node (default 0: GPUs only)",
    )
    a(
        "--storage-gb-per-s",
        type=finite_float,
        metavar="GB/S",
        help="read bandwidth from the data's storage per node, against which explain holds "
        "the input rate (default: the preset's, 4)",
    )
    a(
        "--calibration",
        metavar="FILE.toml",
        help="efficiency constants this device measured in one of its runs (scaletrain verify "
        "RUN --calibrate FILE.toml); the plan says which constants are calibrated, which default",
    )
    a(
        "--sweep",
        metavar="hardware.FIELD=V,...",
        help="plan once per value of one [hardware] figure and tabulate step time, MFU and "
        "the best layout: values in the field's unit or multiples of the device's own "
        "(hardware.intra_node_bw_gb_s=1x,2x,4x; hardware.peak_tflops.bf16=989,1979)",
    )
    # the seeds' textbook memory beside the planner's (planner/napkin/textbook.py)
    a(
        "--convention",
        type=int,
        metavar="BYTES",
        help="also show the seeds' textbook memory: 12, 16, 18 or 20 bytes/param of model + "
        "optimizer state and Korthikanti's activations",
    )
    a(
        "--params",
        type=finite_float,
        metavar="N",
        help="nominal parameter count for --convention (the seeds round, e.g. 7e9)",
    )
    a(
        "--ckpt-every",
        type=int,
        metavar="K",
        help="--convention: keep 1 in K layers' activations (seed 004's GPT-2 walk-through)",
    )


def _positive(args: argparse.Namespace, flag: str) -> None:
    v = getattr(args, flag.replace("-", "_"))
    if v is not None and v < 1:
        raise ConfigError(f"--{flag}", v, "use a positive integer")


def _resolve(args: argparse.Namespace, overrides: list[str], *, search: bool) -> ResolvedJob:
    """The job the flags and `--section.key=value` overrides describe; an error in a value
    given as a flag names the flag, one given as an override its field."""
    return resolve_from_flags(args, overrides, search=search)


def _inputs(args: argparse.Namespace, overrides: list[str] | None = None) -> dict[str, Any]:
    """Merge --config (if any) with the flags and overrides (they win; `resolve_from_flags`);
    unset values as `scaletrain train` would take or derive them (cli/_job.py)."""
    overrides = overrides or []
    for f in (
        "gpus",
        "gpus-per-node",
        "seq-len",
        "global-batch",
        "micro-batch",
        "dp",
        "tp",
        "pp",
        "pp-virtual",
        "cp",
        "ep",
        "top",
    ):
        _positive(args, f)
    if args.tokens is not None and args.tokens <= 0:
        raise ConfigError("--tokens", args.tokens, "give a positive token count such as 1e12")
    _output.check_textbook_flags(args)
    _output.check_plot_path(args.plot)
    from scaletrain.planner.recipes.registry import recipe_named

    recipe_named(args.recipe)  # an unknown recipe: one line with did-you-mean, before any work
    pinned = {f: getattr(args, f) for f in DEGREE_FLAGS if getattr(args, f) is not None}
    res = _resolve(args, overrides, search=True)
    p = res.job.parallel
    # a config (a TOML, or [parallel] overrides: the same fields) that names degrees runs
    # exactly them (ParallelConfig.layout), so plan them
    configured = args.config is not None or "parallel" in res.overrides
    from_config = configured and (p.layout == "manual" or p.names_degrees)
    exact = bool(pinned) or from_config or args.command == "explain"
    if exact:
        res = _resolve(args, overrides, search=False)
    job = res.job
    if from_config:
        # the degrees as the config resolves them; the zero stage, sequence parallelism and
        # schedule only where the file states them (a --recipe fills the others with its
        # framework's defaults, recipes/defaults.py; the default recipe with the job's)
        stated = {
            k: v
            for k, v in (("zero", p.zero), ("sp", p.sp), ("pp_schedule", p.pp_schedule))
            if res.is_given("parallel", k) or args.recipe == "scaletrain"
        }
        pinned = {
            "dp": None if p.dp == -1 else p.dp,
            "tp": p.tp,
            "pp": p.pp,
            "pp_virtual": p.pp_virtual,
            "cp": p.cp,
            "ep": p.ep,
            "dp_replicate": p.dp_replicate,
            **stated,
            **pinned,
        }

    def chosen(section: str, key: str, value: Any) -> Any:
        """A search chooses what the user left unset; an exact layout takes the job's."""
        return value if exact or res.is_given(section, key) else None

    calibration = _calibration(args, job)
    comm_overlap = _comm_overlap(args, exact=exact)
    return {
        "calibration": calibration,
        "model": job.model,
        "hw": job.hardware_spec(),
        "gpus": res.world_size,
        "seq": job.batch.seq_len,
        "gb": job.batch.global_batch,
        "pinned": pinned,
        "exact": exact,
        "micro_batch": chosen("batch", "micro_batch", job.batch.micro_batch),
        "precision": job.precision.dtype,
        "optimizer": job.optim.name,
        "beta1": job.optim.beta1,
        "ac": chosen("memory", "ac", job.memory.ac),
        "ac_given": res.is_given("memory", "ac"),
        "offload": chosen("memory", "offload", job.memory.offload),
        "compile": job.train.compile,
        # as `plan_input_from_job` maps them (fp8 all-gathers only under fp8)
        "fp8_all_gather": job.precision.dtype == "fp8" and job.precision.fp8_all_gather,
        # whose fp8 Linears a run on this hardware converts to (the trainer's rule)
        "fp8_backend": job.precision.fp8_backend_on(job.hardware_spec().device_type),
        "loss_chunk_tokens": job.memory.loss_chunk_tokens,
        "lora": job.lora,
        "overridden": {f"{s}.{k}" for s, kv in res.overrides.items() for k in kv},
        "unplanned": unplanned(res.overrides),
        "derived": res.notes(),
        "recipe": args.recipe,
        "comm_overlap": comm_overlap,
        "efficiency": job.hardware.efficiency,
        "energy": _energy(job),
    }


def _comm_overlap(args: argparse.Namespace, *, exact: bool) -> tuple[str, ...]:
    """--comm-overlap LIST: the families (time.efficiency.STATED_OVERLAPS) a framework run
    overlaps beyond its recipe's defaults (PlanInput.comm_overlap); a foreign recipe and a
    pinned layout only (the search plans the framework's defaults)."""
    text = getattr(args, "comm_overlap", None)
    if text is None:
        return ()
    from scaletrain.config.strict import did_you_mean
    from scaletrain.planner.time.efficiency import STATED_OVERLAPS

    names = [n.strip() for n in text.split(",") if n.strip()]
    known = ", ".join(STATED_OVERLAPS)
    if not names:
        raise ConfigError("--comm-overlap", text, f"name one or more of {known}")
    for n in names:
        if n not in STATED_OVERLAPS:
            raise ConfigError(
                "--comm-overlap", n, f"unknown{did_you_mean(n, STATED_OVERLAPS)}: {known}"
            )
    if args.recipe == "scaletrain":
        raise ConfigError(
            "--comm-overlap",
            text,
            "it describes a framework's run: add --recipe megatron / nemo / ... (scaletrain's "
            "own trainer overlaps what its recipe says)",
        )
    if not exact:
        raise ConfigError(
            "--comm-overlap", text, "pin the layout (--dp/--tp/--pp/...) to plan it with overlap"
        )
    return tuple(dict.fromkeys(names))


def _calibration(args: argparse.Namespace, job: Any) -> Any:
    """--calibration FILE: read and checked against the plan's device, precision, recipe and
    --efficiency before any work (time/calibration.py)."""
    if args.calibration is None:
        return None
    from scaletrain.planner.time.calibration import check_calibration, read_calibration

    cal = read_calibration(args.calibration)
    check_calibration(cal, job.hardware_spec(), job.precision.dtype)
    if args.recipe != "scaletrain":
        raise ConfigError(
            "--calibration",
            args.calibration,
            f"it measured scaletrain's own trainer, not {args.recipe}'s: drop --recipe",
        )
    if job.hardware.efficiency > 0:
        raise ConfigError(
            "--efficiency",
            job.hardware.efficiency,
            "--calibration sets the matmul rate this device measured: drop --efficiency",
        )
    return cal


def _energy(job: Any) -> dict[str, float]:
    """The [hardware] energy inputs of `training_cost` (PUE, grid intensity, host power)."""
    h = job.hardware
    return {
        "pue": h.pue,
        "kg_co2_per_kwh": h.grid_kg_co2_per_kwh,
        "host_watts_per_node": h.host_watts_per_node,
    }


def _exact_layout(inp: dict[str, Any]) -> Layout:
    p, n = inp["pinned"], inp["gpus"]
    tp, pp, cp = p.get("tp") or 1, p.get("pp") or 1, p.get("cp") or 1
    for axis, d in (("tp", tp), ("pp", pp), ("cp", cp)):
        if n % d:
            raise ConfigError(_named(inp, f"parallel.{axis}"), d, f"must divide --gpus={n}")
    dp = p.get("dp")
    if dp is None:
        if n % (tp * pp * cp):
            raise ConfigError("--gpus", n, f"must be a multiple of tp*pp*cp = {tp * pp * cp}")
        dp = n // (tp * pp * cp)
    sched: PPSchedule = p.get("pp_schedule") or "1f1b"
    two = sched in ("interleaved", "dualpipev") and pp > 1
    virtual = p.get("pp_virtual") or (2 if two else 1)
    return Layout(
        dp=dp,
        zero=p.get("zero") or 0,
        tp=tp,
        sp=bool(p.get("sp")),
        pp=pp,
        pp_schedule=sched,
        pp_virtual=virtual,
        cp=cp,
        ep=p.get("ep") or 1,
        dp_replicate=p.get("dp_replicate") or 1,
    )


def _flag(field: str) -> str:
    key = field.split(".")[-1]
    return {
        "parallel": "--dp/--tp/--pp/--cp",
        "name": "--model",
        "global_batch": "--global-batch",
        "seq_len": "--seq-len",
        "pp_schedule": "--pp-schedule",
        "pp_virtual": "--pp-virtual",
        "micro_batch": "--micro-batch",
        "usd_per_gpu_hour": "--usd-per-gpu-hour",
        "grid_kg_co2_per_kwh": "--grid-co2",
        "host_watts_per_node": "--host-watts",
        "storage_gb_per_s": "--storage-gb-per-s",
    }.get(key, f"--{key}")


def _named(inp: dict[str, Any], field: str) -> str:
    """How an error names `field`: as the user gave it, a `--section.key=value` override by its
    field, anything else by its flag; a job field no flag sets (`precision.fp8_all_gather`,
    `model.num_heads`) by its field, which is how a TOML or an override sets it."""
    if field in inp.get("overridden", ()) or ("." in field and flag_for(field) is None):
        return field
    return flag_for(field) or _flag(field)  # the job flag that sets it (--lora-rank)


def _evaluate(inp: dict[str, Any]) -> Any:
    from scaletrain.planner.estimate import estimate
    from scaletrain.planner.recipes.defaults import apply_defaults
    from scaletrain.planner.types import PlanInput

    given = [k for k in ("zero", "sp", "pp_schedule") if inp["pinned"].get(k) is not None]
    # an AC mode left unset is the job's under the default recipe, a framework's default else
    ac_in = inp["ac"] if inp["ac_given"] or inp["recipe"] == "scaletrain" else None
    filled = apply_defaults(inp["recipe"], _exact_layout(inp), ac_in, given)
    layout = filled.layout
    mb = inp["micro_batch"] or 1
    try:
        check_layout(
            layout,
            inp["model"],
            world_size=inp["gpus"],
            global_batch=inp["gb"],
            micro_batch=mb,
            seq_len=inp["seq"],
            trainer_rules=inp["recipe"] == "scaletrain",
        )
    except ConfigError as e:
        raise ConfigError(_named(inp, e.field), e.value, e.fix) from None
    from scaletrain.planner.recipes.memory import recipe_problems

    ac, offload = filled.ac, inp["offload"] or "none"
    problems = recipe_problems(
        inp["recipe"],
        layout,
        ac=ac,
        offload=offload,
        lora=inp["lora"].rank if inp["lora"].enabled else 0,
    )
    if inp["recipe"] == "scaletrain":  # the trainer's option rules, as the search applies them
        problems += option_problems(
            layout,
            offload=offload,
            optimizer=inp["optimizer"],
            precision=inp["precision"],
            fp8_all_gather=inp["fp8_all_gather"],
        )
    if problems:
        first = problems[0]
        raise ConfigError(_named(inp, first.field), first.value, first.fix)
    plan = PlanInput(
        inp["model"],
        inp["hw"],
        inp["gpus"],
        layout,
        inp["seq"],
        inp["gb"],
        mb,
        inp["precision"],
        ac,
        offload,
        compile=inp["compile"],
        efficiency=inp["efficiency"],
        fp8_all_gather=inp["fp8_all_gather"],
        fp8_backend=inp["fp8_backend"],
        loss_chunk_tokens=inp["loss_chunk_tokens"],
        recipe=inp["recipe"],
        optimizer=inp["optimizer"],
        beta1=inp["beta1"],
        assumed=filled.lines,
        calibration=inp["calibration"],
        comm_overlap=inp.get("comm_overlap", ()),
        **_lora_fields(inp["lora"]),
    )
    return estimate(plan)


def _lora_fields(lora: Any) -> dict[str, Any]:
    """The PlanInput fields of a `[lora]` section (none without adapters)."""
    if not lora.enabled:
        return {}
    return {
        "lora_rank": lora.rank,
        "lora_targets": lora.target_names,
        "lora_base": lora.base_dtype,
    }


def _one_layout(
    args: argparse.Namespace, inp: dict[str, Any], lines: list[str], *, explain_mode: bool
) -> list[Any]:
    """The pinned layout's estimate: printed as JSON, or its report (explain: its arithmetic
    and verdict) appended to `lines`."""
    est = _evaluate(inp)
    estimates = [est]
    if args.json:
        print(finite_json(est.to_json(), args.command, args))
    elif explain_mode:
        from scaletrain.planner.output.explain import explain

        lines.append(explain(est, tokens=args.tokens, **inp["energy"]))
        lines.append(
            verdict_line(
                est.memory.reserved,
                inp["hw"],
                what=f"planned reserved (rank {est.memory.rank})",
            )
        )
    else:
        from scaletrain.planner.output.report import render_estimates

        lines.append(render_estimates(estimates))
        if est.plan.assumed:  # `explain` prints each with its source (recipes/defaults.py)
            shown = "; ".join(line.split(" [", 1)[0] for line in est.plan.assumed)
            lines.append(
                f"note: {inp['recipe']} defaults assumed for what was not given: {shown} "
                "(`explain` cites the source of each)"
            )
    return estimates


def _search(inp: dict[str, Any], top_k: int) -> Any:
    """The search's `SearchResult` for the job `inp` describes."""
    from scaletrain.planner.search.layouts import search

    pins = {k: inp[k] for k in ("micro_batch", "ac", "offload") if inp[k] is not None}
    pins.update(inp["pinned"])
    return search(
        inp["model"],
        inp["hw"],
        inp["gpus"],
        seq_len=inp["seq"],
        global_batch=inp["gb"],
        precision=inp["precision"],
        optimizer=inp["optimizer"],
        beta1=inp["beta1"],
        top_k=top_k,
        compile=inp["compile"],
        efficiency=inp["calibration"] or inp["efficiency"],
        recipe=inp["recipe"],
        fp8_all_gather=inp["fp8_all_gather"],
        fp8_backend=inp["fp8_backend"],
        loss_chunk_tokens=inp["loss_chunk_tokens"],
        **_lora_fields(inp["lora"]),
        **pins,
    )


def _searched(args: argparse.Namespace, inp: dict[str, Any], lines: list[str]) -> list[Any]:
    """The search's best layouts: printed as JSON, or its table appended to `lines`."""
    res = _search(inp, args.top)
    estimates = res.top
    if not res.top:
        _nothing_fits(res)
    if not res.top and not res.legal:
        _why_no_recipe_layout(inp)
        raise ConfigError(
            "--gpus",
            inp["gpus"],
            "no legal layout: change --gpus, "
            "--global-batch or --seq-len so the degrees can divide them",
        )
    if args.json:
        from scaletrain.planner.output.report import to_json

        print(finite_json(to_json(res.top), args.command, args))
    else:
        from scaletrain.planner.output.report import render_search

        lines.append(render_search(res))
    return estimates


def _swept(args: argparse.Namespace, inp: dict[str, Any]) -> list[str]:
    """`--sweep`: the job planned once per value of one hardware figure (cli/_sweep.py); the
    best layout of each (or the pinned layout) as a table, or printed as JSON."""
    from scaletrain.config.hardware_toml import with_figure
    from scaletrain.planner.output.sweep import SweepRow, render_sweep, sweep_json

    from ._sweep import parse_sweep

    sweep = parse_sweep(args.sweep, inp["hw"])

    def best(hw: Any) -> Any:
        point = {**inp, "hw": hw}
        if inp["exact"]:
            return _evaluate(point)  # (a layout that does not fit is shown as such)
        top = _search(point, 1).top
        return top[0] if top else None

    base_best = best(inp["hw"])
    rows = [
        SweepRow(p.label, p.value, best(with_figure(inp["hw"], sweep.field, p.value)))
        for p in sweep.points
    ]
    if args.json:
        print(finite_json(sweep_json(sweep.field, sweep.unit, sweep.base, rows), "plan", args))
        return []
    what = "layout" if inp["exact"] else "best layout"
    return [render_sweep(sweep.field, sweep.unit, sweep.base, base_best, rows, what=what)]


def _nothing_fits(res: Any) -> None:
    """A search whose layouts all missed a memory budget: name the budget of the closest miss,
    the GPU's or the host's RAM per node (`hardware.host_memory_gib`, what offload fills)."""
    from scaletrain.planner.types import layout_label

    misses = [f.closest_miss for f in res.families.values() if f.closest_miss is not None]
    if not misses:
        return
    host = [e for e in misses if e.memory.reserved <= e.memory.capacity]
    if host:  # fits the GPU, not the host
        best = min(host, key=lambda e: e.memory.host)
        m = best.memory
        raise ConfigError(
            "--host-memory-gib",
            fmt_bytes(m.host_capacity),
            f"no layout fits the host's RAM: the least needs {fmt_bytes(m.host)} per node "
            f"for what it offloads ({layout_label(best)}); give the node's real RAM, more "
            "GPUs, or offload less",
        )
    best = min(misses, key=lambda e: e.memory.reserved)
    raise ConfigError(
        "--gpus",
        best.plan.num_gpus,
        f"no layout fits: the least needs {fmt_bytes(best.memory.reserved)} > "
        f"{best.plan.hardware.capacity_text()} per GPU ({layout_label(best)}); use more or "
        "larger GPUs, or a shorter --seq-len",
    )


def unplanned_note(fields: list[str]) -> str | None:
    """The one line that says which `--section.key=value` overrides no plan reads
    (`cli._job.unplanned`): they are valid job fields, taken, but change nothing planned."""
    if not fields:
        return None
    return (
        f"note: not planned: {', '.join(fields)} (valid, but the planner's memory and time "
        "model does not read them; `scaletrain train` and `dryrun` do)"
    )


def run(args: argparse.Namespace, extra: list[str]) -> int:
    rest, overrides = split_overrides(extra)
    if rest:
        raise ConfigError("argument", " ".join(rest), "remove it (see --help for the flags)")
    explain_mode = args.command == "explain"
    if args.sweep is not None and explain_mode:
        raise ConfigError(
            "--sweep", args.sweep, "sweeps are tabulated by plan: use scaletrain plan"
        )
    inp = _inputs(args, overrides)
    note = unplanned_note(inp["unplanned"])
    if note and args.json:  # the JSON on stdout stays one document
        print(note, file=sys.stderr)
    lines: list[str] = [] if args.json else [f"note: {n}" for n in inp["derived"]]
    if note and not args.json:
        lines.append(note)
    if inp["hw"].notes and not args.json:
        lines.append(f"note: hardware {inp['hw'].notes}")
    if inp["calibration"] is not None and not args.json:
        from scaletrain.planner.time.calibration import describe_calibration, host_sharing_note

        lines += [
            f"note: {ln}" if k == 0 else ln
            for k, ln in enumerate(describe_calibration(inp["calibration"]))
        ]
        sharing = host_sharing_note(inp["calibration"], min(inp["gpus"], inp["hw"].gpus_per_node))
        if sharing is not None:
            lines.append(f"note: {sharing}")
    if args.sweep is not None:
        for flag in ("plot", "preflight", "convention", "tokens"):
            if getattr(args, flag):
                raise ConfigError(
                    f"--{flag}",
                    getattr(args, flag),
                    "drop it with --sweep (one table per value is all a sweep prints)",
                )
        lines += _swept(args, inp)
        if lines:
            print("\n".join(lines))
        return 0
    unrunnable = _precision_mark(inp)
    if unrunnable and args.json:  # the JSON on stdout stays one document
        print(unrunnable, file=sys.stderr)
    elif unrunnable:
        lines.append(unrunnable)
    if inp["exact"] or explain_mode:
        estimates = _one_layout(args, inp, lines, explain_mode=explain_mode)
    else:
        estimates = _searched(args, inp, lines)
    if estimates and not args.json:
        from scaletrain.planner.output.report import fp8_eager_note

        fp8_note = fp8_eager_note(estimates[0])
        if fp8_note is not None:
            lines.append(fp8_note)
    if args.tokens and estimates and not args.json and not explain_mode:
        lines.append(_output.cost_line(estimates[0], args.tokens, inp["energy"]))
    if args.convention is not None and estimates and not args.json:
        lines.append(_output.textbook(estimates[0], args))
    if lines:
        from scaletrain.planner.output.report import fit_width

        text = fit_width("\n".join(lines))
        check_finite_output(text, args.command, args)
        print(text)
    if args.plot and estimates:
        _output.plots(estimates, args.plot)
    if getattr(args, "preflight", False) and estimates:
        print(_output.preflight(estimates[0]))
    return 0


def _precision_mark(inp: dict[str, Any]) -> str | None:
    """The line that marks a plan the GPU cannot run in its precision (bf16 on a V100, fp8 on
    an A100): planned all the same, so the numbers can be compared, but `train` refuses it.
    The rule is `config.hardware_rules`', the one `train` applies to the device."""
    from scaletrain.config import precision_problem

    hw = inp["hw"]
    why = precision_problem(inp["precision"], hw.arch, hw.name)
    if why is None:
        return None
    return f"UNRUNNABLE: precision.dtype={inp['precision']!r}: {why} (train refuses it)"


def _why_no_recipe_layout(inp: dict[str, Any]) -> None:
    """A search with no legal layout because the recipe's framework cannot run the --ac or
    --offload the user pinned: name that flag (not --gpus, which would send them astray). The
    rules are recipe_problems' own, probed on plain data parallelism at the most sharded ZeRO
    stage the framework runs."""
    from scaletrain.planner.recipes.memory import recipe_problems
    from scaletrain.planner.recipes.registry import recipe_named

    if inp["recipe"] == "scaletrain":
        return
    r = recipe_named(inp["recipe"])
    probe = Layout(dp=inp["gpus"], zero=cast(ZeroStage, max(r.zero_stages)))
    for problem in recipe_problems(
        r,
        probe,
        ac=inp["ac"] or "none",
        offload=inp["offload"] or "none",
        lora=inp["lora"].rank if inp["lora"].enabled else 0,
    ):
        if problem.field.startswith("lora."):  # no layout helps: the recipe has no adapters
            raise ConfigError(_named(inp, problem.field), problem.value, problem.fix)
        if problem.field.startswith("memory."):
            stages = (
                f" ({r.framework} runs ZeRO stages {', '.join(map(str, r.zero_stages))})"
                if problem.field == "memory.offload"
                else ""
            )
            raise ConfigError(_flag(problem.field), problem.value, problem.fix + stages)
