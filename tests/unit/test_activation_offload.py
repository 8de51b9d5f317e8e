"""Activation offload (`memory.offload` = 'activations' / '...+activations',
`trainer.activation_offload`): the step's losses, gradients and updated parameters are
bit-identical with and without it (the saved tensors are copied out and back, nothing else
changes), the hooks do copy what autograd saves and leave parameters alone, the dry-run sees
the device peak fall and the host bytes appear, and what cannot run with it is refused."""

from __future__ import annotations

import pytest
import torch

from scaletrain.config import ConfigError, MemoryConfig, load_config
from scaletrain.dryrun import dryrun
from scaletrain.trainer.activation_offload import ActivationOffload
from scaletrain.trainer.build import build_run
from scaletrain.trainer.step import apply_update, train_step

from ..token_loss import global_batch


def _job(tmp_path, offload: str, **extra):
    return load_config(
        None,
        {
            "model": {"name": "tiny-llama"},
            "memory": {"offload": offload},
            "batch": {"seq_len": 16, "micro_batch": 1, "global_batch": 4},
            "train": {"run_dir": str(tmp_path), "device": "cpu"},
            "hardware": {"gpu": "cpu"},
            **extra,
        },
    )


def _steps(job, steps: int = 2) -> dict:
    run = build_run(job, data=False)
    inputs, targets = global_batch(job.model.vocab_size)
    micro = [(inputs[k : k + 1], targets[k : k + 1]) for k in range(4)]
    losses, grads = [], {}
    for _ in range(steps):
        out = train_step(run, iter(micro))
        losses.append(out.loss)
        grads = {n: p.grad.clone() for n, p in run.model.named_parameters() if p.grad is not None}
        apply_update(run, out)
    params = {n: p.detach().clone() for n, p in run.model.named_parameters() if p.requires_grad}
    return {"losses": losses, "grads": grads, "params": params}


@pytest.mark.parametrize(
    ("without", "with_"),
    [("none", "activations"), ("optimizer", "optimizer+activations")],
)
@pytest.mark.parametrize("lora", [{}, {"rank": 4, "base_dtype": "nf4"}])
def test_offload_changes_nothing_but_where_activations_wait(tmp_path, without, with_, lora):
    a = _steps(_job(tmp_path / "a", without, lora=lora))
    b = _steps(_job(tmp_path / "b", with_, lora=lora))
    assert a["losses"] == b["losses"]
    assert a["grads"].keys() == b["grads"].keys() and a["grads"]
    for n, g in a["grads"].items():
        assert torch.equal(g, b["grads"][n]), n
    for n, p in a["params"].items():
        assert torch.equal(p, b["params"][n]), n


def test_saved_tensors_are_copied_out_and_parameters_are_not():
    offload = ActivationOffload(torch.device("cpu"), pin=False)
    w = torch.nn.Parameter(torch.randn(3, 3))
    x = torch.randn(4, 3, requires_grad=True)
    with offload():
        s = (x * 2.0).sin()
        y = (s @ w).sum() + torch.nn.functional.linear(x, w).sum()
    mm = y.grad_fn.next_functions[0][0].next_functions[0][0]  # (s @ w): saved s and w
    assert mm._saved_self.data_ptr() != s.data_ptr()  # a copy came back
    assert torch.equal(mm._saved_self, s)
    assert mm._saved_mat2.data_ptr() == w.data_ptr()  # the parameter: not copied
    linear = y.grad_fn.next_functions[1][0].next_functions[0][0]
    assert linear._saved_mat2.data_ptr() == w.data_ptr()  # F.linear's view w.t(): not copied
    y.backward()
    expected = 2.0 * (2 * x).cos() * w.sum(dim=1) + w.sum(dim=0)
    torch.testing.assert_close(x.grad, expected, rtol=1e-6, atol=1e-6)


def test_dry_run_moves_the_activations_to_the_host(tmp_path):
    def measure(offload: str):
        job = load_config(
            None,
            {
                "model": {"name": "tiny-llama"},
                "memory": {"offload": offload},
                "parallel": {"dp": 2, "zero": 3, "layout": "manual"},
                "batch": {"seq_len": 128, "micro_batch": 4, "global_batch": 8},
                "hardware": {"gpu": "h100-sxm"},
            },
        )
        return dryrun(job, world_size=2, count_flops=False).memory

    on, off = measure("activations"), measure("none")
    assert "host.activations" not in off.detail
    host = on.detail["host.activations"]
    assert on.total < off.total and host > off.total - on.total > 0


@pytest.mark.parametrize("ac", ["full", "selective"])
def test_activation_offload_with_checkpointing_is_refused(ac):
    with pytest.raises(ConfigError) as e:
        MemoryConfig(ac=ac, offload="activations")
    assert e.value.field == "memory.offload"


def test_a_view_saved_twice_is_copied_once():
    """h * h saves h twice (as self and other): one host copy serves both."""
    offload = ActivationOffload(torch.device("cpu"), pin=False)
    x = torch.randn(3, 3, requires_grad=True)
    with offload():
        h = x * 1.0
        sq = h * h
    assert sq.grad_fn._saved_self.data_ptr() == sq.grad_fn._saved_other.data_ptr()
    assert sq.grad_fn._saved_self.data_ptr() != h.data_ptr()  # a copy, shared
    sq.sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach(), rtol=0, atol=1e-6)
