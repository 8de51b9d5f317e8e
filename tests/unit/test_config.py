"""scaletrain.config: presets, loading, overrides and every error path naming its field."""

import json

import pytest

from scaletrain.config import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    ConfigError,
    Layout,
    hardware_preset,
    layout_problems,
    load_config,
    model_from_hf_config,
    model_preset,
)

# Parameter counts as their publishers state them (HF model cards / papers).
PUBLISHED = {
    "gpt2-124m": 124_439_808,
    "gpt2-350m": 354_823_168,
    "gpt2-774m": 774_030_080,
    "gpt2-1.5b": 1_557_611_200,
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
}


@pytest.mark.parametrize("name,count", sorted(PUBLISHED.items()))
def test_preset_parameter_counts_match_publishers(name, count):
    assert model_preset(name).num_params() == count


def test_gpt3_is_175b_class_and_moe_active_params():
    assert 174e9 < model_preset("gpt3-175b").num_params() < 176e9
    mix = model_preset("mixtral-8x7b")
    pc = mix.param_counts()
    active = (
        pc.embedding
        + pc.head
        + pc.final_norm
        + mix.num_layers * pc.active_per_layer(mix.experts_per_token)
    )
    assert 12.8e9 < active < 13.0e9  # Mixtral paper: ~12.9B active parameters per token


def test_all_presets_validate_and_unknown_lists_valid_names():
    for name in MODEL_PRESETS:
        assert model_preset(name).num_params() > 0
    with pytest.raises(ConfigError, match="model.name") as e:
        model_preset("llama9-1t")
    assert "llama3-8b" in str(e.value)
    with pytest.raises(ConfigError, match="hardware.gpu"):
        hardware_preset("tpu-v9")


def test_hardware_presets_have_all_figures():
    for name in HARDWARE_PRESETS:
        hw = hardware_preset(name)
        assert hw.memory_bytes > 0 and hw.memory_bw > 0 and hw.power_w > 0
        assert hw.intra_node_bw >= hw.inter_node_bw > 0
        assert hw.flops("bf16") >= hw.flops("fp32") > 0
    h100 = hardware_preset("h100-sxm")
    assert h100.flops("fp8") == pytest.approx(2 * h100.flops("bf16"), rel=1e-3)
    assert hardware_preset("v100-32gb").flops("bf16") == 125e12  # falls back to fp16 tensor


def test_toml_and_overrides(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        '[model]\nname = "tiny-llama"\nnum_layers = 4\n[train]\nsteps = 7\n'
        "[batch]\nglobal_batch = 8\nmicro_batch = 2\nseq_len = 64\n"
    )
    job = load_config(cfg, ["--train.steps=11", "--optim.lr", "3e-4", "--train.compile=true"])
    assert job.model.name == "tiny-llama" and job.model.num_layers == 4
    assert job.train.steps == 11 and job.optim.lr == 3e-4 and job.train.compile is True
    assert job.batch.global_batch == 8
    layout = job.layout(2)
    assert layout.dp == 2 and layout.world_size == 2


def test_hf_config_json_loads_llama_gpt2_mixtral(tmp_path):
    llama = {
        "model_type": "llama",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "intermediate_size": 11008,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    gpt2 = {
        "model_type": "gpt2",
        "vocab_size": 50257,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_positions": 1024,
    }
    mixtral = {
        "model_type": "mixtral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "rope_theta": 1e6,
    }
    counts = {}
    for name, hf in {"llama": llama, "gpt2": gpt2, "mixtral": mixtral}.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(hf))
        counts[name] = model_from_hf_config(tmp_path / f"{name}.json").num_params()
    assert counts == {
        "llama": PUBLISHED["llama2-7b"],
        "gpt2": PUBLISHED["gpt2-124m"],
        "mixtral": PUBLISHED["mixtral-8x7b"],
    }
    job = load_config(None, ["--model.name", str(tmp_path / "gpt2.json"), "--batch.seq_len=64"])
    assert job.model.num_params() == PUBLISHED["gpt2-124m"]
    (tmp_path / "bert.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ConfigError, match="model.name"):
        model_from_hf_config(tmp_path / "bert.json")


# every user error names its field
ERRORS = [
    (["--train.steps=0"], "train.steps"),
    (["--train.stepz=3"], "train.stepz"),
    (["--optim.lr=-1"], "optim.lr"),
    (["--optim.name=lion"], "optim.name"),
    (["--optim.beta2=1.5"], "optim.beta2"),
    (["--optim.lr_scaling=cubic"], "optim.lr_scaling"),
    (["--optim.lr_scaling=sqrt", "--optim.lr_reference_batch=0"], "optim.lr_reference_batch"),
    (["--optim.lr_reference_batch=-5"], "optim.lr_reference_batch"),
    (["--precision.dtype=fp4"], "precision.dtype"),
    (["--memory.ac=some"], "memory.ac"),
    (["--memory.offload=disk"], "memory.offload"),
    (["--batch.global_batch=10", "--batch.micro_batch=4"], "batch.global_batch"),
    (["--batch.seq_len=0"], "batch.seq_len"),
    (["--batch.seq_len=4096"], "batch.seq_len"),  # beyond gpt-mini's learned positions
    (["--parallel.zero=4"], "parallel.zero"),
    (["--parallel.pp_schedule=dualpipe"], "parallel.pp_schedule"),
    (["--parallel.tp=0"], "parallel.tp"),
    (["--data.tokenizer=sentencepiece"], "data.tokenizer"),
    (["--data.source=/does/not/exist.txt"], "data.source"),
    (["--hardware.gpu=tpu"], "hardware.gpu"),
    (["--model.num_heads=3"], "model.num_heads"),
    (["--model.name=nope"], "model.name"),
    (["--model.flavour=x"], "model.flavour"),
    (["--train.steps=abc"], "train.steps"),
    (["--train.compile=maybe"], "train.compile"),
    (["--wrong.key=1"], "wrong"),
    (["train.steps=3"], "override"),
    (["--checkpoint.keep_last_n=0"], "checkpoint.keep_last_n"),
    (["--precision.fp8_amax=history"], "precision.fp8_amax"),
    (["--precision.fp8_amax=delayed", "--precision.fp8_scaling=tilewise"], "precision.fp8_amax"),
    (["--precision.fp8_history_len=0"], "precision.fp8_history_len"),
    (["--precision.fp8_matmul=emulate"], "precision.fp8_matmul"),
    (["--precision.fp8_backend=ao"], "precision.fp8_backend"),
    (
        ["--precision.fp8_backend=torchao", "--precision.fp8_scaling=tilewise"],
        "precision.fp8_backend",
    ),
    (
        ["--precision.fp8_all_gather=true", "--precision.fp8_scaling=tilewise"],
        "precision.fp8_all_gather",
    ),
]


@pytest.mark.parametrize("overrides,field", ERRORS)
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert e.value.field == field
    assert field in str(e.value)


def test_bad_toml_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nsteps=")
    with pytest.raises(ConfigError, match="config"):
        load_config(bad)
    with pytest.raises(ConfigError, match="config"):
        load_config(tmp_path / "missing.toml")


LAYOUT_ERRORS = [
    (dict(tp=3), {}, "parallel.tp"),  # does not divide 32 heads
    (dict(tp=16), {}, "parallel.tp"),  # does not divide 8 KV heads
    (dict(pp=64), {}, "parallel.pp"),  # more stages than layers
    (dict(pp=2, pp_schedule="interleaved", pp_virtual=1), {}, "parallel.pp_virtual"),
    (dict(cp=3), dict(seq_len=8192), "parallel.cp"),
    (dict(ep=2), {}, "parallel.ep"),  # dense model
    (dict(dp=4, dp_replicate=3, zero=3), {}, "parallel.dp_replicate"),
    (dict(dp=2, dp_replicate=2), {}, "parallel.dp_replicate"),  # HSDP needs zero >= 1
    (dict(dp=2, pp=4), dict(global_batch=4, micro_batch=1), "batch.global_batch"),  # m=2 < pp
    (dict(dp=4), dict(global_batch=6, micro_batch=1), "batch.global_batch"),
]


@pytest.mark.parametrize("layout,kw,field", LAYOUT_ERRORS)
def test_layout_rules_name_the_field(layout, kw, field):
    problems = layout_problems(Layout(**layout), model_preset("llama3-8b"), **kw)
    assert field in [p.field for p in problems]


def test_legal_layouts_have_no_problems():
    m = model_preset("llama3-8b")
    for layout in (
        Layout(dp=8, zero=3),
        Layout(dp=4, zero=3, tp=8, sp=True, pp=4, pp_schedule="interleaved", pp_virtual=2),
        Layout(dp=4, zero=3, tp=8, sp=True, cp=4),
        Layout(dp=4, dp_replicate=2, zero=3),
        # Megatron's layout: tp x pp x dp with DDP or a distributed optimizer
        Layout(dp=2, tp=8, pp=4, zero=1),
        Layout(dp=2, tp=8, sp=True, zero=0),
        Layout(dp=2, tp=8, sp=True, pp=2, cp=2, zero=1),
    ):  # long context, pp x cp
        assert (
            layout_problems(
                layout,
                m,
                world_size=layout.world_size,
                global_batch=64,
                micro_batch=1,
                seq_len=8192,
            )
            == []
        )
    moe = model_preset("mixtral-8x7b")
    assert layout_problems(Layout(dp=8, ep=8, zero=3), moe) == []
    assert layout_problems(Layout(dp=2, ep=4, cp=2, zero=3), moe) == []
    assert [p.field for p in layout_problems(Layout(dp=2, ep=4, zero=3), moe)] == ["parallel.ep"]
    # MoE x TP (experts split over tp, or whole per tp rank under ep), ep dividing dp*cp,
    # ZeRO-1 with ep (tests/distributed/test_moe_tp_ep.py runs each)
    for layout in (
        Layout(dp=2, tp=8, zero=1),
        Layout(dp=4, tp=2, sp=True, ep=2, zero=1),
        Layout(dp=8, ep=2, zero=0),
        Layout(dp=4, cp=2, ep=4, zero=3),
    ):
        assert layout_problems(layout, moe) == [], layout.label()


def test_zero1_with_experts_refuses_hsdp_replicas():
    moe = model_preset("mixtral-8x7b")
    problems = layout_problems(Layout(dp=4, dp_replicate=2, ep=2, zero=1), moe)
    assert [p.field for p in problems] == ["parallel.dp_replicate"]
    assert "dp_replicate=1" in str(problems[0])


def test_float8_experts_are_not_split_over_tp():
    from scaletrain.config import option_problems

    split = option_problems(Layout(dp=2, tp=2), offload="none", precision="fp8", moe=True)
    assert [p.field for p in split] == ["precision.dtype"] and "parallel.ep" in str(split[0])
    # experts whole per tp rank under ep, or a dense model: no rule
    assert (
        option_problems(Layout(dp=2, tp=2, ep=2), offload="none", precision="fp8", moe=True) == []
    )
    assert option_problems(Layout(dp=2, tp=2), offload="none", precision="fp8") == []


# ---- choice fields: one Literal alias per set of names -------------------------------------


def _literal_fields():
    """(section, field, names) for every Literal-typed field of every config section."""
    import dataclasses
    import typing

    from scaletrain.config.choices import literal_names
    from scaletrain.config.job import SECTIONS
    from scaletrain.config.model import ModelConfig

    out = []
    for section, cls in {**SECTIONS, "model": ModelConfig}.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            options = literal_names(hints[f.name])
            if options is not None:
                out.append((section, f.name, options))
    return out


def test_choice_fields_are_literals_with_their_default_among_the_names():
    import dataclasses

    from scaletrain.config.job import SECTIONS
    from scaletrain.config.model import ModelConfig

    fields = {(s, f): names for s, f, names in _literal_fields()}
    # the choice fields this change typed (a field dropped from the list is a regression)
    for key in [
        ("precision", "dtype"),
        ("precision", "reduce_dtype"),
        ("memory", "ac"),
        ("memory", "offload"),
        ("parallel", "zero"),
        ("parallel", "pp_schedule"),
        ("optim", "name"),
        ("optim", "schedule"),
        ("data", "chat_template"),
        ("data", "format"),
        ("train", "device"),
        ("model", "norm"),
    ]:
        assert key in fields, key
    classes = {**SECTIONS, "model": ModelConfig}
    for (section, name), names in fields.items():
        default = {f.name: f.default for f in dataclasses.fields(classes[section])}[name]
        assert default in names, (section, name)


def test_choice_validation_reads_the_alias():
    from scaletrain.config import PP_SCHEDULES, PRECISION_TABLE, PRECISIONS
    from scaletrain.config.choices import PPSchedule, Precision, ReduceDtype, names
    from scaletrain.config.precision import REDUCE_DTYPES

    assert PRECISIONS == names(Precision) == tuple(PRECISION_TABLE)
    assert tuple(REDUCE_DTYPES) == names(ReduceDtype)
    assert names(PPSchedule) == PP_SCHEDULES
    for section, name, options in _literal_fields():
        for value in options:  # every name the alias lists is accepted from the command line
            load_config(overrides=[f"--{section}.{name}={value}"])
        bad = f"{options[0]}x" if isinstance(options[0], str) else 7
        with pytest.raises(ConfigError) as e:
            load_config(overrides=[f"--{section}.{name}={bad}"])
        msg = str(e.value)
        assert e.value.field == f"{section}.{name}" and "\n" not in msg
        assert "choose one of " + ", ".join(map(repr, options)) in msg
        if isinstance(bad, str):
            assert f"did you mean {options[0]!r}?" in msg


def test_choice_fields_checked_when_built_in_code_and_typed_in_toml(tmp_path):
    from scaletrain.config import MemoryConfig, PrecisionConfig

    with pytest.raises(ConfigError, match=r"precision.dtype = 'bf61'.*did you mean 'bf16'"):
        PrecisionConfig(dtype="bf61")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="memory.ac"):
        MemoryConfig(ac="partial")  # type: ignore[arg-type]
    assert load_config(overrides=["--parallel.zero=2", "--parallel.dp=1"]).parallel.zero == 2
    toml = tmp_path / "job.toml"
    toml.write_text('[parallel]\nzero = "2"\n')
    with pytest.raises(ConfigError, match="parallel.zero.*without quotes"):
        load_config(toml)
    toml.write_text("[precision]\ndtype = 16\n")
    with pytest.raises(ConfigError, match="precision.dtype.*expected a string"):
        load_config(toml)


def test_a_derived_model_field_follows_the_field_it_came_from():
    """--model.dim on a preset whose ffn_dim was derived from its dim re-derives it (gpt-mini
    kept 4 x the old dim); a given or preset-specific value is kept."""
    mini = load_config(None, ["--model.name=gpt-mini", "--model.dim=256"]).model
    assert mini.ffn_dim == 4 * 256
    given = load_config(None, ["--model.name=gpt-mini", "--model.dim=256", "--model.ffn_dim=300"])
    assert given.model.ffn_dim == 300
    mha = load_config(None, ["--model.name=gpt-mini", "--model.num_heads=8"]).model
    assert mha.num_kv_heads == 8  # no GQA stays no GQA
    gqa = load_config(None, ["--model.name=tiny-llama", "--model.num_heads=8"]).model
    assert gqa.num_kv_heads == 2  # the preset's own GQA is kept


def test_adafactor_runs_with_data_parallelism_only():
    """Adafactor steps FSDP2's DTensor shards (ZeRO-2/3) and plain parameters (DDP, ZeRO-1);
    tensor and expert parallelism are refused by name, for every ZeRO stage, and no layout is
    refused for the other optimizers."""
    from scaletrain.config import option_problems

    for layout in (Layout(dp=2, tp=2, zero=1), Layout(dp=2, tp=2, zero=3), Layout(dp=2, ep=2)):
        problems = option_problems(layout, offload="none", optimizer="adafactor")
        assert [p.field for p in problems] == ["optim.name"] and "parallel.tp=1" in str(problems[0])
        assert option_problems(layout, offload="none", optimizer="adamw8bit") == []
    for layout in (Layout(dp=2, zero=z) for z in (0, 1, 2, 3)):
        assert option_problems(layout, offload="none", optimizer="adafactor") == []


def test_every_offload_mode_has_its_state_part() -> None:
    """`offload_states` reads a table of the modes (the planner's search asks for every rank):
    every mode of `choices.OffloadMode` has its row, the state part of its name."""
    from typing import get_args

    from scaletrain.config import offload_states, offloads_activations
    from scaletrain.config.choices import OffloadMode

    for mode in get_args(OffloadMode):
        states = mode.removesuffix("+activations")
        assert offload_states(mode) == ("none" if states == "activations" else states)
        assert offloads_activations(mode) == mode.endswith("activations")
