"""Delayed-scaling state in checkpoints: the amax histories are part of a Float8Linear's state
dict, so saving and loading an fp8 model (plain state dicts or scaletrain's DCP checkpoints)
reproduces the next step bit for bit; without them the resumed step differs (the control)."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from scaletrain.checkpoint import load_checkpoint, save_checkpoint
from scaletrain.config import resolve_model
from scaletrain.models import build_model, causal_lm_loss
from scaletrain.precision import Float8Linear, apply_fp8

HISTORY = 4

pytestmark = pytest.mark.usefixtures("one_thread")


def _batch(step: int) -> torch.Tensor:
    # A learnable stream whose scale of activations changes from step to step (the stride), so
    # the amax windows differ between a fresh and a resumed history.
    base = torch.arange(17)
    return torch.stack([(base * (s + step) + 7 * s) % 256 for s in range(1, 5)])


def _fresh(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = build_model(resolve_model("tiny-llama"), device="cpu", seed=seed)
    apply_fp8(model, amax="delayed", history_len=HISTORY, backend="scaletrain")
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> torch.Tensor:
    data = _batch(step)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(data[:, :-1])
    loss = causal_lm_loss(logits, data[:, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


def _after_next_step(
    model: nn.Module, opt: torch.optim.Optimizer, step: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = _step(model, opt, step)
    return loss, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_identical(a: tuple, b: tuple) -> None:
    assert torch.equal(a[0], b[0])
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        assert torch.equal(a[1][k], b[1][k]), k


def _differs(a: tuple, b: tuple) -> bool:
    return not torch.equal(a[0], b[0]) or any(not torch.equal(a[1][k], b[1][k]) for k in a[1])


def _trained(steps: int = 3) -> tuple[nn.Module, torch.optim.Optimizer]:
    model, opt = _fresh(0)
    for step in range(steps):
        _step(model, opt, step)
    return model, opt


def test_delayed_histories_are_in_the_state_dict_and_current_adds_nothing() -> None:
    model, _ = _trained(2)
    sd = model.state_dict()
    fp8 = [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]
    assert {f"{n}._extra_state" for n in fp8} <= sd.keys()
    st = model.get_submodule(fp8[0]).fp8_state
    packed = sd[f"{fp8[0]}._extra_state"]  # rows x, w, dy: [num_recorded, history...]
    assert packed.shape == (3, 1 + HISTORY) and packed[:, 0].tolist() == [2, 2, 2]
    assert torch.equal(packed[0, 1:].float(), st.x.history)

    plain = build_model(resolve_model("tiny-llama"), device="cpu")
    keys = list(plain.state_dict())
    apply_fp8(plain, backend="scaletrain")  # current scaling: exactly nn.Linear's keys
    assert list(plain.state_dict()) == keys
    plain.load_state_dict(sd)  # a delayed run's histories are dropped, not an error
    with pytest.raises(RuntimeError, match="_extra_state"):
        _fresh(1)[0].load_state_dict(plain.state_dict())  # missing histories: strict says so
    with pytest.raises(RuntimeError, match="history_len"):
        other = build_model(resolve_model("tiny-llama"), device="cpu")
        apply_fp8(other, amax="delayed", history_len=HISTORY + 1, backend="scaletrain")
        other.load_state_dict(sd)


def test_state_dict_round_trip_reproduces_the_next_step_exactly() -> None:
    model, opt = _trained()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    want = _after_next_step(model, opt, 3)

    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed, ropt = _fresh(1)  # other init: everything must come from the checkpoint
    resumed.load_state_dict(saved["model"])
    ropt.load_state_dict(saved["optim"])
    _assert_identical(_after_next_step(resumed, ropt, 3), want)

    # Control: the same weights and optimizer without the histories (a fresh amax window)
    # give a different step, so the equality above is the histories' doing.
    no_hist, nopt = _fresh(1)
    no_hist.load_state_dict(
        {k: v for k, v in saved["model"].items() if not k.endswith("_extra_state")}, strict=False
    )
    nopt.load_state_dict(saved["optim"])
    assert _differs(_after_next_step(no_hist, nopt, 3), want)


def test_dcp_checkpoint_round_trip_reproduces_the_next_step_exactly(tmp_path) -> None:
    model, opt = _trained()
    path = save_checkpoint(tmp_path, 3, model, opt, trainer_state={"step": 3}, extra={})
    want = _after_next_step(model, opt, 3)
    resumed, ropt = _fresh(1)
    load_checkpoint(path, resumed, ropt)
    _assert_identical(_after_next_step(resumed, ropt, 3), want)
