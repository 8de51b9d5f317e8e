"""Parallel layout and its legality rules, shared by the planner (torch-free) and the trainer.

World size = dp * tp * pp * cp. Expert parallelism borrows ranks from the data-parallel and
context-parallel ranks (ep divides dp*cp), as in torchtitan and DeepSpeed-MoE, so it does not
multiply the world size. HSDP splits dp into dp_replicate x dp_shard.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ._errors import ConfigError
from .choices import PPSchedule, ZeroStage, names
from .layout_facts import (  # re-exported: config.layout is where callers look for them
    ddp_reducer,
    expert_split,
    expert_tp,
    expert_zero_shards,
    fsdp_reshard_after_forward,
    fused_head_loss,
    grad_accum_steps,
    stage_ids,
    stage_layer_ranges,
)
from .layout_options import option_problems
from .model import ModelConfig

__all__ = [
    "Layout",
    "PP_SCHEDULES",
    "batch_problems",
    "composition_problems",
    "ddp_reducer",
    "fused_head_loss",
    "expert_split",
    "expert_tp",
    "expert_zero_shards",
    "fsdp_reshard_after_forward",
    "layout_problems",
    "option_problems",
    "check_layout",
    "grad_accum_steps",
    "stage_layer_ranges",
    "stage_ids",
]

PP_SCHEDULES: tuple[PPSchedule, ...] = names(PPSchedule)


@dataclass(frozen=True)
class Layout:
    """Parallel degrees of one training job (degree 1 of any axis means 'not used')."""

    dp: int = 1
    """Data-parallel degree (replicas x shards): the batch is split dp ways."""
    zero: ZeroStage = 0
    """ZeRO stage over the dp ranks: 0 = DDP, 1 = optimizer states, 2 = + gradients,
    3 = + parameters (FSDP2 fully_shard)."""
    dp_replicate: int = 1
    """HSDP: number of replica groups; parameters are sharded over dp // dp_replicate ranks."""
    tp: int = 1
    """Tensor-parallel degree (heads, MLP width and vocabulary split tp ways)."""
    sp: bool = False
    """Sequence parallel: norms/dropout/residual activations split over the tp ranks."""
    pp: int = 1
    """Pipeline-parallel degree (layers split into pp stages)."""
    pp_schedule: PPSchedule = "1f1b"
    """The pipeline schedule (`config.choices.PPSchedule`)."""
    pp_virtual: int = 1
    """Model chunks (virtual stages) per pipeline rank; > 1 for 'interleaved'."""
    cp: int = 1
    """Context-parallel degree (the sequence split cp ways, ring attention)."""
    ep: int = 1
    """Expert-parallel degree (MoE experts split ep ways over dp*cp ranks; ep divides dp*cp,
    each expert shard replicated over the other dp*cp/ep ranks)."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def dp_shard(self) -> int:
        return self.dp // self.dp_replicate if self.dp_replicate else self.dp

    @property
    def zero_shards(self) -> int:
        """Ranks over which ZeRO shards model states: the shard group, and cp ranks too (the
        trainer folds cp into the FSDP mesh, as torchtitan does)."""
        return self.dp_shard * self.cp if self.zero else 1

    def pp_rank_of(self, rank: int) -> int:
        """Pipeline rank of global `rank`: the mesh is (pp, dp_replicate, dp_shard, cp, tp),
        pp outermost, so each pipeline rank holds world / pp consecutive global ranks."""
        return rank // (self.world_size // self.pp)

    def label(self) -> str:
        """The layout's one name everywhere, e.g. 'dp2 z3 tp2+sp pp8(1f1b) cp4 ep2'."""
        parts = [f"dp{self.dp}", f"z{self.zero}"]
        if self.tp > 1:
            parts.append(f"tp{self.tp}" + ("+sp" if self.sp else ""))
        if self.pp > 1:
            v = f"x{self.pp_virtual}" if self.pp_virtual > 1 else ""
            parts.append(f"pp{self.pp}({self.pp_schedule}{v})")
        parts += [
            f"{axis}{getattr(self, axis)}" for axis in ("cp", "ep") if getattr(self, axis) > 1
        ]
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def composition_problems(layout: Layout) -> list[ConfigError]:
    """The rules on how the trainer composes strategies, which need no model (also checked by
    `ParallelDims.from_layout` when it is given none)."""
    L, out = layout, []
    # pp x cp runs: the pipeline carries each cp rank's load-balanced shard through its stages
    # (parallel.pipeline, parity: tests/distributed/test_pp_cp.py)
    # ep dividing dp*cp runs: each expert shard is held by the dp*cp/ep ranks of its
    # "ep_replicate" group, which average its gradient (parallel.data_parallel.sync_gradients);
    # ZeRO-1 partitions the experts' states over that group (parallel.zero._LocalShardZero);
    # parity: tests/distributed/test_moe_tp_ep.py
    if L.ep > 1 and L.zero == 1 and L.dp_replicate > 1:
        out.append(
            ConfigError(
                "parallel.dp_replicate",
                L.dp_replicate,
                "ZeRO-1 partitions "
                "expert states over the ranks holding the same experts across "
                "all of dp*cp, not inside HSDP replica groups: set "
                "dp_replicate=1 with ep > 1 and zero 1",
            )
        )
    # tp > 1 with DDP / ZeRO-1 runs: gradients' local shards all-reduced over dp x cp
    # (parallel.data_parallel.apply_manual_grad_sync), ZeRO-1 broadcasting local shards
    # (parallel.zero._LocalShardZero); parity: tests/distributed/test_tp_ddp.py
    return out


def batch_problems(
    layout: Layout, global_batch: int, micro_batch: int, *, trainer_rules: bool = True
) -> list[ConfigError]:
    """The rules tying the batch to the layout (part of `layout_problems`; the planner's search
    checks the layout once and these per micro-batch size). trainer_rules=False drops the one
    that is torch.distributed.pipelining's own (1F1B-family orders need m >= pp; Megatron-LM,
    DeepSpeed and Nanotron run 1F1B with fewer micro-batches)."""
    L, out = layout, []
    if global_batch % (micro_batch * L.dp):
        step = micro_batch * L.dp
        out.append(
            ConfigError(
                "batch.global_batch",
                global_batch,
                f"must be a multiple of micro_batch*dp = {micro_batch}*{L.dp} = "
                f"{step}: raise it to {step * -(-global_batch // step)}"
                + (
                    f" or give a micro_batch that divides global_batch/dp = {global_batch // L.dp}"
                    if global_batch % L.dp == 0
                    else f" (or a global batch that dp={L.dp} divides)"
                ),
            )
        )
    m = max(1, grad_accum_steps(global_batch, micro_batch, L.dp))
    if trainer_rules and L.pp > 1 and L.pp_schedule != "gpipe" and m < L.pp:
        out.append(
            ConfigError(
                "batch.global_batch",
                global_batch,
                f"{L.pp_schedule} needs at least pp={L.pp} micro-batches per "
                f"step, got {m}: raise global_batch or lower micro_batch",
            )
        )
    if L.pp > 1 and L.pp_schedule == "dualpipev" and m < 2 * L.pp:
        out.append(  # torch's ScheduleDualPipeV refuses fewer micro-batches than stages
            ConfigError(
                "batch.global_batch",
                global_batch,
                f"dualpipev needs at least 2*pp={2 * L.pp} micro-batches per step (one per "
                f"stage), got {m}: raise global_batch or lower micro_batch",
            )
        )
    if L.pp > 1 and L.pp_schedule in ("interleaved", "zero-bubble") and m % L.pp:
        # torch's looped schedules run m / pp rounds of pp micro-batches
        out.append(
            ConfigError(
                "batch.global_batch",
                global_batch,
                f"{L.pp_schedule} needs micro-batches ({m}) divisible by pp={L.pp}",
            )
        )
    return out


def layout_problems(
    layout: Layout,
    model: ModelConfig,
    *,
    world_size: int | None = None,
    global_batch: int | None = None,
    micro_batch: int | None = None,
    seq_len: int | None = None,
    trainer_rules: bool = True,
) -> list[ConfigError]:
    """Every rule this layout breaks, as ConfigErrors naming field and fix (empty: legal).

    trainer_rules=False keeps only the rules of the model, the batch and the schedules (what
    any framework needs) and drops scaletrain's own composition limits (MoE x TP, the ep and
    ZeRO-1 expert rules, torch's m >= pp): the planner uses it under a foreign framework
    recipe, whose own limits are `planner.recipes.memory.recipe_problems`."""
    L = layout
    out = [
        ConfigError(f"parallel.{f}", v, "use a positive integer")
        for f in _DEGREES
        if not (isinstance(v := getattr(L, f), int) and v >= 1)
    ]
    if out:  # the rules below divide by the degrees
        return out
    out += _degree_problems(L, world_size)
    out += _tp_problems(L, model)
    out += _pp_problems(L, model)
    if seq_len is not None and L.cp > 1:
        out += _cp_problems(L, model, seq_len)
    if L.ep > 1:
        out += _ep_problems(L, model)
    if trainer_rules:
        out += composition_problems(L)
    if seq_len is not None and model.position == "learned":
        out += _failed(
            (
                seq_len <= model.max_seq_len,
                "batch.seq_len",
                seq_len,
                f"learned positions stop at model.max_seq_len={model.max_seq_len}",
            )
        )
    if global_batch is not None and micro_batch is not None:
        out += batch_problems(L, global_batch, micro_batch, trainer_rules=trainer_rules)
    return out


_DEGREES = ("dp", "dp_replicate", "tp", "pp", "pp_virtual", "cp", "ep")

_Rule = tuple[bool, str, Any, str]
"""(ok, field, value, fix): one legality rule, broken when not ok."""


def _failed(*rules: _Rule) -> list[ConfigError]:
    """The broken rules among `rules`, in order, as ConfigErrors."""
    return [ConfigError(field, value, fix) for ok, field, value, fix in rules if not ok]


def _degree_problems(L: Layout, world_size: int | None) -> list[ConfigError]:
    """ZeRO stage, schedule name, world size and HSDP replica groups."""
    rules: list[_Rule] = [
        (L.zero in names(ZeroStage), "parallel.zero", L.zero, "choose 0, 1, 2 or 3"),
        (
            L.pp_schedule in PP_SCHEDULES,
            "parallel.pp_schedule",
            L.pp_schedule,
            f"choose one of {', '.join(PP_SCHEDULES)}",
        ),
    ]
    if world_size is not None:
        rules.append(
            (
                L.world_size == world_size,
                "parallel",
                f"dp*tp*pp*cp={L.world_size}",
                f"the degrees must multiply to the world size {world_size}",
            )
        )
    rules += [
        (
            L.dp % L.dp_replicate == 0,
            "parallel.dp_replicate",
            L.dp_replicate,
            f"must divide dp={L.dp}",
        ),
        (
            L.dp_replicate == 1 or L.zero >= 1,
            "parallel.dp_replicate",
            L.dp_replicate,
            "HSDP shards within each replica group: set parallel.zero to 1, 2 or 3",
        ),
    ]
    return _failed(*rules)


def _tp_problems(L: Layout, model: ModelConfig) -> list[ConfigError]:
    """Tensor parallel splits whole heads (query and key/value) and the MLP width.

    MoE x TP runs (parallel.tensor_parallel: attention split, router replicated): with
    ep = 1 every expert's f dim is split over tp (Megatron's expert TP; ffn_dim % tp here),
    with ep > 1 experts are split whole by ep and each tp rank holds its ep rank's experts
    whole (planner: expert parameters / tp if ep == 1 else / ep, `expert_split`)."""
    return _failed(
        (
            model.num_heads % L.tp == 0,
            "parallel.tp",
            L.tp,
            f"tp must divide num_heads={model.num_heads}",
        ),
        (
            model.num_kv_heads % L.tp == 0,
            "parallel.tp",
            L.tp,
            f"tp must divide num_kv_heads={model.num_kv_heads}",
        ),
        (model.ffn_dim % L.tp == 0, "parallel.tp", L.tp, f"tp must divide ffn_dim={model.ffn_dim}"),
        (  # an MoE model's dense first blocks (DeepSeek), split like a dense MLP
            model.dense_ffn_dim % L.tp == 0,
            "parallel.tp",
            L.tp,
            f"tp must divide dense_ffn_dim={model.dense_ffn_dim}",
        ),
    )


def _pp_problems(L: Layout, model: ModelConfig) -> list[ConfigError]:
    """Pipeline: every (virtual) stage needs at least one layer, and the schedule decides
    how many stages each rank runs."""
    rules: list[_Rule] = [
        (
            L.pp * L.pp_virtual <= model.num_layers,
            "parallel.pp",
            L.pp,
            f"pp*pp_virtual must not exceed num_layers={model.num_layers}",
        )
    ]
    if L.pp_schedule == "interleaved" and L.pp > 1:
        rules.append(
            (
                L.pp_virtual >= 2,
                "parallel.pp_virtual",
                L.pp_virtual,
                "the interleaved schedule needs pp_virtual >= 2 (or use '1f1b')",
            )
        )
    if L.pp_schedule == "dualpipev" and L.pp > 1:
        rules.append(
            (
                L.pp_virtual == 2,
                "parallel.pp_virtual",
                L.pp_virtual,
                "dualpipev runs two stages per rank (a V): set pp_virtual=2",
            )
        )
        rules.append(
            (
                not model.tie_embeddings,
                "parallel.pp_schedule",
                L.pp_schedule,
                "dualpipev puts the first and the last stage on rank 0, and a tied "
                "embedding/head there is not supported yet: use 'zero-bubble' or "
                "'interleaved'",
            )
        )
    if L.pp_schedule in ("gpipe", "1f1b"):
        rules.append(
            (
                L.pp_virtual == 1,
                "parallel.pp_virtual",
                L.pp_virtual,
                f"{L.pp_schedule} runs one stage per rank: set pp_virtual=1 or use 'interleaved'",
            )
        )
    return _failed(*rules)


def _cp_problems(L: Layout, model: ModelConfig, seq_len: int) -> list[ConfigError]:
    """Context parallel (cp > 1): load-balanced causal sharding cuts the sequence into 2*cp
    chunks, and ring attention's blocks take no mask (a window shorter than the sequence
    needs one) and no soft-capping (their kernels never hold the S x S scores)."""
    return _failed(
        (
            seq_len % (2 * L.cp) == 0,
            "parallel.cp",
            L.cp,
            f"seq_len={seq_len} must be divisible by 2*cp={2 * L.cp}",
        ),
        (
            not 0 < model.sliding_window < seq_len,
            "parallel.cp",
            L.cp,
            f"ring attention has no sliding window (model.sliding_window="
            f"{model.sliding_window} < seq_len={seq_len}): use cp=1 or seq_len <= the window",
        ),
        (
            not model.attn_softcap,
            "parallel.cp",
            L.cp,
            f"ring attention has no score soft-capping (model.attn_softcap="
            f"{model.attn_softcap}, Gemma 2): use cp=1",
        ),
    )


def _ep_problems(L: Layout, model: ModelConfig) -> list[ConfigError]:
    """Expert parallel (ep > 1): whole experts per rank, ranks taken from the dp*cp group."""
    return _failed(
        (model.is_moe, "parallel.ep", L.ep, "ep > 1 needs an MoE model (model.num_experts > 0)"),
        (
            model.num_experts % L.ep == 0,
            "parallel.ep",
            L.ep,
            f"ep must divide num_experts={model.num_experts}",
        ),
        (
            (L.dp * L.cp) % L.ep == 0,
            "parallel.ep",
            L.ep,
            f"ep must divide dp*cp={L.dp * L.cp} (experts are spread over data-parallel ranks)",
        ),
    )


def check_layout(layout: Layout, model: ModelConfig, **kw: Any) -> None:
    """Raise the first problem (its message names the field and the fix); list the others too."""
    problems = layout_problems(layout, model, **kw)
    if problems:
        first = problems[0]
        if len(problems) > 1:
            rest = "; ".join(str(p) for p in problems[1:])
            raise ConfigError(first.field, first.value, f"{first.fix} (also: {rest})")
        raise first
