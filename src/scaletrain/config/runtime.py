"""How a run is driven, as typed sections of `JobConfig`: steps and logging (`train`), the
loss-spike guard (`guard`), checkpoints (`checkpoint`) and the hardware it runs on or is
priced for (`hardware`). Each validates itself on construction.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import ConfigError, require
from .choices import Device, check_choices
from .hardware import HardwareSpec
from .hardware_toml import FIGURES, describe_hardware, figure_unit
from .hub import local_path

__all__ = ["TrainConfig", "GuardConfig", "CheckpointConfig", "HardwareConfig"]


@dataclass
class TrainConfig:
    steps: int = 800
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = 0
    device: Device = "auto"
    """'auto' (cuda if available), 'cpu' or 'cuda'."""
    compile: bool = False
    run_dir: str = "runs/default"
    sample_tokens: int = 200
    """Length of the text sample generated at the end (0 = none)."""
    progress: bool = True
    """Live progress bar (rich) on rank 0, and (stderr, every 5 s) the ingestion progress
    line while a large corpus is tokenized."""
    tensorboard: bool = True
    force: bool = False
    """Train a single process even when the planner's peak exceeds the free host/GPU memory
    (`scaletrain train` refuses it before allocating otherwise: orchestrate.fit_check)."""
    rendezvous_timeout_s: float = 300.0
    """Seconds a rank waits for all WORLD_SIZE ranks to arrive before a one-line error."""

    def __post_init__(self) -> None:
        require(self.steps >= 1, "train.steps", self.steps, "use a positive integer")
        for f in ("log_every", "eval_every", "eval_batches"):
            v = getattr(self, f)
            require(v >= 1, f"train.{f}", v, "use a positive integer")
        require(
            self.eval_batches <= 10_000,
            "train.eval_batches",
            self.eval_batches,
            "use at most 10000 (validation batches are held in memory for the whole run)",
        )
        require(self.sample_tokens >= 0, "train.sample_tokens", self.sample_tokens, "use >= 0")
        check_choices(self, "train")  # device
        require(
            0 < self.rendezvous_timeout_s <= 86_400,
            "train.rendezvous_timeout_s",
            self.rendezvous_timeout_s,
            "use seconds in (0, 86400]",
        )
        require(
            bool(self.run_dir.strip()),
            "train.run_dir",
            self.run_dir,
            "give a directory such as runs/default (empty would write into the current one)",
        )


@dataclass
class GuardConfig:
    """Loss-spike guard (PaLM recipe): roll back to the last good checkpoint, skip the data."""

    enabled: bool = True
    window: int = 50
    """Recent applied steps whose median/MAD define 'normal'."""
    min_history: int = 20
    """Steps of history before spikes are judged (non-finite values are judged always)."""
    threshold: float = 6.0
    """Robust z-score above which a loss is a spike."""
    min_increase: float = 0.2
    """...and it must also exceed the median by this fraction."""
    skip_steps: int = 200
    """Optimizer steps of data skipped past the spike after a rollback (PaLM: 200-500 batches)."""
    max_rollbacks: int = 3

    def __post_init__(self) -> None:
        for f in ("window", "min_history", "max_rollbacks"):
            v = getattr(self, f)
            require(v >= 1, f"guard.{f}", v, "use a positive integer")
        require(
            self.min_history <= self.window,
            "guard.min_history",
            self.min_history,
            f"must not exceed guard.window={self.window}",
        )
        require(self.threshold > 0, "guard.threshold", self.threshold, "use a positive float")
        require(self.min_increase >= 0, "guard.min_increase", self.min_increase, "use >= 0")
        require(self.skip_steps >= 0, "guard.skip_steps", self.skip_steps, "use >= 0")


@dataclass
class CheckpointConfig:
    every: int = 0
    """Save every N steps (0 = only at the end)."""
    keep_last_n: int = 2
    resume: str = "auto"
    """'auto' (latest good checkpoint in run_dir, if any), 'never', or a checkpoint path."""
    async_save: bool = False
    """Write checkpoints from a background thread (torch.distributed.checkpoint.async_save)
    while training continues; each is published (manifest + rename) only once fully written,
    at most one is in flight, and the run waits for the last before it ends."""
    export_hf: bool = False
    """Also export safetensors + config.json with Hugging Face names at the end."""
    init_from: str = ""
    """A Hugging Face model directory (config.json + *.safetensors, sharded or not), or the
    hub id (org/name) of one in the local Hugging Face cache (HF_HUB_CACHE / HF_HOME; never
    downloaded), whose weights initialize the model; its config.json is the model config
    unless model.name is given. A resume from this run's own checkpoint wins over it."""

    def __post_init__(self) -> None:
        require(self.every >= 0, "checkpoint.every", self.every, "use >= 0 (0 = end only)")
        require(self.keep_last_n >= 1, "checkpoint.keep_last_n", self.keep_last_n, "use >= 1")
        require(
            isinstance(self.async_save, bool),
            "checkpoint.async_save",
            self.async_save,
            "use true or false",
        )
        if self.resume not in ("auto", "never"):
            from .strict import did_you_mean

            require(
                bool(self.resume.strip()) and Path(self.resume).is_dir(),
                "checkpoint.resume",
                self.resume,
                "give 'auto', 'never' or an existing checkpoint directory (a step_* "
                f"folder){did_you_mean(self.resume, ('auto', 'never'))}",
            )
        if self.init_from:
            require(
                (local_path(self.init_from, "checkpoint.init_from") / "config.json").is_file(),
                "checkpoint.init_from",
                self.init_from,
                "give a Hugging Face model directory holding config.json, or the hub id "
                "(org/name) of a model in the local Hugging Face cache",
            )


@dataclass
class HardwareConfig:
    """The accelerator: a preset, a preset with figures changed, or a device described here
    (`config.hardware_toml`)."""

    gpu: str = "cpu"
    """Accelerator preset (see scaletrain.config.HARDWARE_PRESETS), or the name of a device
    described by the figures below (then peak_tflops, memory_gib, memory_bw_gb_s,
    intra_node_bw_gb_s, inter_node_bw_gb_s, power_w and arch are required)."""
    gpus: int = 0
    """Number of accelerators; 0 = the world size of the run."""
    gpus_per_node: int = 0
    """0 = the preset's value (a described device: 8)."""
    usd_per_gpu_hour: float = 0.0
    """0 = the preset's rough cloud price (a described device: 2.0)."""
    efficiency: float = 0.0
    """Achievable fraction of peak matmul FLOP/s; 0 = the planner's default."""
    grid_kg_co2_per_kwh: float = 0.43
    """Grid carbon intensity, kg CO2 per kWh (0.43: the average grid of seed 004's carbon
    napkin math)."""
    pue: float = 1.2
    """Data-centre power usage effectiveness (energy multiplier)."""
    host_watts_per_node: float = 0.0
    """Host (CPU, NIC, fans) power per node, watts, added to the GPUs' board power in the
    energy line; 0 = not counted (seed 004's carbon example uses 200 W per 8-GPU host)."""
    storage_gb_per_s: float = 0.0
    """Read bandwidth from the training data's storage per node, GB/s (1e9 bytes/s), against
    which `explain` and `verify` hold the input rate; 0 = the preset's (4 GB/s)."""
    peak_tflops: dict[str, float] = dataclasses.field(default_factory=dict)
    """Peak dense TFLOP/s by compute dtype (fp32, tf32, bf16, fp16, fp8: the datasheet's, no
    2:4 sparsity); with a preset, the dtypes given replace its own; empty = the preset's."""
    memory_gib: float = 0.0
    """Device memory a process can use, GiB (CUDA's total_memory, a little under the nominal
    GB); 0 = the preset's."""
    memory_bw_gb_s: float = 0.0
    """Device memory (HBM) bandwidth, GB/s; 0 = the preset's."""
    intra_node_bw_gb_s: float = 0.0
    """Per-GPU, per-direction bandwidth to peers in a node (NVLink, xGMI, PCIe), GB/s; 0 = the
    preset's."""
    inter_node_bw_gb_s: float = 0.0
    """Per-GPU, per-direction bandwidth across nodes (one NIC per GPU), GB/s; 0 = the
    preset's."""
    intra_node_latency_us: float = 0.0
    """Latency (alpha) of one collective step inside a node, microseconds; 0 = the preset's
    (a described device: 5)."""
    inter_node_latency_us: float = 0.0
    """Latency of one collective step across nodes, microseconds; 0 = the preset's (a
    described device: 10)."""
    host_to_device_bw_gb_s: float = 0.0
    """Host link per direction (CPU offload traffic), GB/s; 0 = the preset's (a described
    device: 25)."""
    host_memory_gib: float = 0.0
    """Host RAM per node, GiB: what CPU offload (`memory.offload`) may fill; the planner
    refuses layouts whose offloaded bytes per node exceed it. 0 = the preset's (2 TiB for the
    8-GPU H100 / H200 nodes; unknown, so unchecked, for the others)."""
    power_w: float = 0.0
    """Board power (TDP) of one accelerator, watts; 0 = the preset's."""
    mamf_bf16_tflops: float = 0.0
    """Maximum achievable bf16 matmul TFLOP/s measured on the device (the best large GEMM, e.g.
    ml-engineering's mamf-finder.py); the default matmul efficiency keeps its share of peak
    against an H100's (80.3%). 0 = the preset's (measured for A100, B200 and MI300X; otherwise the
    device plans like the NVIDIA parts the default efficiency was read on)."""
    fp8_mamf_share: float = 0.0
    """(achievable fp8 matmul rate / fp8 peak) / (achievable bf16 matmul rate / bf16 peak), both
    from one measurement (one tool and library): the share of the bf16 matmul efficiency float8
    GEMMs keep. 0 = the preset's (0.899 on MI300X from AMD's hipBLASLt MAF table; otherwise its
    GPU generation's from ml-engineering's MAMF tables, the H100's 0.882 for any other part)."""
    attention_bf16_tflops: float = 0.0
    """FlashAttention forward + backward bf16 TFLOP/s measured on the device (causal): the
    ceiling of the flash attention core. 0 = the preset's (measured for none today: an sm90
    part takes the H100's published FlashAttention-2 figure, 35% of peak; any other device
    the matmul rate)."""
    intra_node_bw_efficiency: float = 0.0
    """Achieved share (0..1] of `intra_node_bw_gb_s` that an intra-node collective's bus
    bandwidth reaches. 0 = the preset's (0.712 on MI300X from AMD's rccl-tests figure; 1, the raw
    link figure, on the NVIDIA presets and a described device)."""
    nvls_allreduce_busbw_gb_s: float = 0.0
    """Bus bandwidth an all-reduce inside one node reaches with NVLink SHARP (NCCL's NVLS
    algorithm, NVSwitch-3 systems), GB/s. 0 = the preset's (480 on the H100 SXM, 475 on the
    H200, from published nccl-tests figures; none elsewhere: rings at the intra-node bus
    bandwidth)."""
    intra_node_pair_bw_gb_s: float = 0.0
    """Per-direction bandwidth between one pair of a node's GPUs wired point to point (a fully
    connected NVLink mesh without NVSwitch, e.g. 50 on a 4-GPU V100 SXM2 node: 2 NVLink2 links
    per pair), GB/s: a collective among fewer than all the node's GPUs reaches only its peers'
    links. 0 = the preset's (none: switched, every intra-node group at the full figure)."""
    sm_count: int = 0
    """Streaming multiprocessors (AMD: compute units) of one GPU: the share of them an
    overlapped NCCL collective holds beside the GEMMs. 0 = the preset's (its whitepaper's
    count; not stated for a described device: no such charge)."""
    arch: str = ""
    """Architecture: 'sm90' (NVIDIA compute capability 9.0), 'gfx942' (AMD) or 'cpu'; it
    decides the precisions the device runs. Empty = the preset's."""

    def __post_init__(self) -> None:
        require(self.gpus >= 0, "hardware.gpus", self.gpus, "use >= 0 (0 = world size)")
        require(self.gpus_per_node >= 0, "hardware.gpus_per_node", self.gpus_per_node, "use >= 0")
        require(0 <= self.efficiency <= 1, "hardware.efficiency", self.efficiency, "use 0..1")
        require(self.pue >= 1, "hardware.pue", self.pue, "use >= 1.0")
        require(
            self.usd_per_gpu_hour >= 0,
            "hardware.usd_per_gpu_hour",
            self.usd_per_gpu_hour,
            "use a price >= 0 (0 = the preset's)",
        )
        require(
            self.grid_kg_co2_per_kwh >= 0,
            "hardware.grid_kg_co2_per_kwh",
            self.grid_kg_co2_per_kwh,
            "use kg CO2 per kWh >= 0, e.g. 0.43",
        )
        require(
            self.host_watts_per_node >= 0,
            "hardware.host_watts_per_node",
            self.host_watts_per_node,
            "use watts >= 0",
        )
        for name in FIGURES:
            v = getattr(self, name)
            if name != "peak_tflops" and not isinstance(v, bool) and v < 0:
                raise ConfigError(
                    f"hardware.{name}", v, f"use a positive {figure_unit(name)} (0 = not given)"
                )
        self.spec()  # a missing, unknown or malformed figure: one line, now

    def figures(self) -> dict[str, Any]:
        """The figures given (`config.hardware_toml.FIGURES` names; 0 / empty = not given)."""
        return {n: getattr(self, n) for n in FIGURES if getattr(self, n)}

    def spec(self) -> HardwareSpec:
        """The device: the preset with the figures given, or the device they describe."""
        return describe_hardware(self.gpu, self.figures(), self.arch)
