"""Rank functions of the token-weighted loss tests (module-level: `spawn` pickles them).

`step_grads` builds the trainer's run for a layout in float64, feeds this rank its share of a
fixed global batch whose micro-batches have deliberately unequal numbers of valid targets, runs
the trainer's own `train_step` once and returns the logged loss and every gradient, whole and by
clean name (`reference_grads`: the same from one process, for the tests to compare).
`eval_loss` runs the trainer's validation (`trainer.evaluation.evaluate`) on the same batches.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from scaletrain.checkpoint.peft import export_peft_adapters
from scaletrain.config import JobConfig, load_config
from scaletrain.models import build_model, clean_fqn
from scaletrain.trainer.build import build_run
from scaletrain.trainer.evaluation import evaluate
from scaletrain.trainer.step import apply_update, train_step

from .adam_tolerance import float64_default

SEQ_LEN, NUM_SEQS = 16, 4
VALID = (16, 3, 0, 9)
"""Valid targets of each sequence (the rest is an SFT-style masked prompt): 28 of 64."""


def job(
    tmp: str,
    seqs_per_micro: int = 1,
    lora: dict | None = None,
    model: dict | None = None,
    memory: dict | None = None,
    **parallel,
) -> JobConfig:
    return load_config(
        None,
        {
            "model": {"name": "tiny-llama", **(model or {})},
            "memory": memory or {},
            "lora": lora or {},
            "parallel": parallel,
            "batch": {
                "seq_len": SEQ_LEN,
                "micro_batch": seqs_per_micro,
                "global_batch": NUM_SEQS,
            },
            "optim": {"grad_clip": 0.0},
            "train": {"run_dir": tmp, "device": "cpu"},
            "hardware": {"gpu": "cpu"},
        },
    )


def global_batch(vocab: int, valid: tuple[int, ...] = VALID) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), (NUM_SEQS, SEQ_LEN) each; sequence i keeps its last valid[i] targets."""
    g = torch.Generator().manual_seed(7)
    seq = torch.randint(0, vocab, (NUM_SEQS, SEQ_LEN + 1), generator=g)
    inputs, targets = seq[:, :-1], seq[:, 1:].clone()
    for i, n in enumerate(valid):
        targets[i, : SEQ_LEN - n] = -100
    return inputs, targets


def _name(name: str) -> str:
    return re.sub(r"^stage\d+\.", "", clean_fqn(name))


def step_grads(
    cfg: JobConfig, valid: tuple[int, ...] = VALID, steps: int = 1, export: str | None = None
) -> dict:
    """`steps` `train_step`s + updates of `cfg`'s layout on this rank's micro-batches (the same
    ones each step), float64: the last step's logged loss and {clean name: whole gradient} of
    the trainable parameters this rank holds, {clean name: whole value} of them after its
    update, and the names of the parameters holding a gradient (before the update) and
    optimizer states (after it). `export`: then write the LoRA adapters there (PEFT's files)."""
    with float64_default():
        run = build_run(cfg, data=False)
        micro = _rank_batches(run, cfg, valid)
        named = [(_name(n), p) for n, p in run.model.named_parameters()]
        trained = [(name, p) for name, p in named if p.requires_grad]
        for _ in range(steps):
            out = train_step(run, iter(micro))
            grads = {name: _whole(p.grad) for name, p in trained}
            with_grad = {name for name, p in named if p.grad is not None}
            apply_update(run, out)
        if export is not None:  # LoRA: the adapters in PEFT's format, as the loop writes them
            pp = run.pipeline.group if run.pipeline is not None else None
            export_peft_adapters(run.model, cfg.model, cfg.lora, export, pp_group=pp)
        return {
            "loss": out.loss,
            "grads": grads,
            "params": {n: _whole(p) for n, p in trained},
            "with_grad": with_grad,  # every parameter holding a gradient, trainable or not
            "with_state": {name for name, p in named if p in run.optimizer.state},
        }


def _rank_batches(run, cfg: JobConfig, valid: tuple[int, ...]) -> list:
    """This dp rank's micro-batches of the fixed global batch (its rows, in order)."""
    inputs, targets = global_batch(cfg.model.vocab_size, valid)
    mb = cfg.batch.micro_batch
    per_rank = NUM_SEQS // run.dims.layout.dp
    first = run.dims.dp_rank * per_rank
    return [(inputs[i : i + mb], targets[i : i + mb]) for i in range(first, first + per_rank, mb)]


def eval_loss(cfg: JobConfig, valid: tuple[int, ...] = VALID) -> float | None:
    """The trainer's validation loss (`trainer.evaluation.evaluate`) of `cfg`'s layout at its
    initial weights over this rank's micro-batches of the fixed global batch, float64."""
    with float64_default():
        run = build_run(cfg, data=False)
        return evaluate(run, _rank_batches(run, cfg, valid))


def eval_many(cfgs: dict[str, JobConfig]) -> dict[str, float | None]:
    """`eval_loss` of each named layout in turn on the same process group."""
    return {name: eval_loss(cfg) for name, cfg in cfgs.items()}


def _whole(t: torch.Tensor | None) -> torch.Tensor:
    assert t is not None
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def reference_grads(cfg: JobConfig, valid: tuple[int, ...] = VALID) -> dict:
    """The float64 gradient of the mean cross-entropy over the global batch's valid targets,
    one process, one forward over the whole batch (the logits path)."""
    with float64_default():
        model = build_model(cfg.model, device="cpu", seed=cfg.train.seed)
        inputs, targets = global_batch(cfg.model.vocab_size, valid)
        logits = model(inputs)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        grads = {clean_fqn(n): p.grad for n, p in model.named_parameters()}
        return {"loss": float(loss.detach()), "grads": grads}


def step_many(
    cfgs: dict[str, JobConfig], steps: int = 1, export: str | None = None
) -> dict[str, dict]:
    """`step_grads` of each named layout in turn on the same process group (`export`: each
    layout's adapters written to export/name)."""
    return {
        name: step_grads(cfg, steps=steps, export=None if export is None else f"{export}/{name}")
        for name, cfg in cfgs.items()
    }


def assert_grads_close(got: dict, ref: dict, where: str, rel: float = 1e-12) -> None:
    """Every gradient within `rel` x its largest reference element (float64 sums of <= 1e3
    terms: n u ~ 1e-13), and the logged loss within `rel` relative."""
    assert abs(got["loss"] - ref["loss"]) <= rel * abs(ref["loss"]), (where, got["loss"])
    for name, g in got["grads"].items():
        r = ref["grads"][name]
        err = float((g - r).abs().max())
        bound = rel * float(r.abs().max())
        assert err <= bound, f"{where} {name}: max error {err:.3e} > {bound:.3e}"
