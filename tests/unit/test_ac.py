"""Activation checkpointing: same gradients as no checkpointing, clean names and state dicts."""

from __future__ import annotations

import pytest
import torch

from scaletrain.config import ModelConfig, model_preset
from scaletrain.models import build_model, causal_lm_loss, clean_fqn, materialize, moe_aux_loss
from scaletrain.parallel.ac import apply_ac

CFGS = {
    "gpt2-naive": lambda: ModelConfig(
        vocab_size=61, dim=32, num_layers=2, num_heads=4, max_seq_len=32, attention="naive"
    ),
    "llama-sdpa": lambda: model_preset(
        "tiny-llama", vocab_size=61, dim=32, ffn_dim=48, max_seq_len=32
    ),
    "moe": lambda: model_preset("tiny-moe", vocab_size=61, dim=32, ffn_dim=40, max_seq_len=32),
}


def _grads(cfg_name: str, mode: str):
    model = build_model(CFGS[cfg_name]())
    apply_ac(model, mode)
    materialize(model, device="cpu", seed=4)  # AC before materialize, as parallelize() does
    tokens = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(1))
    logits = model(tokens)
    loss = causal_lm_loss(logits[:, :-1], tokens[:, 1:]) + moe_aux_loss(model)
    loss.backward()
    return model, loss.detach(), {clean_fqn(n): p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("cfg_name", list(CFGS))
@pytest.mark.parametrize("mode", ["selective", "full"])
def test_ac_gradients_match_no_ac(cfg_name, mode):
    ref_model, ref_loss, ref = _grads(cfg_name, "none")
    model, loss, got = _grads(cfg_name, mode)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=0)
    assert got.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-6, rtol=0, msg=name)
    # Blocks keep their names, state dict keys stay those of the plain model.
    assert list(model.layers.keys()) == list(ref_model.layers.keys())
    assert model.state_dict().keys() == ref_model.state_dict().keys()
    assert type(model.layers["0"]).__name__ == "CheckpointWrapper"


def test_state_dict_round_trips_through_wrapped_model():
    plain = build_model(CFGS["llama-sdpa"](), device="cpu", seed=1)
    wrapped = build_model(CFGS["llama-sdpa"](), device="cpu", seed=2)
    apply_ac(wrapped, "full")
    wrapped.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 61, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(wrapped(tokens), plain(tokens), atol=0, rtol=0)


def test_none_is_noop_and_bad_mode_raises():
    model = build_model(CFGS["gpt2-naive"]())
    before = [type(m) for m in model.modules()]
    apply_ac(model, "none")
    assert [type(m) for m in model.modules()] == before
    with pytest.raises(ValueError, match="selective"):
        apply_ac(model, "some")


def _activation_bytes(mode: str, cfg_name: str) -> int:
    # Bytes of activations alive after one forward (what backward will read), tracked by
    # torch's MemTracker: selective AC keeps its saved op outputs in the checkpoint's own
    # cache, which saved-tensor hooks do not see.
    from torch.distributed._tools.mem_tracker import MemTracker

    model = build_model(CFGS[cfg_name](), device="cpu")
    apply_ac(model, mode)
    tokens = torch.randint(0, 61, (2, 32))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        loss = model(tokens, targets=tokens)
        snap = tracker.get_tracker_snapshot()
    assert loss.requires_grad
    return sum(
        v for per_device in snap.values() for k, v in per_device.items() if str(k).endswith("ACT")
    )


@pytest.mark.parametrize("cfg_name", ["gpt2-naive", "llama-sdpa"])
def test_ac_saves_less_activation_memory(cfg_name):
    none, selective, full = (_activation_bytes(m, cfg_name) for m in ("none", "selective", "full"))
    assert full < selective < none
