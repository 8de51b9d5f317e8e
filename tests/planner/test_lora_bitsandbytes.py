"""bitsandbytes' 4-bit layers under a QLoRA plan (`PlanInput.lora_quantizer` 'bitsandbytes',
`memory.lora.bnb_saved_input_bytes` / `bnb_dequantize_work_bytes`): what MatMul4Bit keeps for
backward and the dequantized copies it makes, against the LitGPT rows that state it."""

from __future__ import annotations

import copy
import tomllib
from dataclasses import replace
from importlib import resources

import pytest

from scaletrain.config import ConfigError, model_preset
from scaletrain.config.lora import tp_shapes
from scaletrain.planner import estimate
from scaletrain.planner.memory.lora import (
    LORA_QUANTIZERS,
    bnb_dequantize_work_bytes,
    bnb_saved_input_bytes,
    bnb_stored_bytes_per_value,
    stored_bytes_per_value,
)
from scaletrain.planner.recipes.published import CORPUS, load_runs, parse_runs, plan_input


@pytest.fixture(scope="module")
def runs():
    return load_runs()


def test_stored_bytes_plain_and_double_quantized() -> None:
    # Fabric's 'nf4': 4-bit codes and an fp32 absmax per 64 values
    assert bnb_stored_bytes_per_value(4096, 4096, False) == 0.5 + 4 / 64
    # 'nf4-dq': int8 absmaxes, an fp32 factor per 256 of them and their fp32 mean: the paper's
    # layout, as the native NF4 counts it up to its per-tensor code book
    dq = bnb_stored_bytes_per_value(4096, 4096, True)
    assert dq == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256), rel=1e-6)
    assert dq == pytest.approx(stored_bytes_per_value("nf4", 4096, 4096), rel=1e-4)


def test_saved_inputs_are_the_four_matmul_inputs() -> None:
    m = model_preset("llama2-7b")
    tokens = 2 * 512
    # the fused q/k/v input, the output projection's input, the MLP input, w2's input (f)
    want = 2.0 * tokens * (3 * m.dim + m.ffn_dim)
    assert bnb_saved_input_bytes(m, tokens, "bf16") == want
    # fp32 compute keeps 4-byte inputs
    assert bnb_saved_input_bytes(m, tokens, "fp32") == 2 * want


def test_dequantize_is_fp16_plus_its_cast_of_the_largest_linear_head_included() -> None:
    m = model_preset("llama2-7b")
    head = m.vocab_size * m.dim
    assert head > m.dim * m.ffn_dim  # the head is the largest quantized linear here
    assert bnb_dequantize_work_bytes(m, "bf16") == 4.0 * head  # fp16 copy + its bf16 cast
    assert bnb_dequantize_work_bytes(m, "fp16") == 2.0 * head  # no cast in fp16
    tied = replace(m, tie_embeddings=True)  # a tied head is no Linear of its own
    assert bnb_dequantize_work_bytes(tied, "bf16") == 4.0 * m.dim * m.ffn_dim


def test_qlora_rows_state_the_quantizer_and_plan_its_terms(runs) -> None:
    rows = [r for r in runs if r.framework == "litgpt" and r.lora is not None]
    q = [r for r in rows if r.lora.base_dtype == "nf4"]
    assert q and all(r.lora_quantizer == "bitsandbytes" for r in q)
    assert all(r.lora_quantizer == "native" for r in rows if r.lora.base_dtype != "nf4")
    # other frameworks' QLoRA rows (torchtune's torchao NF4Tensor) stay 'native'
    assert all(r.lora_quantizer == "native" for r in runs if r.framework != "litgpt")
    r = next(r for r in q if r.name == "litgpt-a10g-tinyllama-qlora-r32-all")
    p = plan_input(r)
    assert p.lora_quantizer == "bitsandbytes"
    bnb, native = estimate(p).memory, estimate(replace(p, lora_quantizer="native")).memory
    m = p.model
    tokens = p.seq_len * p.micro_batch
    # every block's activations grow by the inputs MatMul4Bit keeps (ac none, one device)
    grown = bnb.activations - native.activations
    assert grown == pytest.approx(m.num_layers * bnb_saved_input_bytes(m, tokens, "bf16"))
    assert bnb.buffer_terms["lora_dequantize"] == pytest.approx(
        bnb_dequantize_work_bytes(m, "bf16")
    )
    # the blocks' projections at rest: an fp32 absmax per 64 values, not the double-quantized
    frozen = m.num_layers * sum(
        r * c for r, c in (sh.weight for sh in tp_shapes(m, p.lora_rank, 1).values())
    )
    plain = bnb_stored_bytes_per_value(4096, 4096, False)
    dq = bnb_stored_bytes_per_value(4096, 4096, True)
    assert bnb.params - native.params == pytest.approx(
        frozen * (plain - stored_bytes_per_value("nf4", 4096, 4096)), rel=1e-3
    )
    dqm = estimate(replace(p, lora_quantizer="bitsandbytes-dq")).memory
    assert bnb.params - dqm.params == pytest.approx(frozen * (plain - dq), rel=1e-3)
    assert dqm.activations == bnb.activations  # the same matmul either way


def test_quantizer_is_checked_on_load() -> None:
    raw = tomllib.loads(resources.files("scaletrain.planner").joinpath(CORPUS).read_text())
    i = next(
        i for i, r in enumerate(raw["runs"]) if r["name"] == "litgpt-a10g-llama2-7b-qlora-r32-qv"
    )
    for bad, base in (("bnb", "nf4"), ("bitsandbytes", "bf16")):
        data = copy.deepcopy(raw)
        data["runs"][i]["lora"] = {"rank": 8, "targets": ["wq"], "base_dtype": base}
        data["runs"][i]["lora"]["quantizer"] = bad
        with pytest.raises(ConfigError, match=r"\.lora\.quantizer = .* is invalid"):
            parse_runs(data, "corpus.toml")
    assert LORA_QUANTIZERS == ("native", "bitsandbytes", "bitsandbytes-dq")
