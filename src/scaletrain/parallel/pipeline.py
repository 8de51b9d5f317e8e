"""Pipeline parallelism: stage modules cut from the model, torch.distributed.pipelining schedules.

Splitting (STYLE 3): each stage is a deep copy of the (meta or materialized) model with the
layers it does not own deleted from `layers` (a ModuleDict, so names like "layers.5.attention"
survive and `materialize` draws the single-device values), the embeddings kept only on the
first stage and `norm` + `output` only on the last. Every stage is then parallelized like a
whole model.

Balancing rule (`split_layers`): the embedding and the norm+head each weigh one transformer
layer (torchtitan's default too). The L + 2 units are spread as evenly as possible over the
S = pp·v stages; the units left over by the even division go to the middle stages first (the
end stages already carry the embedding / head), then to the ends. A stage's layer count is its
units minus the embedding / head it holds (it can be 0: a stage that is only the embedding).
This ignores the head's vocabulary-dependent cost; it is the rule the planner must use too.

Virtual stages: with v > 1 rank r holds stages r, r + pp, …, r + (v−1)·pp (interleaved,
zero-bubble); under "dualpipev" rank r holds stages r and 2·pp − 1 − r (a V: rank 0 runs the
first and the last stage, so the last stage's loss lives on pp rank 0).

Schedules: "gpipe" → ScheduleGPipe, "1f1b" → Schedule1F1B (v = 1); "interleaved" →
ScheduleInterleaved1F1B, "zero-bubble" → ScheduleInterleavedZeroBubble (v ≥ 1, any v; it runs
on gloo in 2.13, recipes/gloo_strategies.py); "dualpipev" → ScheduleDualPipeV (DeepSeek-V3's
schedule, v = 2 in a V, m >= 2·pp; split backward like zero-bubble, so no fused loss; tied
embeddings refused by `config.layout_problems`). Gradients are the mean over micro-batches
(`scale_grads=True`), i.e. the gradient of the full-batch mean loss for equal micro-batches;
the trainer's step divides each micro-batch's loss so that it is the mean over the step's
valid targets instead (`step(loss_divisor=...)`, `trainer.tokens`).

Communication buffers (`pipeline_stage.py`): the stages are torch's with receive buffers that
exist from the post of their receive until the stage consumed them, and the multi-stage
schedules' sends are let go as soon as their receiver has them (`SendLedger`), so what a rank
holds for communication follows its micro-batches in flight, not their number.

Tied embeddings (GPT-2) at pp > 1 (Megatron-LM's recipe, Narayanan et al. 2021): the first
stage keeps the embedding, the last stage gets its own `output` head initialized to the same
values (`init_weights` draws "output.weight" of a tied model as "tok_embeddings.weight"), and
after every backward the two gradients are summed over a 2-rank group (first-stage rank,
last-stage rank of each pipeline), so both copies see the tied gradient and stay bit-identical
under the same optimizer. The gradient-norm counts the tied weight once (`norm_exclude`). The
copy costs the last stage V x h parameters plus their gradients and optimizer states (the
planner's `memory.rank` counts it). MoE auxiliary losses: only the last stage computes a loss,
so every MoE layer of a stage attaches its load-balancing loss to its output's backward
(`models.moe.MoE.aux_grad_scale`, scaled like the loss: `loss_scale`); with scale_grads the
result is the mean over micro-batches of (loss + aux), as without pipelining.

Loss on the last stage (`step`, `eval_loss`): the targets go to the last stage's forward as a
keyword (torch's schedules hand `step`'s keywords to every stage of the rank, split like the
inputs), so the stage runs the model's fused chunked head + cross-entropy (`models.loss`,
vocabulary-parallel under TP) and returns the micro-batch's loss, which `staged_loss` only
scales (`loss_scale`). No (tokens x vocabulary) logits are formed, as without pipelining.
Stages without the head ignore the keyword. Not under zero-bubble (`config.fused_head_loss`):
its split backward would run the fused loss's backward twice; its last stage returns logits
to `loss_fn`, as `eval_logits` (no targets) does.

Document masking (`document_sep_id`): a stage after the first sees hidden states, not ids, so
`step` and `eval_*` compute the whole sequence's document ids and restarted positions once
(`models.documents.document_ids`) and hand them to every stage as keywords, split into
micro-batches like the inputs; each stage masks attention with them (block-causal, or ring
attention's mask under cp).

Context parallelism (`cp_group`): `step` and `eval_*` cut each sequence to this cp rank's
load-balanced shard (`cp_shard`) before the schedule splits micro-batches, so stages pass the
shard's hidden states (T/cp rows) between them and ring attention runs inside every stage over
the cp group of its pipeline rank; every stage fills in the shard's global positions itself
(`attach_cp_positions`). The last stage's loss is the shard's mean over its valid targets; the
step's `loss_divisor` weights it by the shard's count (`trainer.tokens`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from scaletrain.config import ConfigError, Layout, fused_head_loss, stage_ids, stage_layer_ranges
from scaletrain.config.choices import PPSchedule
from scaletrain.dtensor import to_full, to_local
from scaletrain.models.deepseek_moe import DeepSeekMoE
from scaletrain.models.documents import document_ids
from scaletrain.models.transformer import Transformer
from scaletrain.numerics import acc_dtype, upcast

from .pipeline_stage import InFlightStage, SendLedger

__all__ = ["PipelineRuntime", "build_pipeline", "split_layers", "stage_ids", "split_stage"]

_SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved": ScheduleInterleaved1F1B,
    "zero-bubble": ScheduleInterleavedZeroBubble,
    "dualpipev": ScheduleDualPipeV,
}
_SINGLE_STAGE = ("gpipe", "1f1b")


def split_layers(num_layers: int, num_stages: int) -> list[range]:
    """Layer indices of each stage: `scaletrain.config.stage_layer_ranges`, the rule the planner
    uses too.

    >>> split_layers(32, 4)  # units 8, 9, 9, 8 -> layers 7, 9, 9, 7
    [range(0, 7), range(7, 16), range(16, 25), range(25, 32)]
    """
    return stage_layer_ranges(num_layers, num_stages)


def split_stage(model: Transformer, stage: int, num_stages: int) -> Transformer:
    """A deep copy of `model` keeping only what stage `stage` of `num_stages` runs (a tied
    model's last stage gets a head copy, see the module docstring)."""
    keep = {str(i) for i in split_layers(len(model.layers), num_stages)[stage]}
    mod = copy.deepcopy(model)
    for name in list(mod.layers.keys()):
        if name not in keep:
            del mod.layers[name]
    if stage > 0:
        mod.tok_embeddings = None
        if mod.pos_embeddings is not None:
            mod.pos_embeddings = None
    if stage < num_stages - 1:
        mod.norm = None
        mod.output = None
    elif num_stages > 1 and _tied(model):
        if model.tok_embeddings is None:
            raise ValueError(
                "split_stage: a tied-embedding model must hold its embedding "
                "(split the whole model, not a pipeline stage of it)"
            )
        w = model.tok_embeddings.weight
        mod.output = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        mod.output.weight.requires_grad_(w.requires_grad)  # frozen with the embedding (LoRA)
    return mod


def _tied(model: Transformer) -> bool:
    return model.tie_embeddings and model.output is None


def _weight(layer: nn.Module | None, what: str) -> torch.Tensor:
    """`layer.weight` of a layer the stage must hold (an internal invariant of the split)."""
    assert layer is not None, f"tied pipeline stage without its {what}"
    w = layer.weight
    assert isinstance(w, torch.Tensor)
    return w


def _tied_pair_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """The 2-rank group (first stage's rank, last stage's rank) of this rank's pipeline. Every
    rank must create every pair group in the same order: the pairs are exchanged first."""
    ranks = dist.get_process_group_ranks(group)
    slots: list[tuple[int, int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(slots, (ranks[0], ranks[-1]))
    pairs = [p for p in slots if p is not None]
    assert len(pairs) == len(slots)  # every rank sent its pair
    mine = None
    for pair in sorted(set(pairs)):
        g = dist.new_group(list(pair))
        if pair == (ranks[0], ranks[-1]):
            mine = g
    assert mine is not None
    return mine


def _unit_scale() -> float:
    return 1.0


@dataclass
class PipelineRuntime:
    """This rank's stages and schedule; `step` runs one pipelined forward+backward."""

    stages: list[Transformer]
    """Stage modules held by this rank (parallelize / optimize these)."""
    stage_ids: list[int]
    schedule: Any
    group: dist.ProcessGroup
    num_stages: int
    _pipeline_stages: list[InFlightStage] = field(default_factory=list)
    tied_group: dist.ProcessGroup | None = None
    """Tied embeddings at pp > 1: the (first, last) stage pair whose head/embedding gradients
    are summed after every backward."""
    cp_group: dist.ProcessGroup | None = None
    """Context parallelism: the cp ranks of this pipeline rank (None: cp = 1)."""
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    """The last stage's loss of one micro-batch from its logits and targets (the schedule
    calls `staged_loss`); used when the stage returns logits (`eval_logits`)."""
    loss_scale: Callable[[], float] = _unit_scale
    """The factor `loss_fn` scales its loss by (fp16 loss scaling), applied to the fused loss
    the last stage returns when it is given the targets (`step`, `eval_loss`)."""
    fused_loss: bool = True
    """Whether `step` / `eval_loss` hand the last stage the targets (`config.fused_head_loss`:
    not under zero-bubble's split backward)."""
    last_stage_pp_rank: int = -1
    """The pp rank holding the last stage: pp − 1, or 0 under dualpipev's V (-1: pp − 1)."""
    _hooks: Any = None
    _losses_seen: int = 0
    num_microbatches: int = 1
    """Micro-batches per `step` (the schedule's; it divides the gradients by it)."""
    _divisor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    document_sep_id: int | None = None
    """Document masking (`trainer.documents`): the end-of-document id; every stage is then
    handed the micro-batch's document ids and restarted positions (`_inputs`)."""
    sends: SendLedger | None = None
    """Multi-stage schedules: the sends, let go as soon as their receiver has them
    (`pipeline_stage.SendLedger`); None for gpipe / 1f1b, which wait their own."""

    def _drain(self) -> None:
        if self.sends is not None:
            self.sends.drain()

    def staged_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss the schedule computes for each micro-batch on the last stage, inside the
        step's hooks (`trainer.step.StepHooks`: `microbatch(k)`, then the `loss:k` event)."""
        assert self.loss_fn is not None
        k, hooks = self._losses_seen, self._hooks
        self._losses_seen += 1
        if hooks is None:
            return self._loss(output, target)
        with hooks.microbatch(k):
            loss = self._loss(output, target)
        hooks.event(f"loss:{k}")
        return loss

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        assert self.loss_fn is not None
        if output.dim() == 0:  # the stage's fused head + loss (given the targets)
            scale = self.loss_scale()
            loss = output if scale == 1.0 else output * scale
        else:
            loss = self.loss_fn(output, target)
        if self._divisor is None:
            return loss
        # the schedule divides the gradients by the micro-batch count (scale_grads): the
        # divisor's share of it is put back (equal counts: divisor M, loss / 1, as before)
        return loss / (self._divisor(target, loss) / self.num_microbatches)

    def _tied_weights(self) -> list[torch.Tensor]:
        """This rank's copies of the tied weight: the embedding (first stage) and/or the head
        copy (last stage). Read at call time: parallelize/materialize may replace them."""
        out = []
        for sid, mod in zip(self.stage_ids, self.stages, strict=True):
            if sid == 0:
                out.append(_weight(mod.tok_embeddings, "embedding"))
            if sid == self.num_stages - 1:
                out.append(_weight(mod.output, "head copy"))
        return out

    @property
    def norm_exclude(self) -> list[torch.Tensor]:
        """Parameters the gradient norm must not count (the tied head copy: counted once, on
        the first stage)."""
        if self.tied_group is None or not self.is_last:
            return []
        return [_weight(self.stages[self.stage_ids.index(self.num_stages - 1)].output, "head copy")]

    def sync_tied_gradients(self) -> None:
        """Sum the embedding's and the head copy's gradients over the tied pair."""
        if self.tied_group is None:
            return
        for w in self._tied_weights():
            if w.grad is not None:
                g = w.grad
                dist.all_reduce(to_local(g), group=self.tied_group)

    def _inputs(self, inputs: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
        """The schedule's positional inputs (the ids, on the first stage) and the keywords every
        stage is given: with document masking, the (B, T) document ids of the whole sequence
        and the positions restarted per document (cp-sharded; the schedule splits both into
        micro-batches like the ids). A later stage sees hidden states, from which no document
        boundary can be read, so the ids' boundaries travel with it as keywords."""
        shard = self._cp_shard(inputs)
        args = (shard,) if self.is_first else ()
        if self.document_sep_id is None:
            return args, {}
        docs, positions = document_ids(inputs, self.document_sep_id)
        return args, {"documents": docs, "positions": self._cp_shard(positions)}

    def _cp_shard(self, x: torch.Tensor) -> torch.Tensor:
        """This cp rank's load-balanced shard of (B, T) ids or targets (cp = 1: x)."""
        if self.cp_group is None:
            return x
        from .context_parallel import cp_shard

        return cp_shard(x, dist.get_rank(self.cp_group), dist.get_world_size(self.cp_group))

    @property
    def is_first(self) -> bool:
        return 0 in self.stage_ids

    @property
    def is_last(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def step(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        hooks: Any = None,
        loss_divisor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Forward+backward of the batch (split into micro-batches along dim 0).

        Returns the mean micro-batch loss on every pp rank (computed on the last stage and
        broadcast, for logging); gradients accumulate in the stage modules. `hooks`
        (`trainer.step.StepHooks`) see each micro-batch's loss on the last stage.
        `loss_divisor(targets, loss)`: what micro-batch k's loss (over its, cp-sharded,
        `targets`) is divided by (`trainer.tokens`: the step's mean over valid targets); the
        returned mean is then the sum of the divided losses. None: the plain mean.
        """
        device = inputs.device
        (args, doc_kw), targets = self._inputs(inputs), self._cp_shard(targets)
        losses: list[torch.Tensor] = []
        self._hooks, self._losses_seen = hooks, 0
        self._divisor = loss_divisor
        try:
            # return_outputs=False: the last stage would otherwise keep every micro-batch's
            # logits until the step ends (m x s x b x V values; the trainer needs the losses)
            self.schedule.step(
                *args,
                target=targets if self.is_last else None,
                losses=losses if self.is_last else None,
                return_outputs=False,
                **self._fused_targets(targets),
                **doc_kw,
            )
        finally:
            self._hooks, self._divisor = None, None
        self._drain()
        self.sync_tied_gradients()
        return self._mean_loss(losses, device)

    @torch.no_grad()
    def eval_loss(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        loss_divisor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Forward only (the schedule's `eval`: no backward actions, no gradients) of a batch
        split into the step's micro-batches; the mean micro-batch loss on every pp rank, or
        with `loss_divisor` (as `step`'s) the sum of the divided losses (`trainer.evaluation`:
        1 / n, the batch's summed token loss)."""
        (args, doc_kw), targets = self._inputs(inputs), self._cp_shard(targets)
        losses: list[torch.Tensor] = []
        self._divisor = loss_divisor
        try:
            self.schedule.eval(
                *args,
                target=targets if self.is_last else None,
                losses=losses if self.is_last else None,
                return_outputs=False,
                **self._fused_targets(targets),
                **doc_kw,
            )
        finally:
            self._divisor = None
        self._drain()
        return self._mean_loss(losses, inputs.device)

    def _fused_targets(self, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """The keyword that makes the last stage compute its fused head + loss (see the module
        docstring); none on a rank without the last stage."""
        return {"targets": targets} if self.is_last and self.fused_loss else {}

    @torch.no_grad()
    def eval_logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """Forward only of a batch split into the step's micro-batches; the last stage's
        logits of the FIRST sequence (1, T, V), broadcast to every pp rank (the loss the
        schedule computes on dummy targets is discarded)."""
        seq_len = inputs.shape[1]
        args, doc_kw = self._inputs(inputs)
        inputs = self._cp_shard(inputs)
        dummy = torch.zeros(inputs.shape, dtype=torch.long, device=inputs.device)
        out = self.schedule.eval(
            *args, target=dummy if self.is_last else None, return_outputs=True, **doc_kw
        )
        self._drain()
        if self.is_last:
            out = to_full(out)
            logits = self._cp_gather(upcast(out[:1]).contiguous())
            vocab = torch.tensor(logits.shape[-1], device=inputs.device)
        else:
            vocab = torch.zeros((), dtype=torch.long, device=inputs.device)
        dist.broadcast(vocab, src=self._last_stage_rank, group=self.group)
        if not self.is_last:
            logits = torch.empty(1, seq_len, int(vocab), device=inputs.device)
        dist.broadcast(logits, src=self._last_stage_rank, group=self.group)
        return logits

    def _cp_gather(self, logits: torch.Tensor) -> torch.Tensor:
        """The whole sequence's logits from every cp rank's shard (cp = 1: logits)."""
        if self.cp_group is None:
            return logits
        from .context_parallel import cp_unshard

        shards = [torch.empty_like(logits) for _ in range(dist.get_world_size(self.cp_group))]
        dist.all_gather(shards, logits, group=self.cp_group)
        return cp_unshard(shards)

    @property
    def _last_stage_rank(self) -> int:
        """Global rank of the pp rank holding the last stage (pp-1, also when interleaved; 0
        under dualpipev)."""
        last = self.last_stage_pp_rank
        return dist.get_global_rank(
            self.group, last if last >= 0 else dist.get_world_size(self.group) - 1
        )

    def _mean_loss(self, losses: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        """The last stage's mean micro-batch loss, broadcast to every pp rank: fp32, float64
        where float64 is the default dtype (every rank must agree on it without asking)."""
        dtype = acc_dtype(torch.get_default_dtype())
        if self.is_last:
            loss = torch.stack([x.detach().to(dtype) for x in losses]).mean()
        else:
            loss = torch.zeros((), dtype=dtype, device=device)
        dist.broadcast(loss, src=self._last_stage_rank, group=self.group)
        return loss


class _Stage(InFlightStage):
    """The in-flight-buffer stage (`pipeline_stage.InFlightStage`), whose metadata inference
    runs with the DeepSeek routers' load counting paused: torch 2.13 infers a stage's shapes
    (DYNAMIC mode, the first step) by running the stage's real forward, with gradients on, on
    the first micro-batch's inputs (empty tensors past the first stage). That forward is not a
    training forward; its expert counts would enter the first step's balancing-bias update
    (`models.deepseek_moe.DeepSeekMoE.count_load`). The override wraps torch's private method,
    calling it unchanged."""

    def _forward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
        routers = [m for m in self.submod.modules() if isinstance(m, DeepSeekMoE)]
        for m in routers:
            m.count_load = False
        try:
            return super()._forward_metadata_inference(*args, **kwargs)
        finally:
            for m in routers:
                m.count_load = True


def build_pipeline(
    model: Transformer,
    *,
    pp_group,
    pp_rank: int,
    pp_size: int,
    schedule: PPSchedule,
    virtual: int,
    n_microbatches: int,
    loss_fn,
    device: torch.device | str,
    parallelize_stage=None,
    loss_scale=lambda: 1.0,
    schedule_cls: Any = None,
    cp_group=None,
) -> PipelineRuntime:
    """Split `model` into this rank's stages and build the named schedule.

    pp_group: ProcessGroup or 1-D DeviceMesh of the pipeline axis. `parallelize_stage`, if
    given, is applied to each stage module (e.g. TP/FSDP + materialize) before the
    PipelineStage wraps it. `loss_scale()`: the factor `loss_fn` scales the loss by (fp16 loss
    scaling), applied to the MoE auxiliary losses the stages attach. `schedule_cls` replaces
    torch's schedule class for `schedule` (same constructor and `step` signature; the dry-run
    passes `dryrun.torch_compat.ActionSchedule`, which runs under fake tensors). `cp_group`:
    ProcessGroup or 1-D DeviceMesh of this rank's cp axis (None or size 1: no cp).
    """
    from .context_parallel import attach_cp_positions

    cp = cp_group.get_group() if hasattr(cp_group, "get_group") else cp_group
    if cp is not None and dist.get_world_size(cp) == 1:
        cp = None
    if schedule not in _SCHEDULES:
        raise ConfigError("parallel.pp_schedule", schedule, f"use one of {sorted(_SCHEDULES)}")
    if schedule in _SINGLE_STAGE and virtual != 1:
        raise ConfigError(
            "parallel.pp_virtual",
            virtual,
            f"{schedule} runs one stage per rank: use pp_virtual=1 or the "
            "'interleaved' / 'zero-bubble' schedules",
        )
    group = pp_group if isinstance(pp_group, dist.ProcessGroup) else pp_group.get_group()
    num_stages = pp_size * virtual
    ids = stage_ids(pp_rank, pp_size, virtual, schedule=schedule)
    device = torch.device(device)
    mods: list[Transformer] = []
    pstages: list[InFlightStage] = []
    for sid in ids:
        mod = split_stage(model, sid, num_stages)
        for sub in mod.modules():
            if hasattr(sub, "aux_grad_scale"):  # MoE layers (see the module docstring)
                sub.aux_grad_scale = loss_scale
        if parallelize_stage is not None:
            mod = parallelize_stage(mod) or mod
        if cp is not None:
            attach_cp_positions(mod, dist.get_rank(cp), dist.get_world_size(cp))
        mods.append(mod)
        pstages.append(_Stage(mod, sid, num_stages, device, group=group))
    tied = _tied_pair_group(group) if num_stages > 1 and _tied(model) else None
    runtime = PipelineRuntime(
        stages=mods,
        stage_ids=ids,
        schedule=None,
        group=group,
        num_stages=num_stages,
        _pipeline_stages=pstages,
        tied_group=tied,
        loss_fn=loss_fn,
        loss_scale=loss_scale,
        cp_group=cp,
        num_microbatches=n_microbatches,
        fused_loss=fused_head_loss(Layout(pp=pp_size, pp_schedule=schedule)),
        last_stage_pp_rank=0 if schedule == "dualpipev" and pp_size > 1 else pp_size - 1,
    )
    cls = schedule_cls or _SCHEDULES[schedule]
    runtime.schedule = cls(
        pstages[0] if schedule in _SINGLE_STAGE else pstages,
        n_microbatches,
        loss_fn=runtime.staged_loss,
        scale_grads=True,
    )
    if schedule_cls is None and schedule not in _SINGLE_STAGE and pp_size > 1:
        runtime.sends = SendLedger(runtime.schedule, pp_rank)
        runtime.sends.attach(runtime.schedule)
    return runtime
