"""The step's loss and gradient are the mean over the global batch's valid targets
(`scaletrain.trainer.tokens`), one process: the trainer's `train_step` over 4 micro-batches
with 16, 3, 0 and 9 valid targets gives the float64 gradient of the global token mean; with
equal counts it gives bit for bit what the per-micro-batch mean (`loss / accum`) gave. The
validation loss (`trainer.evaluation.evaluate`) is the same global token mean."""

from __future__ import annotations

import torch

from scaletrain.models import build_model
from scaletrain.trainer.build import build_run
from scaletrain.trainer.step import train_step

from ..adam_tolerance import float64_default
from ..token_loss import (
    assert_grads_close,
    eval_loss,
    global_batch,
    job,
    reference_grads,
    step_grads,
)


def test_unequal_masks_over_micro_batches_give_the_global_token_mean(tmp_path):
    cfg = job(str(tmp_path))
    got, ref = step_grads(cfg), reference_grads(cfg)
    assert_grads_close(got, ref, "accum 4")
    # the defect this fixes: the mean of the micro-batches' means is another gradient
    means = reference_grads(cfg, valid=(16, 16, 16, 16))
    assert abs(got["loss"] - means["loss"]) > 1e-3


def test_equal_masks_give_the_per_micro_batch_mean_bit_for_bit(tmp_path):
    cfg = job(str(tmp_path))
    valid = (5, 5, 5, 5)
    got = step_grads(cfg, valid)
    with float64_default():
        model = build_model(cfg.model, device="cpu", seed=cfg.train.seed)
        inputs, targets = global_batch(cfg.model.vocab_size, valid)
        losses = []
        for k in range(4):  # what the step did before token weighting
            loss = model(inputs[k : k + 1], targets=targets[k : k + 1])
            (loss / 4).backward()
            losses.append(loss.detach())
    for name, p in model.named_parameters():
        assert torch.equal(got["grads"][name], p.grad), name
    assert got["loss"] == float(sum(losses, torch.zeros((), dtype=torch.float64)) / 4)


def test_a_step_without_valid_targets_has_loss_and_gradient_zero(tmp_path):
    cfg = job(str(tmp_path))
    got = step_grads(cfg, valid=(0, 0, 0, 0))
    assert got["loss"] == 0.0
    assert all(not g.any() for g in got["grads"].values())


def test_the_fp32_step_keeps_fp32(tmp_path):
    run = build_run(job(str(tmp_path)), data=False)
    inputs, targets = global_batch(run.job.model.vocab_size)
    micro = [(inputs[k : k + 1], targets[k : k + 1]) for k in range(4)]
    train_step(run, iter(micro))
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in run.params)


def test_the_validation_loss_is_the_mean_over_valid_targets(tmp_path):
    """4 eval batches with 16, 3, 0 and 9 valid targets: the float64 mean over the 28 tokens,
    not the mean of the batches' means (which also averages in the empty batch's 0)."""
    cfg = job(str(tmp_path))
    ref = reference_grads(cfg)["loss"]  # F.cross_entropy over the whole batch's valid targets
    got = eval_loss(cfg)
    assert got is not None and abs(got - ref) <= 1e-12 * ref
    with float64_default():
        model = build_model(cfg.model, device="cpu", seed=cfg.train.seed)
        inputs, targets = global_batch(cfg.model.vocab_size)
        means = [float(model(inputs[k : k + 1], targets=targets[k : k + 1])) for k in range(4)]
    assert abs(got - sum(means) / 4) > 1e-2  # the defect: another number
    assert eval_loss(cfg, valid=(0, 0, 0, 0)) is None  # nothing to score


def test_with_equal_masks_the_validation_loss_is_the_mean_of_batch_means(tmp_path):
    cfg = job(str(tmp_path))
    valid = (5, 5, 5, 5)
    with float64_default():
        model = build_model(cfg.model, device="cpu", seed=cfg.train.seed)
        inputs, targets = global_batch(cfg.model.vocab_size, valid)
        means = [float(model(inputs[k : k + 1], targets=targets[k : k + 1])) for k in range(4)]
    got = eval_loss(cfg, valid)
    assert got is not None and abs(got - sum(means) / 4) <= 1e-12 * got
