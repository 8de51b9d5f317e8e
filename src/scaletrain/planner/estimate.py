"""`estimate(plan) -> Estimate`: memory of the worst rank, step time, tokens/s, MFU; cost napkin.

Pure arithmetic (no torch): the search calls it tens of thousands of times per second.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import HardwareSpec, ModelConfig

from .comm import allreduce_time, axis_link, comm_terms
from .flops import (
    attention_core_flops_per_token,
    flops_per_token,
    head_forward_flops_per_token,
    layer_forward_flops_per_token,
)
from .memory import (
    FRAGMENTATION,
    buffer_terms,
    head_activation_bytes,
    layer_activation_bytes,
    microbatches_in_flight,
    model_state_bytes,
    stage_layer_counts,
)
from .types import Estimate, MemoryBreakdown, PlanInput, TimeBreakdown

__all__ = ["estimate", "bubble_fraction", "default_efficiency", "TrainingCost", "training_cost",
           "napkin_cost", "OPTIMIZER_TRAFFIC", "CPU_OPTIMIZER_BW"]

OPTIMIZER_TRAFFIC = {"adamw": 28.0, "sgd": 20.0, "adamw8bit": 16.0}
"""Bytes read+written per (sharded) parameter by one optimizer step: AdamW reads param, grad, m,
v (4 x 4) and writes param, m, v (3 x 4); SGD-momentum reads 3 and writes 2 fp32 tensors; 8-bit
Adam reads/writes 1-byte moments. Memory-bandwidth bound (arithmetic intensity < 1 FLOP/B)."""

CPU_OPTIMIZER_BW = 50e9
"""Host DRAM bandwidth a CPU optimizer step sees with offload (bytes/s; a 2-socket server)."""

_BASE_EFFICIENCY = {"fp32": 0.6, "bf16": 0.55, "fp16": 0.55, "fp8": 0.45}
_CPU_EFFICIENCY = 0.35

_NOTES = (
    "FLOPs: matmuls only, 2 FLOPs per multiply-add, causal attention halved; MFU uses model "
    "FLOPs (no recompute), compute time uses hardware FLOPs (with recompute).",
    "peak model: total = params + optimizer + buffers + max(forward/backward peak, optimizer-step"
    " peak); grads coexist with all activations when m > 1 or pp > 1, else the backward trades "
    "activations for grads; fields are each term's own peak.",
    "reserved = total + FRAGMENTATION x (total - runtime_context); fits = reserved <= capacity.",
    "pipeline split: layers in pp*v chunks, leftovers to early chunks; embedding on rank 0, head "
    "(a copy if tied) on the last rank; rank = first global rank of the worst stage.",
    "overlap: DP/ZeRO grad reduction hides behind the last backward except one 25 MB bucket; "
    "FSDP gathers hide behind compute; TP, PP p2p and EP all-to-all are exposed; CP ring hides "
    "behind the attention core.",
)


def bubble_fraction(schedule: str, pp: int, m: int, virtual: int = 1) -> float:
    """Pipeline bubble / ideal compute time: GPipe and 1F1B (p-1)/m (Huang et al. 2019;
    Narayanan et al. 2021), interleaved (p-1)/(v*m), zero-bubble ~0 (Qi et al. 2023: the deferred
    weight-gradient passes fill the warm-up/cool-down slots)."""
    if pp <= 1:
        return 0.0
    if schedule == "zero-bubble":
        return 0.0
    if schedule == "interleaved":
        return (pp - 1) / (virtual * m)
    return (pp - 1) / m


def default_efficiency(precision: str, hidden: int, hardware: HardwareSpec) -> float:
    """Achievable fraction of peak matmul FLOP/s: 0.55 for bf16/fp16 large matmuls (Megatron-LM
    and torchtitan report 40-55% MFU on A100/H100), 0.45 fp8 (casts and scaling overhead), 0.6 of
    the tf32 path in fp32, 0.35 on a CPU; scaled by (h/4096)^0.25 below h = 4096 (small GEMMs
    and kernel launches dominate small models). A calibration knob, not a law."""
    if hardware.name == "cpu":
        base = _CPU_EFFICIENCY
    else:
        base = _BASE_EFFICIENCY.get(precision, 0.5)
    return base * min(1.0, (hidden / 4096) ** 0.25)


# ---- per-model constants (cached: the search evaluates one model thousands of times) --------
_CACHE: dict[tuple, tuple] = {}


def _model_consts(model: ModelConfig, seq_len: int, causal: bool, ac: str) -> tuple:
    key = (id(model), model.dim, model.num_layers, model.vocab_size, model.ffn_dim,
           model.num_experts, model.num_kv_heads, seq_len, causal, ac)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is model:
        return hit
    pc = model.param_counts()
    lf = layer_forward_flops_per_token(model, seq_len, causal=causal)
    hf = head_forward_flops_per_token(model)
    core = attention_core_flops_per_token(model, seq_len, causal=causal)
    extra = lf if ac == "full" else (core if ac == "selective" else 0.0)
    layer_hw = 3 * lf + extra  # hardware FLOPs per token per block (with recompute)
    model_fpt = flops_per_token(model, seq_len, causal=causal, recompute="none")
    hit = (model, pc, lf, hf, core, layer_hw, model_fpt)
    if len(_CACHE) > 4096:
        _CACHE.clear()
    _CACHE[key] = hit
    return hit


_ACT_CACHE: dict[tuple, tuple] = {}


def _activation_terms(plan: PlanInput, modern: bool,
                      residual_fp32: bool) -> tuple[float, float, float]:
    """(stored bytes per block, a block's full no-AC set, head bytes) per micro-batch, cached."""
    L, model = plan.layout, plan.model
    key = (id(model), plan.seq_len, plan.micro_batch, L.tp, L.sp, L.cp, plan.ac, plan.precision,
           plan.compile, modern, residual_fp32)
    hit = _ACT_CACHE.get(key)
    if hit is not None and hit[0] is model:  # the stored reference keeps id(model) unique
        return hit[1]
    kw = dict(seq_len=plan.seq_len, micro_batch=plan.micro_batch, tp=L.tp, sp=L.sp, cp=L.cp,
              precision=plan.precision, residual_fp32=residual_fp32)
    per_layer = layer_activation_bytes(model, ac=plan.ac, modern=modern, compile=plan.compile,
                                       **kw)
    full = layer_activation_bytes(model, ac="none", modern=modern, compile=plan.compile, **kw)
    terms = (per_layer, full, head_activation_bytes(model, **kw))
    if len(_ACT_CACHE) > 8192:
        _ACT_CACHE.clear()
    _ACT_CACHE[key] = (model, terms)
    return terms


def _rank_memory(plan: PlanInput, pc, rank: int, layers: int, m: int, convention: str,
                 modern: bool, device: str) -> tuple[float, MemoryBreakdown, float]:
    """Memory of pipeline rank `rank` (returns reserved, breakdown, its parameter count)."""
    L, model = plan.layout, plan.model
    tp, pp, ep = L.tp, L.pp, L.ep
    last = rank == pp - 1
    dense_mlp = 0 if model.is_moe else pc.mlp
    dense = layers * ((pc.attention + dense_mlp) / tp + pc.norms + pc.router)
    expert = layers * pc.mlp / (tp * ep) if model.is_moe else 0.0
    unit = (pc.attention + dense_mlp) / tp + pc.norms + pc.router + (
        pc.mlp / (tp * ep) if model.is_moe else 0.0)
    if rank == 0:
        dense += pc.embedding / tp + pc.position
        unit = max(unit, pc.embedding / tp)
    if last:
        head = pc.head or (pc.embedding if pp > 1 else 0)  # tied head: a copy on the last stage
        dense += pc.final_norm + head / tp
        unit = max(unit, head / tp)
    zs = L.zero_shards
    st = model_state_bytes(dense, precision=plan.precision, optimizer=plan.optimizer,
                           zero=L.zero, zero_shards=zs, offload=plan.offload,
                           convention=convention, expert_params=expert,
                           expert_shards=max(1, zs // ep), unit_params=unit)
    residual_fp32 = plan.precision != "fp32" and L.zero < 3  # autocast on fp32 params
    per_layer, full_layer, head_acts = _activation_terms(plan, modern, residual_fp32)
    in_flight = microbatches_in_flight(L.pp_schedule, pp, m, L.pp_virtual, rank)
    acts = in_flight * layers * per_layer
    one_layer = per_layer
    if plan.ac == "full" and layers:
        one_layer = full_layer  # one block's full set while it is recomputed in backward
        acts += one_layer
    if last:
        acts += head_acts * (m if L.pp_schedule == "gpipe" and pp > 1 else 1)
    tokens = plan.seq_len / L.cp * plan.micro_batch
    bufs = buffer_terms(hidden=model.dim, tokens=tokens, precision=plan.precision, zero=L.zero,
                        dp=L.dp, tp=tp, sp=L.sp, pp=pp, cp=L.cp, ep=ep, kv_dim=model.kv_dim,
                        experts_per_token=model.experts_per_token, unit_params=unit,
                        zero_shards=zs, device=device)
    buffers = sum(bufs.values())
    grads = st["grads"]
    if m > 1 or pp > 1:
        fwdbwd = acts + grads
    else:
        fwdbwd = max(acts + st["grads.in_flight"], grads + one_layer)
    sharded = (dense / zs + expert / max(1, zs // ep)) if L.zero else dense + expert
    # torch's foreach AdamW/SGD allocate an fp32 intermediate per parameter during step().
    step_tmp = 0.0 if plan.offload != "none" else 4.0 * sharded
    step = grads + step_tmp
    total = st["params"] + st["optimizer"] + buffers + max(fwdbwd, step)
    ctx = bufs["runtime_context"]
    reserved = total + FRAGMENTATION * (total - ctx)
    cap = plan.hardware.memory_bytes
    mem = MemoryBreakdown(
        params=st["params"], grads=grads, optimizer=st["optimizer"], activations=acts,
        buffers=buffers, total=total, reserved=reserved, capacity=cap, fits=reserved <= cap,
        rank=rank * L.tp * L.cp * L.dp, buffer_terms=bufs,
        detail={"params.in_flight": st["params.in_flight"],
                "grads.in_flight": st["grads.in_flight"], "offloaded.cpu": st["offloaded"],
                "activations.per_layer": per_layer, "activations.in_flight": in_flight,
                "optimizer_step.temp": step_tmp, "allocator_reserve": reserved - total,
                "params.count": dense + expert})
    return reserved, mem, dense + expert


def estimate(plan: PlanInput, *, convention: str = "scaletrain", modern: bool = True,
             causal: bool = True, gpus_per_node: int | None = None) -> Estimate:
    """Evaluate one layout: worst-rank memory, step time, tokens/s (whole job), MFU.

    convention: model-state byte convention (memory.CONVENTIONS); modern: modern activation
    model (False = Korthikanti's GPT formula); causal: halve causal attention FLOPs.
    """
    L, model, hw = plan.layout, plan.model, plan.hardware
    m = max(1, plan.grad_accum)
    _, pc, _lf, hf, core, layer_hw, model_fpt = _model_consts(model, plan.seq_len, causal,
                                                              plan.ac)
    counts = stage_layer_counts(model.num_layers, L.pp, L.pp_virtual)
    device = "cpu" if hw.name == "cpu" else "gpu"
    ranks = (0,) if L.pp == 1 else (0, L.pp - 1)
    best = None
    for r in ranks:
        res = _rank_memory(plan, pc, r, counts[r], m, convention, modern, device)
        if best is None or res[0] > best[0]:
            best = res
    assert best is not None
    _, mem, _ = best
    # ---- time -----------------------------------------------------------------------------
    peak = hw.flops(plan.precision)
    eff = min(1.0, plan.efficiency) if plan.efficiency > 0 else default_efficiency(
        plan.precision, model.dim, hw)
    rate = peak * eff
    tok_mb = float(plan.seq_len) * plan.micro_batch  # tokens of one micro-batch (one replica)
    split = L.tp * L.cp
    t_first = tok_mb * counts[0] * layer_hw / split / rate
    t_last = tok_mb * (counts[-1] * layer_hw + 3 * hf) / split / rate
    t_mb = max(t_first, t_last)  # the slowest stage paces the pipeline
    compute_s = m * t_mb
    bubble_s = bubble_fraction(L.pp_schedule, L.pp, m, L.pp_virtual) * compute_s
    layers = max(counts)
    stage_params = mem.detail["params.count"]
    terms = comm_terms(layout=L, hardware=hw, stage_params=stage_params, layers=layers,
                       moe_layers=layers if model.is_moe else 0, tokens=tok_mb / L.cp,
                       hidden=model.dim, kv_dim=model.kv_dim,
                       experts_per_token=model.experts_per_token, micro_batches=m,
                       precision=plan.precision, ac=plan.ac, gpus_per_node=gpus_per_node)
    t_fwd = t_mb * _lf / layer_hw  # forward share of the hardware FLOPs
    t_bwd = t_mb - t_fwd
    t_core = tok_mb * layers * 3 * core / split / rate * m
    exposed = _exposed(terms, L, hw, stage_params, m, t_fwd, t_bwd, t_core, layers,
                       gpus_per_node)
    comm_s = {k: v[1] for k, v in terms.items()}
    optimizer_s = _optimizer_time(plan, stage_params)
    step_s = compute_s + bubble_s + exposed + optimizer_s
    tokens_step = float(m * plan.micro_batch * L.dp * plan.seq_len)
    tokens_per_s = tokens_step / step_s if step_s > 0 else 0.0
    mfu = model_fpt * tokens_per_s / (peak * max(1, plan.num_gpus))
    time = TimeBreakdown(step_s=step_s, compute_s=compute_s, comm_exposed_s=exposed,
                         bubble_s=bubble_s, optimizer_s=optimizer_s,
                         comm_total_s=sum(comm_s.values()), comm_terms=comm_s)
    notes = _notes(convention, eff, plan.precision, peak)
    return Estimate(plan=plan, memory=mem, time=time, flops_per_token=model_fpt,
                    tokens_per_s=tokens_per_s, mfu=mfu, notes=notes)


_NOTES_CACHE: dict[tuple, list[str]] = {}


def _notes(convention: str, eff: float, precision: str, peak: float) -> list[str]:
    key = (convention, eff, precision, peak)
    hit = _NOTES_CACHE.get(key)
    if hit is None:
        hit = [f"model states: convention={convention!r}",
               f"efficiency={eff:.3f} of {precision} peak {peak / 1e12:.1f} TFLOP/s", *_NOTES]
        if len(_NOTES_CACHE) > 1024:
            _NOTES_CACHE.clear()
        _NOTES_CACHE[key] = hit
    return list(hit)


def _exposed(terms: dict[str, tuple[float, float]], L, hw: HardwareSpec, stage_params: float,
             m: int, t_fwd: float, t_bwd: float, t_core: float, layers: int,
             gpus_per_node: int | None) -> float:
    """Communication seconds left on the critical path after overlap (rules in _NOTES)."""
    out = 0.0
    bucket = 0.0
    if "dp_allreduce" in terms or "zero_reduce_scatter" in terms or "hsdp_allreduce" in terms:
        bw, lat, _ = axis_link(L, hw, "dp", gpus_per_node)
        n = L.dp * L.cp if L.zero else L.dp
        bucket = allreduce_time(min(25 * 2**20, stage_params * 4), max(n, 2), bw, lat)
    for name, (_, t) in terms.items():
        if name in ("dp_allreduce", "hsdp_allreduce"):
            out += max(t - t_bwd, min(t, bucket))
        elif name == "zero_reduce_scatter":
            window = t_bwd if L.zero == 1 else m * t_bwd
            out += max(t - window, min(t, bucket))
        elif name == "fsdp_all_gather":
            per = t / (2 * m)
            first = per / (layers + 1)  # the first unit's gather has nothing to hide behind
            out += m * max(0.0, per - t_fwd) + first
            out += m * max(0.0, per + terms["fsdp_reduce_scatter"][1] / m - t_bwd)
        elif name == "fsdp_reduce_scatter":
            continue  # charged with the backward all-gather above
        elif name == "cp_ring":
            out += max(0.0, t - t_core)
        else:  # zero_all_gather, tp, pp_p2p, ep_all_to_all: on the critical path
            out += t
    return out


def _optimizer_time(plan: PlanInput, stage_params: float) -> float:
    """Optimizer step seconds: bytes touched / memory bandwidth (GPU), or with offload the PCIe
    round trip of grads and params (4 + 4 B/param over host_to_device_bw) plus the CPU step at
    CPU_OPTIMIZER_BW. Not overlapped with compute (ZeRO-Offload's delayed update is not
    modelled)."""
    L = plan.layout
    local = stage_params / L.zero_shards if L.zero else stage_params
    traffic = OPTIMIZER_TRAFFIC.get(plan.optimizer, 28.0) * local
    if plan.offload != "none":
        return 8.0 * local / plan.hardware.host_to_device_bw + traffic / CPU_OPTIMIZER_BW
    return traffic / plan.hardware.memory_bw


@dataclass
class TrainingCost:
    seconds: float
    gpu_hours: float
    usd: float
    kwh: float
    kg_co2: float

    def to_json(self) -> dict[str, float]:
        return {"seconds": self.seconds, "days": self.seconds / 86400,
                "gpu_hours": self.gpu_hours, "usd": self.usd, "kwh": self.kwh,
                "kg_co2": self.kg_co2}


def napkin_cost(total_flops: float, num_gpus: int, sustained_flops_per_gpu: float, *,
                power_w: float, usd_per_gpu_hour: float = 0.0, pue: float = 1.0,
                host_power_w: float = 0.0, num_hosts: int = 0,
                kg_co2_per_kwh: float = 0.43) -> TrainingCost:
    """Seed 004's "iron law" napkin math: time = FLOPs / (gpus x sustained FLOP/s); energy =
    (gpus x board power + hosts x host power) x time x PUE; CO2 = energy x grid intensity (0.43
    kg/kWh: seed 004's average grid); cost = GPU-hours x price. Ignores idle/restart time,
    networking and storage power, embodied carbon."""
    seconds = total_flops / (num_gpus * sustained_flops_per_gpu)
    hours = seconds / 3600
    kwh = (num_gpus * power_w + num_hosts * host_power_w) * hours * pue / 1000
    return TrainingCost(seconds=seconds, gpu_hours=num_gpus * hours,
                        usd=num_gpus * hours * usd_per_gpu_hour, kwh=kwh,
                        kg_co2=kwh * kg_co2_per_kwh)


def training_cost(est: Estimate, tokens: float, *, usd_per_gpu_hour: float | None = None,
                  pue: float = 1.2, kg_co2_per_kwh: float = 0.43,
                  host_power_w_per_gpu: float = 0.0) -> TrainingCost:
    """Time, GPU-hours, USD, energy and CO2 to train on `tokens` at this estimate's throughput
    (board power x PUE; hosts as a per-GPU surcharge)."""
    p = est.plan
    g = max(1, p.num_gpus)
    sustained = est.flops_per_token * est.tokens_per_s / g  # model FLOP/s per GPU
    price = p.hardware.usd_per_hour if usd_per_gpu_hour is None else usd_per_gpu_hour
    return napkin_cost(est.flops_per_token * tokens, g, sustained, power_w=p.hardware.power_w,
                       usd_per_gpu_hour=price, pue=pue, host_power_w=host_power_w_per_gpu,
                       num_hosts=g, kg_co2_per_kwh=kg_co2_per_kwh)
