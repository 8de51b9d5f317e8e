"""`plan` for a named real model (#41, #39 item 5): it plans the model's own sequence length and a
realistic global batch (printed as derived notes, with their sources) and recommends the layout
the seeds' rule of thumb would: plain DP when the model fits; ZeRO, then TP, PP only when
needed (`search.SIMPLER_LAYOUT_MARGIN`)."""

from __future__ import annotations

import pytest

from scaletrain.cli import main
from scaletrain.config import hardware_preset, resolve_model
from scaletrain.config.run_defaults import run_defaults
from scaletrain.planner.search.layouts import SIMPLER_LAYOUT_MARGIN, complexity, search

# (model, GPUs, card, the sequence length and global batch it must assume, what the rule of
# thumb recommends: 'ddp' plain data parallelism, 'zero' a ZeRO stage and no model parallelism)
PAIRS = [
    # 8B x 16 B/param = 128 GB: plain DP cannot fit an 80 GB card; sharded states do
    ("llama3-8b", 16, "a100-80gb", 8192, 256, "zero"),
    # 1.56B x 16 B/param = 25 GB: fits each card, so plain DP
    ("gpt2-1.5b", 8, "a100-80gb", 1024, 1024, "ddp"),
    ("llama2-7b", 8, "h100-sxm", 4096, 512, "zero"),
]


def _flat(text: str) -> str:
    return " ".join(text.split())  # notes wrap at the terminal's width


@pytest.mark.parametrize(("model", "gpus", "gpu", "seq", "gb", "rule"), PAIRS)
def test_plan_assumes_the_models_run_and_picks_the_rule_of_thumb(
    capsys: pytest.CaptureFixture[str],
    model: str,
    gpus: int,
    gpu: str,
    seq: int,
    gb: int,
    rule: str,
) -> None:
    assert main(["plan", "--model", model, "--gpus", str(gpus), "--gpu", gpu, "--top", "3"]) == 0
    raw = capsys.readouterr().out
    out = _flat(raw)
    assert f"note: batch.seq_len = {seq} (derived: {model}'s context length" in out
    assert f"note: batch.global_batch = {gb} (derived:" in out
    assert "Brown et al. 2020 Table 2.1" in out  # the batch's source is printed
    label = next(line for line in raw.splitlines() if line.startswith("best: "))[6:]
    tokens = label.split()
    assert not any(t.startswith(("tp", "pp", "cp")) for t in tokens), label
    zero = next(int(t[1:]) for t in tokens if t.startswith("z") and t[1:].isdigit())
    assert (zero == 0) if rule == "ddp" else (zero > 0), label


@pytest.mark.parametrize(("model", "gpus", "gpu", "seq", "gb", "rule"), PAIRS)
def test_the_pick_is_the_simplest_layout_within_the_margin(
    model: str, gpus: int, gpu: str, seq: int, gb: int, rule: str
) -> None:
    """The search's own guarantee on the same pairs: the pick is within the margin of the
    fastest layout and no layout as fast (within the margin) is simpler."""
    cfg = resolve_model(model)
    d = run_defaults(cfg)
    assert d is not None and (d.seq_len, d.global_batch) == (seq, gb)
    res = search(cfg, hardware_preset(gpu), gpus, seq_len=seq, global_batch=gb, top_k=200)
    assert res.best is not None and res.fastest is not None
    limit = res.fastest.time.step_s * (1 + SIMPLER_LAYOUT_MARGIN)
    assert res.best.time.step_s <= limit

    def cx(e):  # type: ignore[no-untyped-def]
        return complexity(e.plan.layout, e.plan.offload)

    assert all(cx(res.best) <= cx(e) for e in res.top if e.time.step_s <= limit)


def test_toy_models_keep_the_embedded_job() -> None:
    """The tiny presets are below REAL_MODEL_PARAMS: no planning defaults of their own."""
    assert run_defaults(resolve_model("tiny")) is None
    long = run_defaults(resolve_model("qwen2.5-7b"))  # 131,072 context: capped
    assert long is not None and long.seq_len == 8192 and "capped" in long.seq_why
