"""optim.name=adamw8bit (torchao) and adafactor (torch) through `build_optimizer`, their state
bytes, and the learning-rate scaling rule (`optim.lr_scaling`)."""

from __future__ import annotations

import math

import pytest
import torch

from scaletrain.config import BatchConfig, ConfigError, OptimConfig, load_config, resolve_model
from scaletrain.models import build_model, causal_lm_loss
from scaletrain.trainer.optim import (
    build_optimizer,
    lr_at,
    lr_scale,
    lr_scale_line,
    set_lr,
    state_bytes,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _steps(
    name: str, steps: int = 3, lr: float = 2e-3, **optim_fields
) -> tuple[torch.nn.Module, torch.optim.Optimizer, list[float]]:
    """`steps` optimizer steps of tiny-llama on one fixed random batch (which it memorizes)."""
    model = build_model(resolve_model("tiny-llama"), device="cpu", seed=0)
    optim = OptimConfig(name=name, lr=lr, **optim_fields)
    opt = build_optimizer(model.parameters(), optim=optim, device_type="cpu")
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(steps):
        loss = causal_lm_loss(model(x), x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return model, opt, losses


def test_adamw8bit_keeps_uint8_moments_with_one_scale_per_256_values():
    pytest.importorskip("torchao")
    model, opt, _ = _steps("adamw8bit")
    emb = model.get_parameter("tok_embeddings.weight")  # 256 x 64: quantized (>= 4096 values)
    m = opt.state[emb]["exp_avg"]
    codes, scale = m.codes, m.scale
    assert codes.dtype == torch.uint8 and codes.numel() == emb.numel()
    assert scale.dtype == torch.float32 and scale.numel() == emb.numel() // 256
    # dequantized moments track fp32 AdamW's first moment
    assert m.dequantize().abs().max() > 0
    # set_lr writes into torchao's tensor lr (a float would be refused at the next step)
    set_lr(opt, 1e-4)
    assert all(
        torch.is_tensor(g["lr"]) and g["lr"].item() == pytest.approx(1e-4) for g in opt.param_groups
    )
    opt.step()


def test_state_bytes_of_each_optimizer():
    """adamw: 8 B/param plus a step scalar per tensor; adamw8bit: 2 B + 8/256 B for quantized
    tensors (fp32 for those under 4,096 values); adafactor: a row and a column per matrix,
    and with beta1 > 0 (the default) an fp32 first moment: 4 B/param more, exactly."""
    pytest.importorskip("torchao")
    sizes, n = {}, 0
    for name, beta1 in (("adamw", 0.9), ("adamw8bit", 0.9), ("adafactor", 0.0), ("adafactor", 0.9)):
        model, opt, _ = _steps(name, steps=1, beta1=beta1)
        n = sum(p.numel() for p in model.parameters())
        sizes[name, beta1] = state_bytes(opt)
    assert 8.0 <= sizes["adamw", 0.9] / n < 8.1
    assert 2.0 < sizes["adamw8bit", 0.9] / n < 4.0  # tiny-llama's norms keep fp32 moments
    assert sizes["adafactor", 0.0] / n < 0.5
    assert sizes["adafactor", 0.9] - sizes["adafactor", 0.0] == 4 * n


@pytest.mark.parametrize(("relative", "lr", "beta1"), [(False, 2e-3, 0.9), (True, 1e-2, 0.0)])
def test_adafactor_lowers_the_loss(relative, lr, beta1):
    # the defaults (absolute step at AdamW's lr, first moment), and torch's algorithm: a
    # relative step capped at its default lr 1e-2, no first moment
    _, _, losses = _steps("adafactor", steps=6, lr=lr, relative_step=relative, beta1=beta1)
    assert losses[-1] < losses[0] - 0.1


def test_offload_is_adamw_only():
    with pytest.raises(ConfigError, match="optim.name=adamw"):
        build_optimizer(
            [torch.nn.Parameter(torch.ones(2, 2))],
            optim=OptimConfig(name="adafactor"),
            device_type="cpu",
            offload="optimizer",
        )


@pytest.mark.parametrize("scaling,expected", [("none", 1.0), ("linear", 4.0), ("sqrt", 2.0)])
def test_lr_scaling_rules(scaling, expected):
    batch = BatchConfig(global_batch=32, micro_batch=8, seq_len=256)  # 8,192 tokens per step
    optim = OptimConfig(lr=1e-3, lr_scaling=scaling, lr_reference_batch=2048, warmup_steps=0)
    assert lr_scale(optim, batch=batch) == pytest.approx(expected)
    # the whole schedule scales: the peak and the floor
    assert lr_at(0, optim=optim, batch=batch, total_steps=10) == pytest.approx(1e-3 * expected)
    floor = lr_at(10, optim=optim, batch=batch, total_steps=10)
    assert floor == pytest.approx(1e-3 * expected * optim.min_lr_ratio)
    line = lr_scale_line(optim, batch=batch)
    assert (line is None) == (scaling == "none")
    if line is not None:
        assert "8192 tokens/step vs reference 2048" in line and f"x{expected:g}" in line


def test_lr_scaling_from_the_command_line_against_the_default_reference():
    job = load_config(
        None,
        [
            "--model.name=tiny",
            "--batch.global_batch=4",
            "--batch.micro_batch=4",
            "--batch.seq_len=64",
            "--optim.lr_scaling=sqrt",
        ],
    )
    # against the default reference, the default job's 2,048 tokens per step
    assert lr_scale(job.optim, batch=job.batch) == pytest.approx(math.sqrt(256 / 2048))


def test_the_memory_ledger_counts_8bit_states_by_their_storage():
    """`local_state_bytes` (the trainer's measured optimizer bytes) counts torchao's codes and
    scales, not numel x 4 (its nominal float32 dtype): equal to `state_bytes` less the steps."""
    pytest.importorskip("torchao")
    from scaletrain.parallel import local_state_bytes

    model, opt, _ = _steps("adamw8bit", steps=1)
    steps = 4 * len(opt.state)  # one fp32 scalar `step` per parameter
    assert local_state_bytes(model, opt)["optimizer"] == state_bytes(opt) - steps
