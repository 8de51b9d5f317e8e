"""Property-based fuzz of TOML configs and CLI overrides: every input either loads or raises a
ConfigError naming a real field — never any other exception."""

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaletrain.config import ConfigError, JobConfig, ModelConfig, load_config
from scaletrain.config.job import SECTIONS

FIELDS = {s: [f.name for f in dataclasses.fields(cls)] for s, cls in SECTIONS.items()}
FIELDS["model"] = [f.name for f in dataclasses.fields(ModelConfig)]
KNOWN = {f"{s}.{k}" for s, ks in FIELDS.items() for k in ks} | set(FIELDS)

values = st.one_of(
    st.integers(-10, 10**6).map(str),
    st.floats(allow_nan=True).map(str),
    st.sampled_from(
        [
            "true",
            "false",
            "yes",
            "",
            "none",
            "gpt2-124m",
            "tiny",
            "llama3-8b",
            "bf16",
            "fp8",
            "full",
            "1f1b",
            "zero-bubble",
            "h100-sxm",
            "-1",
            "1e9",
            "auto",
            "never",
            "/nonexistent",
            "grammar",
            "bpe",
            "sgd",
            "nan",
            "inf",
        ]
    ),
    st.text(max_size=12),
)
known_key = st.sampled_from(sorted(FIELDS)).flatmap(
    lambda s: st.sampled_from(FIELDS[s]).map(lambda k: f"{s}.{k}")
)
any_key = st.one_of(known_key, st.text(min_size=1, max_size=10).map(lambda t: f"x.{t}"))
override = st.tuples(any_key, values).map(lambda kv: f"--{kv[0]}={kv[1]}")


def _check(e: ConfigError) -> None:
    # the error names a field the user can act on (a config field, a section, or the override)
    assert e.field in KNOWN or e.field.split(".")[0] in ("x", "override", "config", "parallel"), (
        e.field
    )
    assert e.fix


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(override, max_size=4))
def test_cli_overrides_load_or_name_a_field(args):
    try:
        job = load_config(None, args)
    except ConfigError as e:
        _check(e)
        return
    assert isinstance(job, JobConfig)
    try:
        job.layout(2)
    except ConfigError as e:
        _check(e)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(known_key, values), max_size=4))
def test_toml_files_load_or_name_a_field(tmp_path_factory, pairs):
    lines: dict[str, list[str]] = {}
    for key, value in pairs:
        section, name = key.split(".", 1)
        lines.setdefault(section, []).append(f"{name} = {value!r}".replace("'", '"'))
    text = "\n".join(f"[{s}]\n" + "\n".join(body) for s, body in lines.items())
    path = tmp_path_factory.mktemp("fuzz") / "job.toml"
    path.write_text(text)
    try:
        load_config(path)
    except ConfigError as e:
        _check(e)
