"""`plan`, `explain` and `dryrun` take `--section.key=value` overrides as `train` does: parsed
and checked by the same code (`config.parse_overrides`, `load_config`), over the job TOML and
the `--hardware` file, a field given both as a flag and as an override refused, and an override
no plan reads named in one note."""

from __future__ import annotations

import dataclasses
import json

import pytest

from scaletrain.cli import _parser, main
from scaletrain.config import JobConfig, Layout, load_config
from scaletrain.planner.types import PLANNED_FIELDS, plan_input_from_job

MOE = ["--model", "tiny-moe", "--gpus", "4"]
CAPACITY = ["--model.moe_capacity_factor=1.25", "--model.moe_pad_to_capacity=true"]


def _out(capsys, argv: list[str]) -> str:
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def _one_error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and not captured.out, err
    return err


@pytest.mark.parametrize("pin", [[], ["--ep", "2"]], ids=["search", "exact"])
def test_an_override_plans_as_the_toml_would(tmp_path, capsys, pin):
    """Byte-identical `plan --json` from the override and from the same value in a TOML,
    searched and pinned; and the value changes the plan (padded capacity: E*C rows)."""
    toml = tmp_path / "moe.toml"
    toml.write_text("[model]\nmoe_capacity_factor = 1.25\nmoe_pad_to_capacity = true\n")
    by_flag = _out(capsys, ["plan", *MOE, *pin, "--json", *CAPACITY])
    by_file = _out(capsys, ["plan", *MOE, *pin, "--json", "--config", str(toml)])
    without = _out(capsys, ["plan", *MOE, *pin, "--json"])
    assert by_flag == by_file
    assert by_flag != without


def test_parallel_overrides_pin_the_layout_as_a_toml_does(tmp_path, capsys):
    toml = tmp_path / "tp.toml"
    toml.write_text("[parallel]\ntp = 2\n")
    by_file = _out(capsys, ["plan", *MOE, "--json", str(toml)])
    assert by_file == _out(capsys, ["plan", *MOE, "--json", "--parallel.tp=2"])
    assert '"tp": 2' in by_file


def test_an_override_wins_over_the_toml(tmp_path, capsys):
    toml = tmp_path / "job.toml"
    toml.write_text("[model]\nmoe_capacity_factor = 0.5\n\n[parallel]\ntp = 2\n")
    over = ["--model.moe_capacity_factor=1.25", "--model.moe_pad_to_capacity=true"]
    both = _out(capsys, ["plan", *MOE, "--json", str(toml), *over, "--parallel.tp=1"])
    assert both == _out(capsys, ["plan", *MOE, "--json", *over])


def test_the_search_carries_model_and_precision_overrides_into_every_candidate():
    """Every layout the search ranks is planned with the overridden model and precision
    (the search's candidates share one job: `planner.search.layouts._Job`)."""
    from scaletrain.cli import plan as plan_cli

    argv = ["plan", *MOE, "--precision", "fp32"]
    overrides = [*CAPACITY, "--precision.tf32=false", "--memory.loss_chunk_tokens=32"]
    parser, _ = _parser(argv)
    inp = plan_cli._inputs(parser.parse_args(argv), overrides)
    assert not inp["exact"]
    result = plan_cli._search(inp, top_k=10_000)
    assert len(result.top) > 100  # the whole ranked list, not only the best
    for est in result.top:
        p = est.plan
        assert p.model.moe_capacity_factor == 1.25 and p.model.moe_pad_to_capacity
        assert p.precision == "fp32" and p.hardware.tf32 is False
        assert p.loss_chunk_tokens == 32


@pytest.mark.parametrize("verb", ["plan", "explain", "dryrun"])
def test_an_unknown_field_is_one_line_naming_it(capsys, verb):
    err = _one_error_line(capsys, [verb, *MOE, "--model.moe_capacity_factr=1.25"])
    assert "model.moe_capacity_factr" in err and "did you mean 'moe_capacity_factor'" in err


@pytest.mark.parametrize("verb", ["plan", "explain", "dryrun"])
def test_a_bad_value_is_one_line_naming_the_field(capsys, verb):
    err = _one_error_line(capsys, [verb, *MOE, "--model.moe_capacity_factor=lots"])
    assert "model.moe_capacity_factor = 'lots'" in err


def test_an_unknown_section_and_a_rule_broken_are_one_line(capsys):
    assert "unknown section" in _one_error_line(capsys, ["plan", *MOE, "--modle.dim=64"])
    # a value the field's own rule refuses (padding needs a capacity), named by its field
    err = _one_error_line(capsys, ["explain", *MOE, "--model.moe_pad_to_capacity=true"])
    assert err.startswith("scaletrain explain: error: model.moe_pad_to_capacity")


def test_an_override_layout_error_names_the_field_not_the_flag(capsys):
    err = _one_error_line(capsys, ["explain", *MOE, "--parallel.tp=3"])
    assert "parallel.tp" in err and "--tp" not in err
    err = _one_error_line(capsys, ["explain", *MOE, "--tp", "3"])
    assert "--tp" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--tp", "2", "--parallel.tp=2"],
        ["--tp", "4", "--parallel.tp", "2"],
        ["--model", "tiny-llama", "--model.name=tiny-moe"],
    ],
)
def test_a_field_given_as_flag_and_override_is_refused(capsys, argv):
    err = _one_error_line(capsys, ["plan", "--gpus", "4", *argv])
    assert "given twice" in err
    field = next(a for a in argv if a.startswith("--") and "." in a).split("=")[0][2:]
    assert f"error: {field} = " in err


def test_an_override_no_plan_reads_is_named_in_one_note(capsys):
    out = _out(capsys, ["plan", *MOE, "--top", "1", "--optim.lr=0.1", "--train.steps=3"])
    notes = [ln for ln in out.splitlines() if "not planned" in ln]
    assert len(notes) == 1 and "optim.lr, train.steps" in notes[0]
    # under --json the note goes to stderr, so stdout stays one JSON document
    assert main(["plan", *MOE, "--top", "1", "--json", "--guard.window=50"]) == 0
    captured = capsys.readouterr()
    assert "not planned: guard.window (" in captured.err
    assert captured.out.lstrip().startswith("[")
    # fields the plan reads raise no note
    assert "not planned" not in _out(capsys, ["plan", *MOE, "--top", "1", *CAPACITY])


def test_other_unknown_arguments_are_still_refused(capsys):
    assert "--frobnicate" in _one_error_line(capsys, ["plan", *MOE, "--frobnicate"])


class _Reads:
    """A job section that records which of its fields are read."""

    def __init__(self, name: str, obj: object, seen: set[str]) -> None:
        self._name, self._obj, self._seen = name, obj, seen
        self._fields = {f.name for f in dataclasses.fields(obj)}  # type: ignore[arg-type]

    def __getattr__(self, key: str) -> object:
        if key in self._fields:
            self._seen.add(f"{self._name}.{key}")
        return getattr(self._obj, key)


def _fields_read(job: JobConfig) -> set[str]:
    seen: set[str] = set()
    proxy = type("Job", (), {})()
    for f in dataclasses.fields(job):
        value = getattr(job, f.name)
        setattr(proxy, f.name, value if f.name == "model" else _Reads(f.name, value, seen))
    proxy.hardware_spec = lambda: JobConfig.hardware_spec(proxy)  # type: ignore[attr-defined]
    plan_input_from_job(proxy, Layout())  # type: ignore[arg-type]
    return seen


def test_planned_fields_are_what_plan_input_from_job_reads():
    """`PLANNED_FIELDS` (what the 'not planned' note trusts) against the fields
    `plan_input_from_job` reads from two jobs: fp8 (fp8_all_gather is read under fp8 only)
    and LoRA (its fields are read only with adapters)."""
    fp8 = load_config(None, ["--precision.dtype=fp8", "--precision.fp8_all_gather=true"])
    lora = load_config(None, ["--model.name=tiny-llama", "--lora.rank=4"])
    seen = _fields_read(fp8) | _fields_read(lora)
    for name in seen:
        section, key = name.split(".")
        assert {"*", key} & PLANNED_FIELDS.get(section, frozenset()), (
            f"{name} is read but not in PLANNED_FIELDS"
        )
    listed = {
        f"{s}.{k}"
        for s, keys in PLANNED_FIELDS.items()
        for k in keys
        if s not in ("parallel", "hardware", "model")  # read through the layout / spec
    }
    # lora.targets is read through LoraConfig.target_names
    assert listed - seen == {"lora.targets"}


def _dryrun_job(argv: list[str], overrides: list[str]) -> tuple[JobConfig, int]:
    from scaletrain.cli import dryrun as dryrun_cli

    parser, _ = _parser(["dryrun", *argv])
    return dryrun_cli.job_from_args(parser.parse_args(["dryrun", *argv]), overrides)


def test_dryrun_builds_the_job_the_toml_would(tmp_path):
    toml = tmp_path / "moe.toml"
    toml.write_text(
        "[model]\nmoe_capacity_factor = 1.25\nmoe_pad_to_capacity = true\n\n"
        "[parallel]\nzero = 3\n\n[optim]\nlr = 0.01\n"
    )
    by_file = _dryrun_job([*MOE, "--config", str(toml)], [])
    by_flag = _dryrun_job(MOE, [*CAPACITY, "--parallel.zero=3", "--optim.lr=0.01"])
    assert by_flag == by_file
    assert by_flag[0].model.moe_capacity_factor == 1.25 and by_flag[0].optim.lr == 0.01


def test_precedence_toml_then_hardware_file_then_command_line(tmp_path):
    toml = tmp_path / "job.toml"
    toml.write_text("[hardware]\nefficiency = 0.2\npue = 1.5\n")
    hw = tmp_path / "hw.toml"
    hw.write_text("[hardware]\nefficiency = 0.3\n")
    job, _ = _dryrun_job(
        [*MOE, "--config", str(toml), "--hardware", str(hw)], ["--hardware.pue=1.1"]
    )
    assert (job.hardware.efficiency, job.hardware.pue) == (0.3, 1.1)
    job, _ = _dryrun_job(
        [*MOE, "--config", str(toml), "--hardware", str(hw)], ["--hardware.efficiency=0.4"]
    )
    assert job.hardware.efficiency == 0.4


def test_fields_plan_used_to_drop_are_planned(capsys):
    """precision.fp8_all_gather, memory.loss_chunk_tokens (search: the candidates test above)
    and parallel.dp_replicate reach the planner, from an override as from a TOML."""
    fp8 = ["plan", "--model", "tiny-llama", "--gpu", "h100-sxm", "--gpus", "4"]
    fp8 += ["--precision", "fp8", "--json"]
    gather = ["--precision.fp8_all_gather=true"]
    # E4M3 all-gathers move half the bf16 bytes: a shorter exposed communication
    on = json.loads(_out(capsys, [*fp8, "--dp", "4", "--zero", "3", *gather]))
    off = json.loads(_out(capsys, [*fp8, "--dp", "4", "--zero", "3"]))
    assert on["time"]["comm_exposed_s"] < off["time"]["comm_exposed_s"]
    # ... and the search keeps the trainer's rule: no fp8 all-gather under tensor parallelism
    searched = json.loads(_out(capsys, [*fp8, "--top", "1000", *gather]))
    assert searched and all(e["plan"]["tp"] == 1 for e in searched)
    assert any(e["plan"]["tp"] > 1 for e in json.loads(_out(capsys, [*fp8, "--top", "1000"])))
    # HSDP: ZeRO-3 over 2 of the 4 ranks holds more parameter and optimizer state per rank
    base = ["plan", "--model", "tiny-llama", "--gpus", "4", "--json", "--parallel.zero=3"]
    hsdp = json.loads(_out(capsys, [*base, "--parallel.dp_replicate=2"]))
    fsdp = json.loads(_out(capsys, base))
    assert hsdp["memory"]["optimizer"] == 2 * fsdp["memory"]["optimizer"]


def test_an_exact_layout_keeps_the_trainers_option_rules(capsys):
    """The pinned layout is held to `option_problems` as the search's candidates are: fp8
    all-gathers with tensor parallelism, optimizer-only offload under FSDP."""
    fp8 = ["plan", "--model", "tiny-llama", "--gpu", "h100-sxm", "--gpus", "4"]
    err = _one_error_line(
        capsys,
        [*fp8, "--precision", "fp8", "--tp", "2", "--zero", "3", "--precision.fp8_all_gather=1"],
    )
    assert "error: precision.fp8_all_gather = True" in err
    err = _one_error_line(
        capsys, ["plan", *MOE, "--dp", "4", "--zero", "3", "--offload", "optimizer"]
    )
    assert "error: --offload = 'optimizer'" in err


@pytest.mark.parametrize(
    "bad",
    [
        "--model.moe_capacity_factr=1.25",
        "--model.moe_capacity_factor=lots",
        "--model.moe_drop_policy=random",
        "--precision.tf32=maybe",
        "--optim.lr=-1",
    ],
)
def test_a_bad_override_is_the_same_line_in_plan_dryrun_and_train(capsys, bad):
    """The same parser and checks: the error after 'scaletrain VERB: error: ' is train's."""
    job = ["--model.name=tiny-moe", bad]
    lines = {
        verb: _one_error_line(capsys, [verb, *job]).split(": error: ", 1)[1]
        for verb in ("train", "plan", "explain", "dryrun")
    }
    assert len(set(lines.values())) == 1, lines
    assert bad[2:].split("=")[0] in lines["train"]
