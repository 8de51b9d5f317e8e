"""build_* functions: each takes the narrow config sections it reads and returns one object."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scaletrain.config import ConfigError, HardwareSpec, JobConfig, hardware_preset

__all__ = ["DistEnv", "init_distributed", "detect_hardware", "resolve_device"]


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(pref: str, local_rank: int) -> torch.device:
    if pref == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device", pref, "no CUDA device is visible: use 'cpu' or 'auto'")
    if pref == "cpu" or (pref == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def init_distributed(*, device_pref: str) -> DistEnv:
    """Join the torchrun/spawn process group if one is described by the environment.

    gloo on CPU, NCCL on GPU. A plain `python` run is world size 1 with no process group: the
    parallel code treats every degree-1 axis as a no-op.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_pref, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


_GPU_NAMES = (("H200", "h200"), ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"),
              ("B200", "b200"), ("A100-SXM4-40GB", "a100-40gb"), ("A100", "a100-80gb"),
              ("V100", "v100-32gb"), ("4090", "rtx4090"), ("3090", "rtx3090"),
              ("MI300X", "mi300x"))


def detect_hardware(job: JobConfig, device: torch.device) -> HardwareSpec:
    """The hardware preset for MFU: the configured one, or the visible GPU's, or 'cpu'."""
    if job.hardware.gpu != "cpu" or device.type != "cuda":
        return job.hardware.spec()
    name = torch.cuda.get_device_name(device)
    for key, preset in _GPU_NAMES:
        if key in name:
            return hardware_preset(preset)
    return job.hardware.spec()
