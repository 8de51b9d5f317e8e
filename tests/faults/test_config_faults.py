"""Bad config values, from TOML and the command line: one ConfigError line naming the field."""

from __future__ import annotations

import pytest

from scaletrain.config import ConfigError, load_config

# (section, key, value as a TOML literal); each must be refused naming section.key
TOML_BAD = [
    ("train", "steps", "true"),
    ("train", "steps", "1.5"),
    ("train", "steps", '"ten"'),
    ("train", "steps", "[1]"),
    ("train", "run_dir", "[1, 2]"),
    ("train", "run_dir", "5"),
    ("train", "run_dir", "true"),
    ("train", "run_dir", '""'),
    ("train", "run_dir", '"  "'),
    ("train", "compile", "1"),
    ("train", "progress", '"maybe"'),
    ("train", "seed", "0.5"),
    ("train", "log_every", "false"),
    ("train", "eval_batches", "2.5"),
    ("optim", "lr", "inf"),
    ("optim", "lr", "nan"),
    ("optim", "lr", "-inf"),
    ("optim", "lr", "true"),
    ("optim", "lr", '"fast"'),
    ("optim", "lr", "[0.1]"),
    ("optim", "eps", "inf"),
    ("optim", "eps", "nan"),
    ("optim", "eps", "0.0"),
    ("optim", "eps", "1e-300"),  # 0 in the fp32 states: nan, blamed on the lr by the guard
    ("optim", "eps", "1e-39"),  # float32 subnormal
    ("optim", "momentum", "1.5"),  # was accepted: sgd diverges
    ("optim", "momentum", "1.0"),
    ("optim", "momentum", "-0.1"),
    ("optim", "momentum", "nan"),
    ("optim", "weight_decay", "inf"),
    ("optim", "grad_clip", "nan"),
    ("optim", "beta1", "nan"),
    ("optim", "beta1", "1.0"),  # Adafactor's first moment would never move
    ("optim", "beta1", "-0.1"),
    ("optim", "relative_step", '"yes"'),
    ("optim", "relative_step", "1"),
    ("optim", "name", "1"),
    ("optim", "name", '"adamm"'),
    ("optim", "schedule", '"cosin"'),
    ("precision", "loss_scale_init", "inf"),
    ("precision", "loss_scale_init", "nan"),
    ("precision", "loss_scale_init", "0.0"),
    ("precision", "dtype", '"bf61"'),
    ("precision", "fp8_all_gather", "2"),
    ("precision", "fp8_matmul", '"Emulated"'),
    ("precision", "fp8_matmul", "true"),
    ("batch", "seq_len", "true"),
    ("batch", "seq_len", "64.5"),
    ("batch", "global_batch", '"x"'),
    ("batch", "micro_batch", "[2]"),
    ("parallel", "tp", "true"),
    ("parallel", "tp", "2.5"),
    ("parallel", "sp", "1"),
    ("memory", "ac", '"ful"'),
    ("memory", "ac", "3"),
    ("data", "val_fraction", "nan"),
    ("data", "delay_s", "inf"),
    ("data", "tokenizer", '"bite"'),
    ("data", "cache_dir", "7"),
    ("guard", "threshold", "inf"),
    ("guard", "enabled", "0"),
    ("checkpoint", "keep_last_n", "1.5"),
    ("checkpoint", "async_save", '"yes please"'),
    ("checkpoint", "resume", "3"),
    ("hardware", "pue", "inf"),
    ("hardware", "gpu", '"h10"'),
    ("model", "rope_theta", "0.0"),
    ("model", "rope_theta", "-1.0"),
    ("model", "rope_theta", "inf"),
    ("model", "init_std", "inf"),
    ("model", "init_std", "0.0"),
    ("model", "init_std", "nan"),
    ("model", "dim", "64.5"),
    ("model", "name", "3"),
    ("model", "name", '"tiny-lama"'),
    # [hardware] prices, energy, efficiency: negative, non-finite, strings, booleans
    ("hardware", "usd_per_gpu_hour", "-1.0"),
    ("hardware", "usd_per_gpu_hour", "nan"),
    ("hardware", "usd_per_gpu_hour", '"2"'),
    ("hardware", "usd_per_gpu_hour", "true"),
    ("hardware", "pue", "0.5"),
    ("hardware", "pue", "-1.0"),
    ("hardware", "pue", "nan"),
    ("hardware", "pue", '"1.2"'),
    ("hardware", "pue", "1e999"),
    ("hardware", "grid_kg_co2_per_kwh", "-0.1"),
    ("hardware", "grid_kg_co2_per_kwh", "inf"),
    ("hardware", "grid_kg_co2_per_kwh", '"x"'),
    ("hardware", "efficiency", "-0.5"),
    ("hardware", "efficiency", "1.5"),
    ("hardware", "efficiency", "inf"),
    ("hardware", "efficiency", '"0.4"'),
    ("hardware", "efficiency", "true"),
    ("hardware", "host_watts_per_node", "-1.0"),
    ("hardware", "host_watts_per_node", "nan"),
    ("hardware", "host_watts_per_node", '"500"'),
    ("hardware", "storage_gb_per_s", "-1.0"),
    ("hardware", "storage_gb_per_s", "nan"),
    ("hardware", "storage_gb_per_s", '"4"'),
    ("hardware", "gpus", "-1"),
    ("hardware", "gpus", "true"),
    ("hardware", "gpus", '"8"'),
    ("hardware", "gpus_per_node", "-1"),
    ("hardware", "gpus_per_node", "2.5"),
    ("hardware", "gpu", '"H100-SXM"'),
    ("hardware", "gpu", "1"),
    ("hardware", "gpu", '""'),
    # the Literal-typed fields (config/choices.py): wrong case, quoted numbers, bools, ints
    ("precision", "dtype", '"BF16"'),
    ("precision", "dtype", "16"),
    ("precision", "dtype", "true"),
    ("precision", "dtype", '" bf16"'),
    ("precision", "reduce_dtype", '"fp16"'),
    ("parallel", "zero", '"1"'),
    ("parallel", "zero", "true"),
    ("parallel", "zero", "4"),
    ("parallel", "zero", "-1"),
    ("parallel", "zero", "false"),
    ("memory", "ac", '"FULL"'),
    ("memory", "ac", "true"),
    ("memory", "ac", '"None"'),
    ("memory", "offload", '"Params"'),
    ("memory", "offload", "false"),
    ("parallel", "pp_schedule", '"1F1B"'),
    ("parallel", "pp_schedule", '"zero_bubble"'),
    ("parallel", "layout", '"AUTO"'),
    ("optim", "name", '"AdamW"'),
    ("optim", "schedule", '"Cosine"'),
    ("data", "format", '"SFT"'),
    ("data", "format", '"jsonl"'),
    ("data", "chat_template", "\"{{ ''.__class__ }}\""),
    ("data", "chat_template", '"Builtin"'),
    ("data", "chat_template", "1"),
    ("data", "token_dtype", '"uint8"'),
    ("train", "device", '"CPU"'),
    ("train", "device", '"cuda:0"'),
    ("model", "norm", '"RMSNorm"'),
    ("model", "activation", '"relu"'),
    ("model", "position", '"RoPE"'),
    ("model", "attention", '"flash"'),
    ("parallel", "tp", '"2"'),
    ("batch", "seq_len", '"64"'),
    # sliding_window and eval_sources
    ("model", "sliding_window", "-1"),
    ("model", "sliding_window", "true"),
    ("model", "sliding_window", '"4"'),
    ("model", "sliding_window", "1.5"),
    ("model", "sliding_window", "1e999"),
    ("data", "eval_sources", '"/nonexistent.txt"'),
    ("data", "eval_sources", "[1]"),
    ("data", "eval_sources", "true"),
    ("data", "eval_sources", '"=/x"'),
    ("data", "eval_sources", '",,,"'),
    ("data", "eval_sources", '"a=/nonexistent.txt"'),
]

CLI_BAD = [
    ("optim.lr", "1e999"),
    ("optim.lr", "inf"),
    ("optim.lr", "nan"),
    ("optim.eps", "1e999"),
    ("optim.eps", "inf"),
    ("precision.loss_scale_init", "inf"),
    ("model.rope_theta", "0"),
    ("train.steps", "1.5"),
    ("train.steps", "true"),
    ("train.steps", "1e999"),
    ("train.run_dir", ""),
    ("data.cache_dir", ""),  # the shards would land in the current directory
    ("data.cache_dir", "  "),
    ("train.compile", "2"),
    ("model.init_std", "inf"),
    ("batch.seq_len", "1e999"),
    ("optim.weight_decay", "inf"),
    ("hardware.efficiency", "nan"),
    ("train.eval_batches", "1e6"),
    ("data.num_tokens", "1e10"),
    ("data.num_tokens", "1e999"),
    ("parallel.zero", "true"),
    ("parallel.zero", "one"),
    ("parallel.zero", '"1"'),
    ("precision.dtype", "BF16"),
    ("precision.fp8_matmul", "fast"),
    ("memory.ac", "FULL"),
    ("memory.ac", "true"),
    ("model.sliding_window", "true"),
    ("model.sliding_window", "-1"),
    ("model.sliding_window", "1.5"),
    ("model.sliding_window", "1e999"),
    ("hardware.pue", "0.5"),
    ("hardware.pue", "inf"),
    ("hardware.usd_per_gpu_hour", "-1"),
    ("hardware.efficiency", "1.5"),
    ("hardware.host_watts_per_node", "nan"),
    ("hardware.storage_gb_per_s", "-4"),
    ("hardware.grid_kg_co2_per_kwh", "-1"),
    ("hardware.gpus", "true"),
    ("data.chat_template", "Builtin"),
    ("data.chat_template", "{{x}}"),
    ("train.device", "CPU"),
    ("data.format", "SFT"),
    ("parallel.pp_schedule", "1F1B"),
    ("train.compile", "on"),
]


def _toml(tmp_path, section, key, literal):
    f = tmp_path / "c.toml"
    f.write_text(f"[{section}]\n{key} = {literal}\n")
    return f


@pytest.mark.parametrize(("section", "key", "literal"), TOML_BAD)
def test_toml_bad_values_are_one_line_naming_the_field(tmp_path, section, key, literal):
    extra = {"model": {"name": "tiny-llama"}} if section == "model" and key != "name" else None
    with pytest.raises(ConfigError) as e:
        load_config(_toml(tmp_path, section, key, literal), extra)
    assert e.value.field == f"{section}.{key}" and "\n" not in str(e.value)


@pytest.mark.parametrize(("key", "value"), CLI_BAD)
def test_cli_bad_values_are_one_line_naming_the_field(key, value):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"--{key}={value}", "--model.name=tiny-llama"])
    assert e.value.field == key and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--model.name=tiny-llama", "--batch.seq_len=1024"], "batch.seq_len"),
        (["--model.name=gpt-mini", "--batch.seq_len=1024"], "batch.seq_len"),
    ],
)
def test_seq_len_beyond_max_seq_len_names_both_fields(args, field):
    with pytest.raises(ConfigError, match="model.max_seq_len") as e:
        load_config(None, args)
    assert e.value.field == field


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (["--trian.steps=3"], "'train'"),
        (["--train.stpes=3"], "'steps'"),
        (["--optim.name=adamm"], "'adamw'"),
        (["--model.name=tiny-lama"], "'tiny-llama'"),
        (["--memory.ac=selectiv"], "'selective'"),
        (["--model.dimm=8"], "'dim'"),
        (["--hardware.gpu=h100-sxn"], "'h100-sxm'"),
        (["--precision.dtype=bf61"], "'bf16'"),
    ],
)
def test_did_you_mean(args, suggestion):
    with pytest.raises(ConfigError, match=f"did you mean {suggestion}"):
        load_config(None, args)


@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        (["--train.steps=1e3"], "steps", 1000),
        (["--train.compile=true"], "compile", True),
        (["--train.compile=0"], "compile", False),
        (["--train.seed=7"], "seed", 7),
    ],
)
def test_good_values_still_parse(args, field, value):
    got = getattr(load_config(None, args).train, field)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("arg", "field"),
    [
        ("--precision.loss_scale_init=1e-30", "precision.loss_scale_init"),  # grads underflow
        ("--precision.loss_scale_init=1e300", "precision.loss_scale_init"),  # every step skipped
        ("--model.norm_eps=1e30", "model.norm_eps"),  # the loss never moves
        ("--model.norm_eps=4e-4", "model.norm_eps"),  # = init_std^2: the norm stops normalizing
        ("--model.moe_aux_loss_coef=-100", "model.moe_aux_loss_coef"),  # rewards imbalance
        # init_std^2 overflowed in the norm_eps bound (a Hypothesis example: an OverflowError,
        # not a ConfigError)
        ("--model.init_std=1.3407807929942597e+154", "model.init_std"),
        ("--model.init_std=2", "model.init_std"),
    ],
)
@pytest.mark.fault("arithmetic_bounds")
def test_values_that_stop_learning_are_refused(arg, field):
    """Values that pass a sign check but leave a run that silently learns nothing: bounds
    from the arithmetic (config/job.py, config/model.py), one line naming the field."""
    with pytest.raises(ConfigError) as e:
        load_config(None, [arg])
    assert e.value.field == field and "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.fault("arithmetic_bounds")
@pytest.mark.parametrize(
    ("arg", "field"),
    [
        ("--precision.loss_scale_init=1e-30", "precision.loss_scale_init"),
        ("--model.norm_eps=1e30", "model.norm_eps"),
    ],
)
def test_cli_resume_with_a_value_that_stops_learning_keeps_the_run(tmp_path, arg, field):
    """The same refusal on a resume from the CLI: one line naming the field, exit 2, and the
    run's files (its checkpoint first) unchanged."""
    from ._cli import digests, lost, one_line, scaletrain, tiny_job

    first = scaletrain("train", *tiny_job(tmp_path, "run"))
    assert first.returncode == 0, first.stderr
    before = digests(tmp_path / "run")
    again = scaletrain("train", *tiny_job(tmp_path, "run", "--train.steps=4", arg))
    assert again.returncode == 2, again.stderr[-3000:]
    one_line(again, field)
    assert lost(before, tmp_path / "run") == []


@pytest.mark.slow
@pytest.mark.fault("ignored_options")
@pytest.mark.parametrize(
    ("arg", "named"),
    [
        ("--parallel.sp=true", "parallel.sp=true does nothing"),
        ("--precision.fp8_amax=delayed", "precision.fp8_amax='delayed' does nothing"),
    ],
)
def test_cli_resume_with_an_ignored_option_names_it_once_and_continues(tmp_path, arg, named):
    """An option the layout never reads, set on a resume: named once, the run continues
    from its checkpoint to the end, and the steps already logged are kept."""
    from ._cli import no_traceback, scaletrain, tiny_job

    first = scaletrain("train", *tiny_job(tmp_path, "run"))
    assert first.returncode == 0, first.stderr
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    again = scaletrain("train", *tiny_job(tmp_path, "run", "--train.steps=4", arg))
    assert again.returncode == 0 and no_traceback(again), again.stderr[-3000:]
    out = (again.stdout + again.stderr).splitlines()
    assert sum(named in ln for ln in out) == 1, out
    assert "resuming from" in again.stdout
    assert (tmp_path / "run" / "metrics.jsonl").read_text().startswith(metrics)
    assert (tmp_path / "run" / "checkpoints" / "step_00000004").is_dir()
