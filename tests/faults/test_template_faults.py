"""Chat templates and SFT records from disk: a template that reaches for Python internals, that
never ends, that builds gigabytes, that divides by zero or recurses, that drops the replies or
renders a non-character; a tokenizer_config.json that is not an object or whose chat_template
is not a string; SFT lines with wrong roles or types. Each is one ConfigError line naming the
setting and the file, raised before training (data/jinja_sandbox.py bounds time and size);
nothing a template does creates a file."""

from __future__ import annotations

import json

import pytest

from scaletrain.config import ConfigError, DataConfig
from scaletrain.data.pretrained import PretrainedTokenizer
from scaletrain.data.sft import build_sft, chat_template_for, render_example
from tests._hf_models import make_tokenizer_dir

CONV = [("user", "how are you"), ("assistant", "fine thanks")]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer_dir(
        tmp_path_factory.mktemp("tok"),
        ["how are you fine thanks what is two plus four"] * 50,
        vocab_size=150,
    )


def _with_config(tmp_path, tok_dir, **conf_changes):
    d = tmp_path / "tok"
    d.mkdir(exist_ok=True)
    (d / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
    conf = json.loads((tok_dir / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**conf, **conf_changes}))
    return d


def _one_line(fn, *needles):
    with pytest.raises(ConfigError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


HOSTILE = [
    # escape attempts: the sandbox refuses (and nothing is created)
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('touch PWNED') }}",
    "{{ lipsum.__globals__['os'].system('touch PWNED') }}",
    "{{ self.__init__.__globals__ }}",
    "{{ messages.pop() }}",
    "{% include '/etc/passwd' %}",
    "{% import 'os' as os %}",
    "{% extends 'base' %}",
    # time and size bombs (hangs of minutes, or a 4 GB allocation that killed the process)
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
    "{{ 'x' * 1000000000 }}",
    "{{ 'x' * 10**10 }}",
    "{{ [1] * 1000000000 }}",
    "{{ 'x' | center(1000000000) }}",
    "{{ 'x' | indent(1000000000) }}",
    "{{ '%0999999999d' | format(1) }}",
    "{{ '%0999999999d' % 1 }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{{ range(10) | list | join(',') * 100000000 }}",
    "{{ range(10000000000) | list }}",
    "{{ 10 ** 100000 ** 2 }}",
    "{% set ns = namespace(a='x') %}{% for i in range(100) %}{% set ns.a = ns.a ~ ns.a %}"
    "{% endfor %}",
    "{{ ('x' * 100000).replace('', 'y' * 1000) }}",
    # arithmetic and recursion
    "{{ 1 / 0 }}",
    "{{ 1 // 0 }}",
    "{{ 1 % 0 }}",
    "{{ 2.0 ** 100000 }}",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{{ undefined_var.attr }}",
    "{{ 'x' | truncate(-1) }}",
    # renders no reply (nothing would be trained), or a non-character
    "",
    "{% raw %}",
    "{{ messages|attr('__class__') }}",
    "{{ config }}{{ request }}",
    "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}",
    "{% for m in messages %}{{ m.content }}{% endfor %}{{ '\\ud800' }}",
    # broken syntax
    "{% for m in messages %}",
    "{{",
    "\x00\xff{{",
]


@pytest.mark.parametrize("template", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_chat_template_is_one_line(tmp_path, tok_dir, monkeypatch, template):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("scaletrain.data.jinja_sandbox.RENDER_SECONDS", 0.5)  # (default 5 s)
    d = _with_config(tmp_path, tok_dir, chat_template=template)
    tok = PretrainedTokenizer.load(d)

    def render():
        render_example(
            CONV, tok, chat_template_for(DataConfig(tokenizer=str(d), format="sft"), tok)
        )

    _one_line(render, "data.chat_template", "tokenizer_config.json")
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("value", [5, True, {"a": 1}, [{"name": "default", "template": 5}]])
def test_chat_template_that_is_not_a_string(tmp_path, tok_dir, value):
    d = _with_config(tmp_path, tok_dir, chat_template=value)
    _one_line(lambda: PretrainedTokenizer.load(d), "tokenizer_config.json", "string")


@pytest.mark.parametrize("value", [[], [{"name": "x"}], ["str"], None])
def test_no_usable_named_template_with_tokenizer_required(tmp_path, tok_dir, value):
    d = _with_config(tmp_path, tok_dir, chat_template=value)
    cfg = DataConfig(tokenizer=str(d), format="sft", chat_template="tokenizer")
    _one_line(lambda: chat_template_for(cfg, PretrainedTokenizer.load(d)), "no chat template")


@pytest.mark.parametrize("content", ["[1, 2]", '"a string"', "null", "5", "{bad", b"\xff\xfe"])
def test_tokenizer_config_that_is_not_an_object(tmp_path, tok_dir, content):
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
    f = d / "tokenizer_config.json"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    _one_line(lambda: PretrainedTokenizer.load(d), "data.tokenizer", "tokenizer_config.json")


def test_chat_template_jinja_that_is_not_utf8(tmp_path, tok_dir):
    d = _with_config(tmp_path, tok_dir)
    (d / "chat_template.jinja").write_bytes(b"\xff\xfe{{ messages }}")
    _one_line(
        lambda: PretrainedTokenizer.load(d), "data.chat_template", "chat_template.jinja", "UTF-8"
    )


def test_a_real_template_still_renders_in_the_bounded_sandbox(tmp_path, tok_dir):
    """Loops, namespace, trim and raise_exception work: the bounds cost a normal template
    nothing (its replies are trained)."""
    template = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}"
        "{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('role') }}"
        "{% endif %}{% set ns.n = ns.n + 1 %}{{ m.role ~ ': ' ~ m.content | trim }}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    d = _with_config(tmp_path, tok_dir, chat_template=template)
    tok = PretrainedTokenizer.load(d)
    ids, mask = render_example(
        CONV, tok, chat_template_for(DataConfig(tokenizer=str(d), format="sft"), tok)
    )
    trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert "fine thanks" in trained and "how are you" not in trained


BAD_RECORDS = [
    {"messages": [{"role": "tool", "content": "x"}]},
    {"messages": [{"role": "Assistant", "content": "x"}]},
    {"messages": [{"role": 5, "content": "x"}]},
    {"messages": [{"role": "user", "content": None}]},
    {"messages": [{"role": "user", "content": ["a", "b"]}]},
    {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": "user"}]},
    {"messages": ["user: hi"]},
    {"messages": "user: hi"},
    {"messages": None},
    {"prompt": 5, "response": "x"},
    {"prompt": "x"},
    {"response": "x"},
    {"text": "x"},
    [1, 2],
    "just a string",
    {"prompt": "x", "response": "\ud800"},
    {"messages": [{"role": "user", "content": "\udfff"}]},
]


@pytest.mark.parametrize("record", BAD_RECORDS, ids=range(len(BAD_RECORDS)))
def test_sft_record_with_wrong_roles_or_types(tmp_path, tok_dir, record):
    good = json.dumps({"prompt": "how are you", "response": "fine thanks"})
    src = tmp_path / "chat.jsonl"
    src.write_text(good + "\n" + json.dumps(record) + "\n")
    cfg = DataConfig(source=str(src), tokenizer=str(tok_dir), format="sft", chat_template="builtin")
    (tmp_path / "out").mkdir()
    _one_line(
        lambda: build_sft(cfg, tmp_path / "out", PretrainedTokenizer.load(tok_dir)),
        "data.source",
        "chat.jsonl:2",
    )
