"""Communication volumes and alpha-beta times per training step (torch-free).

Cost model (Thakur et al. 2005; Chan et al. 2007; NCCL's ring algorithms): a ring all-reduce of
M bytes over n ranks moves 2(n-1)/n * M per rank in 2(n-1) steps; all-gather, reduce-scatter and
all-to-all move (n-1)/n * M in (n-1) steps (M = the full, unsharded size); a point-to-point send
moves M in one step. time = steps * alpha + bytes / beta, beta = the per-GPU per-direction link
bandwidth of the tier the axis spans. Ignores: tree algorithms inside a node, congestion between
axes sharing a NIC, SHARP in-network reduction across nodes (CollNet, NVLS-tree). An all-reduce
inside one node of a device with NVLink SHARP takes NCCL's NVLS algorithm where it is faster
(`allreduce_seconds`). Intra-node links run at
`HardwareSpec.intra_node_busbw`: the raw link figure x the device's published achieved share
(config/hardware.py cites it per preset: 0.75 on MI300X's xGMI, 370 / 450 on an H100's
NVLink); the NIC figure is raw on every preset. On a node whose GPUs are wired point to point
with no switch (`HardwareSpec.intra_node_pair_bw`: a 4-GPU V100 SXM2 node, 2 NVLink2 links per
pair; an MI300X node's xGMI mesh, one link per pair)
a group of g < gpus_per_node of its GPUs reaches only the links to its g - 1 peers
(`HardwareSpec.intra_node_group_busbw`): a tp = 2 pair there all-reduces over 2 of a GPU's 6
links.

Rank placement (Megatron-LM and torchtitan order): tp innermost, then cp, then dp (ep borrows
dp*cp ranks with stride tp), pp outermost. An axis whose ranks lie in one node (stride x degree
<= gpus_per_node) uses NVLink-class `intra_node_bw`, otherwise the multi-rail ring bandwidth
below (`inter_node_bw` when the group has one rank per node).

Multi-rail rings (what NCCL builds across nodes): each ring channel runs through the group's
ranks of one node over NVLink and leaves the node once, through one NIC; NCCL spreads its
channels over the node's NICs, one NIC per GPU on the presets (NCCL documentation,
NCCL_CROSS_NIC: rings and trees use the NIC of the same rail on every node; NVIDIA blog
"Massively Scale Your Deep Learning Training with NCCL 2.4", 2019, on rings spanning nodes).
In a ring every link carries the same (n-1)/n * M / channels, so with g of the group's ranks
in each node, the g NICs of those ranks carry the ring's node-crossing hops side by side and
the collective runs at min(intra_node_bw, g x inter_node_bw) per rank (bus bandwidth). g = 1
(a group strided one rank per node, e.g. dp across nodes under tp = 8) gives the plain NIC
figure. NCCL's own cost model agrees (nccl src/graph/tuning.cc, ncclTopoTuneModel): a ring's
bus bandwidth is nChannels x the per-channel speed, the intra-node one up to 2 nodes and the
network one beyond (`bw = nNodes <= 2 ? bwIntra : bwInter`), its channels spread over the NICs
the group's GPUs reach; so a tp group spanning two nodes is not bound by one NIC (50 GB/s on
the H100 preset) but by the node's NICs together. Ignores: NIC sharing between different axes'
collectives running at the same time, switch oversubscription (a non-blocking fat tree is
assumed), SHARP / NVLS-tree reductions across nodes, NCCL's protocol factors (LL128 x0.92, the
tree's x0.92 and its mid-size correction table). An all-to-all is no ring: across nodes
every byte for a peer on another node crosses a NIC (`_ep_term`, the EP all-to-all).

Families (`comm_terms`' keys): dp_allreduce, zero_all_gather, zero_reduce_scatter,
fsdp_all_gather, fsdp_reduce_scatter, hsdp_allreduce (`_dp_terms`, `_zero_terms`, `_fsdp_terms`,
`_hsdp_term`), tp (`_tp_term`), pp_p2p (`_pp_term`), cp_ring (`_cp_term`), ep_all_to_all
(`_ep_term`); each checked against the bytes counted at the collectives by
benchmarks/comm_volume.py (tiny models on gloo).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scaletrain.config import HardwareSpec, Layout, compute_bytes, fsdp_reshard_after_forward

from .efficiency import allreduce_latency

__all__ = [
    "CommInputs",
    "axis_link",
    "dp_allreduce_latency",
    "allreduce_time",
    "allreduce_seconds",
    "NVLS_LATENCY_S",
    "gather_time",
    "p2p_time",
    "comm_volumes",
    "comm_time",
    "comm_terms",
    "expected_remote_nodes",
]


def axis_link(
    layout: Layout, hardware: HardwareSpec, axis: str, gpus_per_node: int | None = None
) -> tuple[float, float, bool]:
    """(bandwidth B/s, latency s, crosses_nodes) for a parallel axis under the placement above;
    across nodes the multi-rail ring bandwidth of the module docstring."""
    gpn = gpus_per_node or hardware.gpus_per_node
    if gpn != hardware.gpus_per_node:
        hardware = dataclasses.replace(hardware, gpus_per_node=gpn)
    stride, degree = _axis_group(layout, axis)
    inter = degree > 1 and stride * degree > gpn
    if inter:
        # multi-rail ring (module docstring): the group's ranks per node share its NICs' load
        per_node = max(1, min(degree, gpn // max(1, stride)))
        bw = min(hardware.intra_node_group_busbw(per_node), per_node * hardware.inter_node_bw)
        return bw, hardware.inter_node_latency_s, True
    # on a point-to-point mesh a group smaller than the node has its peers' links only
    return hardware.intra_node_group_busbw(degree), hardware.intra_node_latency_s, False


def _axis_group(L: Layout, axis: str) -> tuple[int, int]:
    """(stride between the group's ranks, group size) of a parallel axis under the placement of
    the module docstring; the step model asks ~5 per plan."""
    if axis == "tp":
        return 1, L.tp
    if axis in ("cp", "ep"):
        return L.tp, L.cp if axis == "cp" else L.ep
    if axis == "dp" and L.zero:
        # ZeRO shards over dp_shard x cp (the FSDP mesh folds cp in): stride tp.
        return L.tp, L.dp * L.cp
    if axis == "dp_shard":
        # HSDP's shard group: the inner dp*cp / dp_replicate ranks of the dp group, contiguous
        # at stride tp; the replica groups are its outer part (`_hsdp_term`). torch FSDP1's
        # HYBRID_SHARD without a process group shards over `dist.new_subgroups(devices per
        # node)`, consecutive ranks (torch/distributed/fsdp/_init_utils.py
        # _init_intra_node_process_group); a 2-D device mesh ('replicate', 'shard') keeps the
        # shard dim innermost as well (the mesh (pp, dp_replicate, dp_shard, cp, tp) of
        # config.layout, torchtitan's order); overlap_sm.node_local_families reads it so too.
        return L.tp, L.dp_shard * L.cp
    if axis == "dp":
        return L.tp * L.cp, L.dp
    if axis == "pp":
        return L.tp * L.cp * L.dp, L.pp
    raise KeyError(axis)


def dp_allreduce_latency(
    layout: Layout, hardware: HardwareSpec, gpus_per_node: int | None, n: int
) -> float:
    """The latency term of one all-reduce over n ranks of the dp axis (efficiency.
    allreduce_latency, NCCL's ring / tree model): its ranks per node from the placement (the
    dp group's stride), the preset's intra- and inter-node latencies."""
    gpn = gpus_per_node or hardware.gpus_per_node
    stride, _ = _axis_group(layout, "dp")
    per_node = max(1, gpn // max(1, stride))
    return allreduce_latency(
        n, hardware.intra_node_latency_s, hardware.inter_node_latency_s, per_node
    )


def allreduce_time(nbytes: float, n: int, bw: float, lat: float) -> float:
    """Ring all-reduce: 2(n-1)/n * M / bw + 2(n-1) * alpha."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat


NVLS_LATENCY_S = 25e-6
"""The latency NCCL's cost model charges one NVLS (NVLink SHARP) collective inside a node: its
hwLatencies[NVLINK][NVLS][SIMPLE] = 25 us, base latency 0, once per collective rather than per
ring step (NVIDIA/nccl src/graph/tuning.cc, ncclTunerConstantsDefaults and ncclTopoTuneModel,
at 5067397)."""


def allreduce_seconds(
    nbytes: float, n: int, link: Link, hardware: HardwareSpec, *, ring: float | None = None
) -> float:
    """One all-reduce of M = `nbytes` over n ranks on `link`: the ring's time
    (`allreduce_time`, or `ring` where the caller priced it otherwise), or, for a group inside
    one node (`link` does not cross nodes) of a device with NVLink SHARP
    (`HardwareSpec.nvls_allreduce_busbw` > 0), the smaller of that and NVLS's
    2(n-1)/n x M / nvls_busbw + NVLS_LATENCY_S: NCCL picks the algorithm its model finds
    fastest (tuning.cc ncclTopoTuneModel, then ncclTopoGetAlgoTime per call), and NVLS is on by
    default where the device supports multicast (src/transport/nvls.cc, NCCL_NVLS_ENABLE = 2).
    The bus bandwidth is the measured 8-GPU figure for every group size: NCCL's model keeps an
    NVLS all-reduce's bus bandwidth independent of n (its per-channel bandwidth x2 for the
    all-reduce, then the ring's n / 2(n-1) to algorithm bandwidth). Counts: all-reduces only;
    reduce-scatters and all-gathers stay rings at the link's bandwidth (the NVLS figure is an
    all-reduce's; NCCL's model takes (ppn-1)/ppn of the NVLS channel bandwidth for them, with
    no published gain over the ring). Ignores: NVLS-tree across nodes (a group that crosses
    nodes keeps the ring / tree model), the bandwidth's dependence on message size below a
    few hundred MB, the SMs NVLS's kernels use."""
    bw, lat, inter = link
    t = allreduce_time(nbytes, n, bw, lat) if ring is None else ring
    nvls = hardware.nvls_allreduce_busbw
    if n <= 1 or inter or nvls <= 0:
        return t
    return min(t, 2 * (n - 1) / n * nbytes / nvls + NVLS_LATENCY_S)


def gather_time(nbytes: float, n: int, bw: float, lat: float) -> float:
    """Ring all-gather / reduce-scatter / all-to-all of M (full) bytes: (n-1)/n * M / bw +
    (n-1) * alpha."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / bw + (n - 1) * lat


def p2p_time(nbytes: float, bw: float, lat: float) -> float:
    """One point-to-point send: M / bw + alpha."""
    return nbytes / bw + lat


@dataclass(kw_only=True, slots=True)
class CommInputs:
    """What `comm_terms` prices for one rank (`step_time.comm_arguments` builds it from a plan).
    Built per timed plan of a search: not frozen (a frozen dataclass's __init__ sets each
    field through object.__setattr__), never mutated after construction."""

    layout: Layout
    hardware: HardwareSpec
    stage_params: float
    """Parameters this rank holds (after TP/PP/EP division, before ZeRO)."""
    layers: int
    """Blocks on this rank."""
    moe_layers: int
    """MoE blocks on this rank."""
    tokens: float
    """s_l * b of one micro-batch (s_l = seq_len / cp)."""
    hidden: int
    kv_dim: int
    experts_per_token: float
    """Rows each token sends to the experts: k, or with an expert capacity the permuted rows
    per token (`ModelConfig.expert_rows_per_token`)."""
    num_experts: int = 0
    """E, the routed experts of an MoE block (0: unknown; `_ep_term`'s per-node dispatch)."""
    top_k: int = 0
    """k, the experts a token is routed to (`ModelConfig.experts_per_token`)."""
    topk_node_cap: int = 0
    """A group-limited router's `router_topk_groups` (0: no limit): the groups a token's experts
    may come from (DeepSeek-V3's node-limited routing)."""
    router_groups: int = 0
    """That router's `router_groups` (0: no groups)."""
    moe_dispatcher: str = "unstated"
    """`PlanInput.moe_dispatcher`: 'flex' (DeepEP / HybridEP) dispatches across nodes once per
    destination node (`_ep_term`); any other, NCCL's point-to-point all-to-all."""
    micro_batches: int
    """m: micro-batches per step."""
    precision: str = "bf16"
    ac: str = "none"
    ac_early_stop: bool = False
    """The full-AC recompute stops before each dense block's MLP down projection, so its TP
    reduction is not recomputed (time/ac_early_stop.py `early_stop_applies`)."""
    reduce_bytes: int = 4
    """Bytes per gradient element reduced (fp32)."""
    param_comm_bytes: int = 0
    """Bytes per parameter element gathered (0: the compute dtype's)."""
    expert_params: float = 0.0
    """The MoE expert parameters among stage_params (local after EP, or after TP with ep = 1:
    `config.layout.expert_split`); how their gradients travel: `_dp_terms`."""
    fp8_gather_params: float = 0.0
    """Parameters among stage_params that ZeRO-2/3 all-gathers as 1-byte E4M3
    (`precision.fp8_all_gather`; measured: exactly half the bf16 bytes, its scale is one
    all-reduced scalar per weight, ignored) instead of the compute dtype."""
    gpus_per_node: int | None = None
    pp_scatter_gather: bool = False
    """`PlanInput.pp_scatter_gather`: pipeline sends of 1/tp of the tensor, all-gathered over tp."""


def comm_terms(inputs: CommInputs) -> dict[str, tuple[float, float]]:
    """Per step, per rank: {family: (bytes moved by this rank, seconds)} (fields: `CommInputs`).
    Families: see the module docstring; each `_*_term(s)` says what it counts.
    """
    L, hw, m = inputs.layout, inputs.hardware, inputs.micro_batches
    tokens, hidden, gpus_per_node = inputs.tokens, inputs.hidden, inputs.gpus_per_node
    layers, moe_layers, experts_per_token = (
        inputs.layers,
        inputs.moe_layers,
        inputs.experts_per_token,
    )
    e = compute_bytes(inputs.precision)  # bytes of an activation (compute dtype)
    recompute = inputs.ac == "full"
    out: dict[str, tuple[float, float]] = {}
    if L.dp * L.cp > 1:
        out.update(_dp_terms(inputs, param_bytes=inputs.param_comm_bytes or e))
    act = e * tokens * hidden
    if L.tp > 1:
        out["tp"] = _tp_term(inputs, axis_link(L, hw, "tp", gpus_per_node), act=act)
    if L.pp > 1:
        tp_link = axis_link(L, hw, "tp", gpus_per_node) if inputs.pp_scatter_gather else None
        out["pp_p2p"] = _pp_term(
            L, axis_link(L, hw, "pp", gpus_per_node), act=act, m=m, scatter_gather=tp_link
        )
    if L.cp > 1:
        kv = 2 * e * tokens * inputs.kv_dim / L.tp
        out["cp_ring"] = _cp_term(
            L, axis_link(L, hw, "cp", gpus_per_node), kv=kv, layers=layers, m=m, recompute=recompute
        )
    if L.ep > 1 and moe_layers:
        routed = e * experts_per_token * tokens * hidden
        gpn = gpus_per_node or hw.gpus_per_node
        hw_n = hw if gpn == hw.gpus_per_node else dataclasses.replace(hw, gpus_per_node=gpn)
        stride, _ = _axis_group(L, "ep")
        out["ep_all_to_all"] = _ep_term(
            L,
            axis_link(L, hw, "ep", gpus_per_node),
            routed=routed,
            moe_layers=moe_layers,
            m=m,
            recompute=recompute,
            cross=_EpCross(
                hardware=hw_n,
                ranks_per_node=max(1, min(L.ep, gpn // max(1, stride))),
                token_bytes=e * tokens * hidden,
                num_experts=inputs.num_experts,
                top_k=inputs.top_k,
                node_cap=inputs.topk_node_cap,
                groups=inputs.router_groups,
                per_node=inputs.moe_dispatcher == "flex",
            ),
        )
    return out


Link = tuple[float, float, bool]
"""`axis_link`'s (bandwidth B/s, latency s, crosses_nodes)."""


def _dp_terms(inputs: CommInputs, *, param_bytes: int) -> dict[str, tuple[float, float]]:
    """The data-parallel (and ZeRO) families over the dp*cp ranks (CP ranks hold the same
    parameters, so cp joins the reduction). Reductions (and zero 2's gathers) run once per
    micro-batch, or once per step inside a pipeline (`_fsdp_terms`).
    Expert-parallel experts (ep > 1): their gradients are averaged over the (dp*cp)/ep ranks
    that replicate them (`ep_replicate`), not over dp*cp, once per step (`sync_gradients`, all
    ZeRO stages: FSDP2 leaves expert-parallel experts alone, so ZeRO-2/3 gather and
    reduce-scatter only the other parameters), and ZeRO-1 broadcasts their updated fp32
    partitions over those replicas only (`parallel.zero._LocalShardZero`); both priced on the
    dp axis's link (replicas sit ep x tp ranks apart, so they span nodes no sooner than the dp
    group does). ep = 1 experts are plain parameters. param_bytes: per parameter gathered."""
    L, hw, gpus_per_node = inputs.layout, inputs.hardware, inputs.gpus_per_node
    m, layers = inputs.micro_batches, inputs.layers
    stage_params, expert_params = inputs.stage_params, inputs.expert_params
    reduce_bytes, fp8_gather_params = inputs.reduce_bytes, inputs.fp8_gather_params
    dp_link = axis_link(L, hw, "dp", gpus_per_node)
    bw, lat, _ = dp_link
    n = L.dp * L.cp
    if L.zero:
        n = max(1, n // max(1, L.dp_replicate))
    if L.zero >= 2 and L.dp_replicate > 1:
        # HSDP gathers and reduce-scatters within its shard group only (`_axis_group`
        # 'dp_shard'): inside one node when the group fits there, not over the whole dp group
        bw, lat, _ = axis_link(L, hw, "dp_shard", gpus_per_node)
    k_red = 1 if L.pp > 1 else m
    ep_experts = expert_params if L.ep > 1 else 0.0
    n_exp = max(1, L.dp * L.cp // L.ep)
    exp_grads = ep_experts * reduce_bytes
    out: dict[str, tuple[float, float]] = {}
    if L.zero <= 1:
        out.update(
            _zero_terms(
                L.zero,
                dp_link,
                hw,
                n=n,
                n_exp=n_exp,
                dense=stage_params - ep_experts,
                ep_experts=ep_experts,
                reduce_bytes=reduce_bytes,
            )
        )
    elif exp_grads and n_exp > 1:
        out["dp_allreduce"] = (
            2 * (n_exp - 1) / n_exp * exp_grads,
            allreduce_seconds(exp_grads, n_exp, dp_link, hw),
        )
    fsdp_params = stage_params - ep_experts  # what FSDP2 gathers and reduces
    grads = fsdp_params * reduce_bytes
    if L.zero >= 2:
        params = (fsdp_params - fp8_gather_params) * param_bytes + fp8_gather_params
        # FSDP2 groups one unit per block plus the root (parallel/fsdp.py, torchtitan's
        # apply_fsdp): every gather / reduce-scatter is one collective per unit, each paying
        # the ring's (n-1) latency steps: units x (n-1) x alpha, seconds at 1,000+ ranks
        out.update(
            _fsdp_terms(
                L, (bw, (layers + 1) * lat), n=n, m=m, k_red=k_red, grads=grads, params=params
            )
        )
    if L.zero and L.dp_replicate > 1:
        out["hsdp_allreduce"] = _hsdp_term(L, hw, gpus_per_node, shard=grads / n, k_red=k_red)
    return out


def _zero_terms(
    zero: int,
    link: Link,
    hw: HardwareSpec,
    *,
    n: int,
    n_exp: int,
    dense: float,
    ep_experts: float,
    reduce_bytes: int,
) -> dict[str, tuple[float, float]]:
    """dp_allreduce (zero 0 and 1): one all-reduce of the grads (reduce_bytes/param) per step
    over the dp*cp ranks that replicate them (no_sync during accumulation);
    zero_all_gather (zero 1): ZeroRedundancyOptimizer broadcasts each updated fp32 partition
    once per step ((n-1)/n of the fp32 params per rank). All-reduces as `allreduce_seconds`
    prices them on `link`."""
    bw, lat, _ = link
    out: dict[str, tuple[float, float]] = {}
    exp_grads = ep_experts * reduce_bytes
    dense_grads = dense * reduce_bytes
    moved = 2 * (n - 1) / n * dense_grads + 2 * (n_exp - 1) / n_exp * exp_grads
    secs = allreduce_seconds(dense_grads, n, link, hw) + allreduce_seconds(
        exp_grads, n_exp, link, hw
    )
    if moved:
        out["dp_allreduce"] = (moved, secs)
    if zero == 1:
        # fp32 partitions broadcast after the sharded update; experts over their replicas
        dense_p, exp_p = dense * 4, ep_experts * 4
        out["zero_all_gather"] = (
            (n - 1) / n * dense_p + (n_exp - 1) / n_exp * exp_p,
            gather_time(dense_p, n, bw, lat) + gather_time(exp_p, n_exp, bw, lat),
        )
    return out


def _fsdp_terms(
    L: Layout, link: tuple[float, float], *, n: int, m: int, k_red: int, grads: float, params: float
) -> dict[str, tuple[float, float]]:
    """ZeRO-2/3 under FSDP2 (`params`: the gathered bytes, compute dtype or fp8; `link`'s
    latency is per unit collective round, (layers + 1) x alpha: one collective per FSDP unit):
      zero 2 (reshard_after_forward=False): zero_reduce_scatter, one reduce-scatter of the
        grads per micro-batch; zero_all_gather, the params gathered once per micro-batch
        (resharded after each backward);
      zero 3: fsdp_all_gather, 2 per micro-batch (forward and backward re-gather,
        reshard_after_forward=True); fsdp_reduce_scatter one per micro-batch.
    Under pp > 1 torch's pipeline stages run every backward with gradient sync and resharding
    after backward off (`backward_maybe_with_nosync`) and reduce once in `perform_reduce_grad`
    (k_red = 1): zero 2 gathers once per step and reduce-scatters once; zero 3 still reshards
    after each forward, so every forward's successor (the next forward or the first backward
    after it) re-gathers: m + 1 all-gathers per step per chunk, whatever the order; except on
    a split-backward pipeline (zero-bubble, DualPipeV), whose ZeRO-3 units are not resharded
    after forward (`config.fsdp_reshard_after_forward`): there it communicates as zero 2."""
    bw, lat = link
    if L.zero == 2 or not fsdp_reshard_after_forward(L):
        return {
            "zero_reduce_scatter": (
                k_red * (n - 1) / n * grads,
                k_red * gather_time(grads, n, bw, lat),
            ),
            "zero_all_gather": (
                k_red * (n - 1) / n * params,
                k_red * gather_time(params, n, bw, lat),
            ),
        }
    k_ag = m + 1 if L.pp > 1 else 2 * m
    return {
        "fsdp_all_gather": (k_ag * (n - 1) / n * params, k_ag * gather_time(params, n, bw, lat)),
        "fsdp_reduce_scatter": (
            k_red * (n - 1) / n * grads,
            k_red * gather_time(grads, n, bw, lat),
        ),
    }


def _hsdp_term(
    L: Layout, hw: HardwareSpec, gpus_per_node: int | None, *, shard: float, k_red: int
) -> tuple[float, float]:
    """hsdp_allreduce: the gradient shard all-reduced across the dp_replicate replicas after
    every micro-batch (FSDP2 reduces each backward; once per step under pp > 1)."""
    # replica groups are the outer part of dp: inter-node once dp*cp*tp > a node.
    inter = L.tp * L.cp * L.dp > (gpus_per_node or hw.gpus_per_node)
    bw2 = hw.inter_node_bw if inter else hw.intra_node_busbw
    lat2 = hw.inter_node_latency_s if inter else hw.intra_node_latency_s
    r = L.dp_replicate
    secs = allreduce_seconds(shard, r, (bw2, lat2, inter), hw)
    return (k_red * 2 * (r - 1) / r * shard, k_red * secs)


def _tp_term(inputs: CommInputs, link: Link, *, act: float) -> tuple[float, float]:
    """tp: Megatron TP, 2 all-reduces forward + 2 backward per block and micro-batch of e*s*b*h
    (`act`; +2 under full recompute, +1.5 (SP: the down projection's reduce-scatter skipped)
    or +1 (its all-reduce skipped) when the recompute stops early, `CommInputs.ac_early_stop`),
    plus the vocab-parallel embedding's forward all-reduce
    and the head input's backward all-reduce (2 per micro-batch); with SP the same bytes as
    all-gather + reduce-scatter pairs (Korthikanti et al. 2022). An MoE block
    (parallel/tensor_parallel.py) keeps the attention's 2 (+1) and replaces the MLP's: experts
    split over tp (ep = 1) all-reduce their (N*k, h) output forward and their input's gradient
    backward, 2 (+1) all-reduces of k*e*s*b*h (Megatron-Core's expert TP reduces there too);
    with SP the MoE input is all-gathered forward (+1 under recompute) and the output's
    gradient all-gathered backward (e*s*b*h each), whether or not the experts are split.
    Without SP the all-reduces run as `allreduce_seconds` prices them (NVLink SHARP inside a
    node where the device has it); with SP they are all-gather + reduce-scatter pairs, rings at
    the link's bandwidth. `act`: e*s*b*h of one micro-batch; the blocks, micro-batches,
    recompute and experts per token are `inputs`'."""
    L, hw, m = inputs.layout, inputs.hardware, inputs.micro_batches
    layers, moe_layers = inputs.layers, inputs.moe_layers
    experts_per_token = inputs.experts_per_token
    bw, lat, _ = link
    rc = 1 if inputs.ac == "full" else 0
    # all-reduces of act: dense blocks 4 (+2), MoE blocks' attention 2 (+1), embedding/head 2
    skipped = (0.5 if L.sp else 1.0) if inputs.ac_early_stop else 0.0
    k = ((4 + 2 * rc - skipped) * (layers - moe_layers) + (2 + rc) * moe_layers + 2) * m
    one = allreduce_time(act, L.tp, bw, lat) if L.sp else allreduce_seconds(act, L.tp, link, hw)
    moved, secs = k * 2 * (L.tp - 1) / L.tp * act, k * one
    if moe_layers and L.ep == 1:  # experts split over tp: their output and input gradient
        routed = experts_per_token * act
        k_e = (2 + rc) * moe_layers * m
        moved += k_e * 2 * (L.tp - 1) / L.tp * routed
        secs += k_e * allreduce_seconds(routed, L.tp, link, hw)
    if moe_layers and L.sp:  # the MoE input gathered forward, its output's grad backward
        k_g = (2 + rc) * moe_layers * m
        moved += k_g * (L.tp - 1) / L.tp * act
        secs += k_g * gather_time(act, L.tp, bw, lat)
    return moved, secs


def _pp_term(
    L: Layout, link: Link, *, act: float, m: int, scatter_gather: Link | None = None
) -> tuple[float, float]:
    """pp_p2p: one activation send forward and one gradient send backward per micro-batch and
    chunk (x v interleaved), on the worst rank: the first stage sends no gradient and the last
    no activation, so at pp = 2 every rank sends m*(2v-1) messages (a middle stage exists from
    pp = 3: 2mv). dualpipev's V passes its turn on rank pp-1 without a message and holds both
    ends on rank 0: 2m per rank at pp = 2, 2mv on a middle rank from pp = 3. Under SP the
    message is the tp-sharded activation. scatter_gather (the tp group's link; Megatron-LM's
    2021-2023 p2p, `PlanInput.pp_scatter_gather`): without SP each tp rank sends 1/tp of the
    tensor (megatron/mpu split_tensor_into_1d_equal_chunks) and the receiver all-gathers it
    over the tp group (gather_split_1d_tensor) before use, one ring all-gather per message
    (SC21, Narayanan et al. 2021, section 4.1)."""
    bw, lat, _ = link
    sg = scatter_gather is not None and not L.sp and L.tp > 1
    msg = act / (L.tp if L.sp or sg else 1)
    if L.pp_schedule == "dualpipev":
        k = m * (2 if L.pp == 2 else 2 * L.pp_virtual)
    else:
        k = m * (2 * L.pp_virtual - (1 if L.pp == 2 else 0))
    if sg and scatter_gather is not None:
        tp_bw, tp_lat, _ = scatter_gather
        return k * msg, k * (p2p_time(msg, bw, lat) + gather_time(act, L.tp, tp_bw, tp_lat))
    return k * msg, k * p2p_time(msg, bw, lat)


def _cp_term(
    L: Layout, link: Link, *, kv: float, layers: int, m: int, recompute: bool
) -> tuple[float, float]:
    """cp_ring: ring attention of `kv` bytes (this tp rank's K and V) per block and
    micro-batch: forward cp-1 K/V block sends; backward cp-1 K/V sends plus the dK/dV
    accumulators travelling a full turn (cp sends) home: 3cp-2 in all (+cp-1 forward sends
    under full recompute). A recipe whose framework runs torch's all-gather ring
    (Recipe.cp_ring 'torch_allgather': torchtitan) replaces it (time/cp_ring.py)."""
    bw, lat, _ = link
    k = (3 * L.cp - 2 + (L.cp - 1 if recompute else 0)) * layers * m
    return k * kv, k * p2p_time(kv, bw, lat)


@dataclass(frozen=True, slots=True)
class _EpCross:
    """What `_ep_term` needs when the EP group spans nodes: the group's ranks per node (g),
    one token's hidden-state bytes, the router's E, k and node cap, and whether the
    dispatcher sends a token once per destination node (`CommInputs.moe_dispatcher` 'flex')."""

    hardware: HardwareSpec
    ranks_per_node: int
    token_bytes: float
    num_experts: int
    top_k: int
    node_cap: int
    groups: int
    per_node: bool


def expected_remote_nodes(
    num_experts: int, top_k: int, nodes: int, node_cap: int = 0, groups: int = 0
) -> float:
    """Expected number of other nodes holding at least one of a token's k experts when the
    router picks k of E experts uniformly without replacement and each of the `nodes` nodes
    holds E / nodes of them: (nodes - 1) x (1 - C(E - E/nodes, k) / C(E, k)). Uniform routing
    is what a balanced router gives on average, and what Megatron-Core's
    moe_router_force_load_balancing draws (megatron/core/transformer/moe/router.py
    TopKRouter.forward: the gating logits replaced by apply_random_logits before top-k, 'for
    benchmark'). A group-limited router (`node_cap` = router_topk_groups M > 0 of `groups` G)
    takes its experts from M groups only: when the groups are the nodes (G = nodes, DeepSeek-V3's
    node-limited routing, E / G experts per node) and every chosen group gets one of the k
    experts (k >= M), the token reaches M nodes, its own among them with M / G: M (G - 1) / G
    remote; otherwise the uniform figure capped at M. Ignores: a learned router's skew."""
    if nodes <= 1:
        return 0.0
    if node_cap > 0 and groups == nodes and top_k >= node_cap:
        return node_cap * (nodes - 1) / nodes
    if num_experts <= 0 or top_k <= 0 or num_experts % nodes:
        hit = float(min(max(top_k, 1), nodes - 1))
    else:
        per = num_experts // nodes
        k = min(top_k, num_experts)
        miss = math.comb(num_experts - per, k) / math.comb(num_experts, k)
        hit = (nodes - 1) * (1.0 - miss)
    return min(hit, float(node_cap)) if node_cap > 0 else hit


def _ep_term(
    L: Layout,
    link: Link,
    *,
    routed: float,
    moe_layers: int,
    m: int,
    recompute: bool,
    cross: _EpCross | None = None,
) -> tuple[float, float]:
    """ep_all_to_all: dispatch + combine, forward and backward, per MoE block and micro-batch
    (+2 under full recompute) of `routed` = e*k*s*b*h bytes (the bytes moved: (ep-1)/ep of it).

    Inside one node: the ring's (ep-1)/ep x routed over the group's NVLink bus bandwidth.

    Across nodes (`cross`, the group's g = ranks_per_node ranks in each of ep/g nodes) an
    all-to-all is not a ring: every byte for a peer on another node leaves through a NIC, one
    per GPU on the presets, and the node-local bytes travel NVLink at the same time; the time
    is the slower of the two, + (ep-1) latencies:
    - NCCL (Megatron-Core's 'alltoall' dispatcher, torch's all_to_all_single; any dispatcher
      but 'flex'): the all-to-all is a group of ncclSend / ncclRecv, one pair per peer (NCCL
      user guide, usage/p2p.html, 'All-to-all'), so each rank sends (ep-g)/ep x routed over
      its NIC (`HardwareSpec.inter_node_bw`) and (g-1)/ep x routed over NVLink;
    - 'flex' (DeepEP / HybridEP, hierarchical): a token crosses to each destination node once,
      carrying a bit mask of the GPUs there that take it, and is fanned out over that node's
      NVLink (deepseek-ai/DeepEP csrc/kernels/internode.cu: SourceMeta's
      is_token_in_nvl_rank_bits per RDMA token, get_dispatch_layout's
      num_tokens_per_rdma_rank; read in the fork ZJLi2013/DeepEP; NVIDIA's HybridEP, the
      'hybridep' backend, states the same RDMA-across / NVLink-within hierarchy:
      DeepEP hybrid-ep docs, 'Hierarchical Communication Design'): NIC bytes = one token's
      bytes x `expected_remote_nodes` per routed token, NVLink (g-1)/g x routed (the copies
      whose GPU differs from the one the token lands on). Combine mirrors dispatch.
    Ignores: NCCL PXN's extra NVLink hop before the NIC, NIC sharing with other axes'
    collectives, congestion and adaptive-routing effects, HybridEP's SM share (its kernels run
    on some SMs while the GEMMs wait: moe_a2a_overlap is off in the rows that state it)."""
    bw, lat, crosses = link
    k = (4 + (2 if recompute else 0)) * moe_layers * m
    moved = k * (L.ep - 1) / L.ep * routed
    if not crosses or cross is None or cross.ranks_per_node >= L.ep:
        return moved, k * gather_time(routed, L.ep, bw, lat)
    hw, g = cross.hardware, cross.ranks_per_node
    nvlink = hw.intra_node_group_busbw(g)
    if cross.per_node:
        nodes = L.ep // g
        nic_bytes = cross.token_bytes * expected_remote_nodes(
            cross.num_experts, cross.top_k, nodes, cross.node_cap, cross.groups
        )
        local_bytes = (g - 1) / g * routed
    else:
        nic_bytes = (L.ep - g) / L.ep * routed
        local_bytes = (g - 1) / L.ep * routed
    one = max(nic_bytes / hw.inter_node_bw, local_bytes / nvlink if g > 1 else 0.0)
    return moved, k * (one + (L.ep - 1) * lat)


def comm_volumes(inputs: CommInputs) -> dict[str, float]:
    """Bytes moved per step per rank by collective family (`comm_terms`)."""
    return {k: v[0] for k, v in comm_terms(inputs).items()}


def comm_time(inputs: CommInputs) -> dict[str, float]:
    """Seconds per step per rank by collective family, all of it (overlap is decided by the
    caller: see estimate.py)."""
    return {k: v[1] for k, v in comm_terms(inputs).items()}
