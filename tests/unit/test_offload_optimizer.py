"""Optimizer-state offload (`memory.offload=optimizer`): CPUOffloadAdamW == torch's AdamW."""

from __future__ import annotations

import copy

import pytest
import torch

from scaletrain.config import (
    ConfigError,
    Layout,
    MemoryConfig,
    OptimConfig,
    PrecisionConfig,
    resolve_model,
)
from scaletrain.models import build_model, causal_lm_loss
from scaletrain.parallel import ParallelDims, parallelize
from scaletrain.trainer.optim import CPUOffloadAdamW, build_optimizer

pytestmark = pytest.mark.usefixtures("one_thread")

KW = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _train(opt_cls, steps=3, **kw):
    model = build_model(resolve_model("tiny-llama"), device="cpu", seed=0)
    opt = opt_cls(model.parameters(), **KW, **kw)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randint(0, 256, (2, 16), generator=g)
        causal_lm_loss(model(x), x).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_offloaded_adamw_equals_torch_adamw_bitwise():
    ref, _ = _train(torch.optim.AdamW, fused=True)
    got, opt = _train(CPUOffloadAdamW)
    for (name, a), b in zip(ref.named_parameters(), got.parameters(), strict=True):
        assert torch.equal(a, b), name
    # the moments live in host memory, in fp32
    st = next(iter(opt.state.values()))
    assert st["exp_avg"].device.type == "cpu" and st["exp_avg"].dtype == torch.float32


def test_state_dict_round_trip_continues_exactly():
    model, opt = _train(CPUOffloadAdamW, steps=2)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    osd = copy.deepcopy(opt.state_dict())  # torch's load keeps the very tensors it is given
    twin = build_model(resolve_model("tiny-llama"), device="cpu", seed=1)
    twin.load_state_dict(sd)
    topt = CPUOffloadAdamW(twin.parameters(), **KW)
    topt.load_state_dict(osd)
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))
    for m, o in ((model, opt), (twin, topt)):
        causal_lm_loss(m(x), x).backward()
        o.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
    assert all(v.device.type == "cpu" for st in topt.state.values() for v in st.values())


def test_offload_needs_adamw_and_plain_parameters():
    model = build_model(resolve_model("tiny"), device="cpu")
    with pytest.raises(ConfigError, match="memory.offload"):
        build_optimizer(
            model.parameters(),
            optim=OptimConfig(name="sgd"),
            device_type="cpu",
            offload="optimizer",
        )
    dims = ParallelDims.from_layout(Layout(dp=2, zero=3), 2)
    with pytest.raises(ConfigError, match="memory.offload=params"):
        parallelize(
            build_model(resolve_model("tiny"), device="meta"),
            dims,
            precision=PrecisionConfig(),
            memory=MemoryConfig(offload="optimizer"),
        )
