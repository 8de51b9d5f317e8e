"""Training time, GPU-hours, cost, energy and CO2 from an estimate or from napkin FLOPs."""

from __future__ import annotations

from dataclasses import dataclass

from ..types import Estimate

__all__ = ["TrainingCost", "Site", "napkin_cost", "training_cost", "num_nodes"]


@dataclass
class TrainingCost:
    seconds: float
    gpu_hours: float
    usd: float
    kwh: float
    kg_co2: float

    def to_json(self) -> dict[str, float]:
        return {
            "seconds": self.seconds,
            "days": self.seconds / 86400,
            "gpu_hours": self.gpu_hours,
            "usd": self.usd,
            "kwh": self.kwh,
            "kg_co2": self.kg_co2,
        }


@dataclass(kw_only=True, slots=True, frozen=True)
class Site:
    """Where the GPUs run: power, price, hosts beside them, grid (`napkin_cost`)."""

    power_w: float
    """Board power of one GPU (W)."""
    usd_per_gpu_hour: float = 0.0
    pue: float = 1.0
    """Power usage effectiveness: facility energy / IT energy."""
    host_power_w: float = 0.0
    """Power of one host beside its GPUs (W)."""
    num_hosts: int = 0
    kg_co2_per_kwh: float = 0.43
    """Grid intensity (seed 004's average grid)."""


def napkin_cost(
    total_flops: float, num_gpus: int, sustained_flops_per_gpu: float, *, site: Site
) -> TrainingCost:
    """Seed 004's "iron law" napkin math: time = FLOPs / (gpus x sustained FLOP/s); energy =
    (gpus x board power + hosts x host power) x time x PUE; CO2 = energy x grid intensity (0.43
    kg/kWh: seed 004's average grid); cost = GPU-hours x price. Ignores idle/restart time,
    networking and storage power, embodied carbon."""
    seconds = total_flops / (num_gpus * sustained_flops_per_gpu)
    hours = seconds / 3600
    watts = num_gpus * site.power_w + site.num_hosts * site.host_power_w
    kwh = watts * hours * site.pue / 1000
    return TrainingCost(
        seconds=seconds,
        gpu_hours=num_gpus * hours,
        usd=num_gpus * hours * site.usd_per_gpu_hour,
        kwh=kwh,
        kg_co2=kwh * site.kg_co2_per_kwh,
    )


def training_cost(
    est: Estimate,
    tokens: float,
    *,
    usd_per_gpu_hour: float | None = None,
    pue: float = 1.2,
    kg_co2_per_kwh: float = 0.43,
    host_watts_per_node: float = 0.0,
) -> TrainingCost:
    """Time, GPU-hours, USD, energy and CO2 to train on `tokens` at this estimate's throughput:
    energy = (gpus x board power + nodes x host power) x hours x PUE (`napkin_cost`); the price
    is the hardware spec's (the [hardware] usd_per_gpu_hour override lands there)."""
    p = est.plan
    g = max(1, p.num_gpus)
    sustained = est.flops_per_token * est.tokens_per_s / g  # model FLOP/s per GPU
    price = p.hardware.usd_per_hour if usd_per_gpu_hour is None else usd_per_gpu_hour
    return napkin_cost(
        est.flops_per_token * tokens,
        g,
        sustained,
        site=Site(
            power_w=p.hardware.power_w,
            usd_per_gpu_hour=price,
            pue=pue,
            host_power_w=host_watts_per_node,
            num_hosts=num_nodes(est),
            kg_co2_per_kwh=kg_co2_per_kwh,
        ),
    )


def num_nodes(est: Estimate) -> int:
    """Nodes the job occupies: ceil(gpus / gpus per node)."""
    per = max(1, est.plan.hardware.gpus_per_node)
    return -(-max(1, est.plan.num_gpus) // per)
