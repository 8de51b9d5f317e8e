"""The input pipeline's load: the tokens and storage bytes per second each node must read to
keep the planned step time, against the storage's bandwidth (`[hardware] storage_gb_per_s`).

What it counts. A dp replica trains `tokens/s / dp` tokens per second (the planner's job rate,
`Estimate.tokens_per_s`). Every rank of a replica (its tp, cp and pp peers) loads the same
windows: the trainer's sampler picks them from the dp rank alone (`data.loader`), and each rank
reads them itself. The replica's ranks on one node share its page cache, so a node reads each
window once per dp replica with a rank on it. Ranks are placed as the trainer's mesh orders
them, (pp, dp, cp, tp) with tp innermost (`config.Layout.pp_rank_of`), so a node of G GPUs
holds ranks of about G / (tp x cp) replicas, at least one (`replicas_per_node` counts them).

A window is seq_len + 1 ids (the targets are the inputs shifted by one) for seq_len trained
tokens, each id 2 bytes below 65,536 ids and 4 above (`data.corpus.token_dtype_for`; Megatron's
`DType.optimal_dtype` and datatrove's token_size make the same choice), read from storage as
the 4 KiB pages it touches: a window starting anywhere touches its length in pages plus one on
average.

What it ignores: the kernel's readahead around each page fault (Linux reads up to
`read_ahead_kb`, 128 KiB by default, around a missing page: more than a window on a cold random
read, nothing once cached), the page cache's reuse (a corpus that fits in RAM is read once),
checkpoint writes, evaluation batches, and the CPU time of the loader itself (`verify` measures
the wait that leaves).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..types import Estimate

__all__ = ["InputRate", "input_rate", "replicas_per_node", "PAGE_BYTES"]

PAGE_BYTES = 4096
"""The page size storage is read in through a memory map (x86-64 and most arm64 Linux)."""


@dataclass(frozen=True)
class InputRate:
    replica_tokens_per_s: float
    """Tokens per second one dp replica trains (each of its ranks loads them)."""
    replicas_per_node: int
    node_tokens_per_s: float
    bytes_per_token: int
    window_bytes: float
    """Bytes read from storage per window: its pages."""
    node_bytes_per_s: float
    """What a node must read from storage per second."""
    storage_bytes_per_s: float
    """The node's storage read bandwidth (`HardwareSpec.storage_bw`)."""

    @property
    def margin(self) -> float:
        """Storage bandwidth over the required rate (inf when nothing is read)."""
        return (
            self.storage_bytes_per_s / self.node_bytes_per_s
            if self.node_bytes_per_s
            else float("inf")
        )


def replicas_per_node(*, dp: int, tp: int, cp: int, world: int, gpus_per_node: int) -> int:
    """The most dp replicas with a rank on one node: node n holds ranks [n G, (n+1) G), whose
    replica index is (rank // (tp cp)) mod dp (module docstring)."""
    g, group = max(1, min(gpus_per_node, world)), tp * cp
    most = 0
    for start in range(0, world, g):
        first, last = start // group, (min(start + g, world) - 1) // group
        most = max(most, min(dp, last - first + 1))
        if most == dp:
            break
    return max(1, most)


def input_rate(est: Estimate) -> InputRate:
    """The input rate `est`'s step time requires of each node (module docstring)."""
    p, L, hw = est.plan, est.plan.layout, est.plan.hardware
    replica = est.tokens_per_s / max(1, L.dp)
    replicas = replicas_per_node(
        dp=L.dp, tp=L.tp, cp=L.cp, world=max(1, p.num_gpus), gpus_per_node=hw.gpus_per_node
    )
    item = 2 if p.model.vocab_size < 65536 else 4
    window = ((p.seq_len + 1) * item / PAGE_BYTES + 1) * PAGE_BYTES
    windows_per_s = replicas * replica / p.seq_len
    return InputRate(
        replica_tokens_per_s=replica,
        replicas_per_node=replicas,
        node_tokens_per_s=replicas * replica,
        bytes_per_token=item,
        window_bytes=window,
        node_bytes_per_s=windows_per_s * window,
        storage_bytes_per_s=hw.storage_bw,
    )
