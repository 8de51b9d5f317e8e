"""The console summary's text: a sample from an untrained byte-level model is arbitrary bytes."""

from scaletrain.trainer.report import printable


def test_printable_escapes_control_characters_and_keeps_text():
    raw = "the cat\tsat\n\x1b[2J\x07\x00 caf\u00e9 \ufffd"
    out = printable(raw)
    assert out == "the cat\tsat\n\\x1b[2J\\x07\\x00 caf\u00e9 \ufffd"
    assert all(c.isprintable() or c in "\n\t" for c in out)
    assert printable("plain text") == "plain text"


def test_memory_ledger_compares_resident_state_with_resident_state():
    """The planner's peak-moment params/grads include FSDP units gathered and reduced in flight;
    the ledger must compare the resident shards, which is what a run measures. tiny-moe at
    dp2 ZeRO-3 ep2 (fp8): each rank holds half the dense parameters and half the experts
    (FSDP leaves expert-parallel experts alone), in fp32 — 127,392 elements, exactly."""
    from scaletrain.config import Layout, load_config
    from scaletrain.planner import estimate
    from scaletrain.planner.types import plan_input_from_job
    from scaletrain.trainer.report import ledger_table

    job = load_config(
        None, ["--model.name=tiny-moe", "--precision.dtype=fp8", "--batch.global_batch=32"]
    )
    layout = Layout(dp=2, zero=3, ep=2)
    planned = estimate(plan_input_from_job(job, layout)).memory
    assert planned.detail["params.in_flight"] > 0  # the peak holds gathered units
    experts = 2 * 3 * 4 * 128 * 64  # layers x (w1, w2, w3) x experts x ffn x dim
    dense = 254_784 - experts
    local = 4 * (dense // 2 + experts // 2)
    assert local == 509_568
    assert planned.params - planned.detail["params.in_flight"] == local
    assert planned.grads - planned.detail["grads.in_flight"] == local
    text = ledger_table(planned, {"params": local, "grads": local, "optimizer": 2 * local})
    rows = {line.split()[0]: line.split() for line in text.splitlines()[1:]}
    assert rows["params"][-1] == "+0%" and rows["grads"][-1] == "+0%"
    assert rows["optimizer"][-1] == "+0%"
    assert "in flight" in text
