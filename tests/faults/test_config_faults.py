"""Bad config values, from TOML and the command line: one ConfigError line naming the field."""

from __future__ import annotations

import pytest

from scaletrain.config import ConfigError, load_config

# (section, key, value as a TOML literal); each must be refused naming section.key
TOML_BAD = [
    ("train", "steps", "true"), ("train", "steps", "1.5"), ("train", "steps", '"ten"'),
    ("train", "steps", "[1]"), ("train", "run_dir", "[1, 2]"), ("train", "run_dir", "5"),
    ("train", "run_dir", "true"), ("train", "run_dir", '""'), ("train", "run_dir", '"  "'),
    ("train", "compile", "1"), ("train", "progress", '"maybe"'), ("train", "seed", "0.5"),
    ("train", "log_every", "false"), ("train", "eval_batches", "2.5"),
    ("optim", "lr", "inf"), ("optim", "lr", "nan"), ("optim", "lr", "-inf"),
    ("optim", "lr", "true"), ("optim", "lr", '"fast"'), ("optim", "lr", "[0.1]"),
    ("optim", "eps", "inf"), ("optim", "eps", "nan"), ("optim", "eps", "0.0"),
    ("optim", "weight_decay", "inf"), ("optim", "grad_clip", "nan"), ("optim", "beta1", "nan"),
    ("optim", "name", "1"), ("optim", "name", '"adamm"'), ("optim", "schedule", '"cosin"'),
    ("precision", "loss_scale_init", "inf"), ("precision", "loss_scale_init", "nan"),
    ("precision", "loss_scale_init", "0.0"), ("precision", "dtype", '"bf61"'),
    ("precision", "fp8_all_gather", "2"), ("batch", "seq_len", "true"),
    ("batch", "seq_len", "64.5"), ("batch", "global_batch", '"x"'),
    ("batch", "micro_batch", "[2]"), ("parallel", "tp", "true"), ("parallel", "tp", "2.5"),
    ("parallel", "sp", "1"), ("memory", "ac", '"ful"'), ("memory", "ac", "3"),
    ("data", "val_fraction", "nan"), ("data", "delay_s", "inf"), ("data", "tokenizer", '"bite"'),
    ("data", "cache_dir", "7"), ("guard", "threshold", "inf"), ("guard", "enabled", "0"),
    ("checkpoint", "keep_last_n", "1.5"), ("checkpoint", "async_save", '"yes please"'),
    ("checkpoint", "resume", "3"), ("hardware", "pue", "inf"), ("hardware", "gpu", '"h10"'),
    ("model", "rope_theta", "0.0"), ("model", "rope_theta", "-1.0"),
    ("model", "rope_theta", "inf"), ("model", "init_std", "inf"), ("model", "init_std", "0.0"),
    ("model", "init_std", "nan"), ("model", "dim", "64.5"), ("model", "name", "3"),
    ("model", "name", '"tiny-lama"'),
]

CLI_BAD = [
    ("optim.lr", "1e999"), ("optim.lr", "inf"), ("optim.lr", "nan"), ("optim.eps", "1e999"),
    ("optim.eps", "inf"), ("precision.loss_scale_init", "inf"), ("model.rope_theta", "0"),
    ("train.steps", "1.5"), ("train.steps", "true"), ("train.steps", "1e999"),
    ("train.run_dir", ""), ("train.compile", "2"), ("model.init_std", "inf"),
    ("batch.seq_len", "1e999"), ("optim.weight_decay", "inf"), ("hardware.efficiency", "nan"),
    ("train.eval_batches", "1e6"), ("data.num_tokens", "1e10"), ("data.num_tokens", "1e999"),
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


@pytest.mark.parametrize(("args", "field"), [
    (["--model.name=tiny-llama", "--batch.seq_len=1024"], "batch.seq_len"),
    (["--model.name=gpt-mini", "--batch.seq_len=1024"], "batch.seq_len"),
])
def test_seq_len_beyond_max_seq_len_names_both_fields(args, field):
    with pytest.raises(ConfigError, match="model.max_seq_len") as e:
        load_config(None, args)
    assert e.value.field == field


@pytest.mark.parametrize(("args", "suggestion"), [
    (["--trian.steps=3"], "'train'"), (["--train.stpes=3"], "'steps'"),
    (["--optim.name=adamm"], "'adamw'"), (["--model.name=tiny-lama"], "'tiny-llama'"),
    (["--memory.ac=selectiv"], "'selective'"), (["--model.dimm=8"], "'dim'"),
    (["--hardware.gpu=h100-sxn"], "'h100-sxm'"), (["--precision.dtype=bf61"], "'bf16'"),
])
def test_did_you_mean(args, suggestion):
    with pytest.raises(ConfigError, match=f"did you mean {suggestion}"):
        load_config(None, args)


@pytest.mark.parametrize(("args", "field", "value"), [
    (["--train.steps=1e3"], "steps", 1000), (["--train.compile=true"], "compile", True),
    (["--train.compile=0"], "compile", False), (["--train.seed=7"], "seed", 7),
])
def test_good_values_still_parse(args, field, value):
    got = getattr(load_config(None, args).train, field)
    assert got == value and type(got) is type(value)
