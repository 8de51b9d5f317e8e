"""The planner's optimizer-state bytes per parameter for adamw8bit and adafactor, what `explain`
says of them, and the search proposing only layouts the trainer runs for each optimizer."""

from __future__ import annotations

import pytest

from scaletrain.cli import main
from scaletrain.config import hardware_preset, resolve_model
from scaletrain.planner import OPTIMIZER_BYTES
from scaletrain.planner.search.layouts import search


def test_state_bytes_per_parameter_table():
    assert OPTIMIZER_BYTES["adamw"] == 8.0
    # one uint8 code per moment + one fp32 absmax per 256 values per moment
    assert OPTIMIZER_BYTES["adamw8bit"] == pytest.approx(2 + 8 / 256)
    # a row and a column of fp32 per 1024 x 1024 matrix
    assert OPTIMIZER_BYTES["adafactor"] == pytest.approx(4 * 2048 / 1024**2)


@pytest.mark.parametrize(
    "name,shown", [("adamw8bit", "optimizer 2.031 (m and v uint8"), ("adafactor", "row and column")]
)
def test_explain_shows_the_optimizer_states(tmp_path, capsys, name, shown):
    cfg = tmp_path / "job.toml"
    cfg.write_text(f'[optim]\nname = "{name}"\n')
    main(["explain", "--config", str(cfg), "--model", "llama3-8b", "--gpus", "8", "--zero", "1"])
    out = capsys.readouterr().out
    assert f"bytes/param (fp32, {name}," in out and shown in out


def test_search_keeps_adafactor_off_fsdp_and_offload_to_adamw():
    model, hw = resolve_model("llama3-8b"), hardware_preset("h100-sxm")
    res = search(model, hw, 8, seq_len=2048, global_batch=64, top_k=200, optimizer="adafactor")
    assert res.top and all(e.plan.layout.zero <= 1 and e.plan.layout.tp == 1 for e in res.top)
    assert all(e.plan.offload != "optimizer" for e in res.top)
