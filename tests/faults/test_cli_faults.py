"""Command-line faults through the real entry point (`scaletrain.cli.main`, in process): each
ends with exit code 2 and one stderr line naming the argument or field, before any work."""

from __future__ import annotations

import pytest

from scaletrain.cli import main

# (argv, text the one line must contain)
CASES = [
    (["train", "--nproc", "0"], "--nproc"),
    (["train", "--nproc", "x"], "--nproc"),
    (["train", "--nproc", "-3"], "--nproc"),
    (["train", "--train.steps"], "--train.steps"),
    (["train", "train.steps=3"], "train.steps=3"),
    (["train", "/nonexistent.toml"], "config"),
    (["train", "--=3"], "--=3"),
    (["train", "--.steps=3"], "--section.key=value"),
    (["train", "--train.=3"], "train."),
    (["train", "--train.steps.x=3"], "train.steps.x"),
    (["train", "--model.name="], "model.name"),
    (["train", "--model.name=  "], "model.name"),
    (["train", "--nproc=2", "--parallel.tp=3"], "parallel"),
    (["train", "-x"], "-x"),
    (["train", "--train_steps=3"], "--train_steps=3"),
    (["train", "--TRAIN.STEPS=3"], "did you mean 'train'"),
    (["train", "--train.steps=\u0663"], "train.steps"),  # Arabic-Indic digit three
    (["train", "--optim.lr=\uff11e-3"], "optim.lr"),  # full-width digit one
    (["train", "--train.steps=0x10"], "train.steps"),
    (["train", "--optim.lr=1e-3e"], "optim.lr"),
    (["train", "--data.source="], "data.source"),
    (["train", "--checkpoint.resume="], "resume"),
    (["train", "--checkpoint.resume=/nonexistent/step_1"], "checkpoint.resume"),
    (["train", "--checkpoint.resume=atuo"], "did you mean 'auto'"),
    (["train", "--checkpoint.init_from=/nonexistent"], "checkpoint.init_from"),
    (["train", "--train.device=tpu"], "train.device"),
    (["train", "--train.steps=1", "--optim.lr=x"], "optim.lr"),
    (["train", "--batch.global_batch=3", "--batch.micro_batch=2"], "batch"),
    (["train", "--model.name=tiny-llama", "--batch.seq_len=100000"], "batch.seq_len"),
    (["train", "--train.rendezvous_timeout_s=0"], "train.rendezvous_timeout_s"),
    (["train", "--train.force=maybe"], "train.force"),
    (["plan", "--gpus", "0"], "--gpus"),
    (["plan", "--model", "nope"], "nope"),
    (["plan", "--gpus", "-1"], "--gpus"),
    (["plan", "--seq-len", "0"], "--seq-len"),
    (["plan", "--dp", "3", "--gpus", "4"], "--dp"),
    (["plan", "--model", "/x.json"], "/x.json"),
    (["plan", "--zero", "5"], "--zero"),
    (["plan", "--precision", "fp4"], "--precision"),
    (["plan", "--gpu", "h10"], "h10"),
    (["explain", "--tp", "3"], "--tp"),
    (["dryrun", "--model", "nope"], "--model = 'nope'"),
    (["dryrun", "--world-size", "0"], "dryrun"),
    (["verify", "/nonexistent"], "run_dir"),
    (["report", "/nonexistent"], "run_dir"),
    (["status", "/nonexistent"], "run_dir"),
    (["bogus"], "bogus"),
    (["bench", "nope"], "nope"),
    (["profile", "--steps", "0"], "--steps"),
    (["profile", "--nproc", "0"], "--nproc"),
    # plan/explain: non-finite numbers, --plot targets, recipes their framework cannot run
    *[
        ([cmd, "--model=tiny-llama", "--gpus=8", f"{flag}={v}"], flag)
        for cmd in ("plan", "explain")
        for flag in (
            "--tokens",
            "--usd-per-gpu-hour",
            "--efficiency",
            "--pue",
            "--grid-co2",
            "--host-watts",
        )
        for v in ("inf", "nan", "1e999")
    ],
    (["plan", "--model=tiny-llama", "--convention=16", "--params=inf"], "--params"),
    (["explain", "--model=tiny-llama", "--convention=16", "--params=nan"], "--params"),
    (["plan", "--model=tiny-llama", "--convention=16", "--params=1e308"], "--params=1e+308"),
    (["plan", "--model=tiny-llama", "--tokens=1e12", "--pue=1e308"], "--pue=1e+308"),
    (
        ["explain", "--model=tiny-llama", "--tokens=1e12", "--usd-per-gpu-hour=1e308"],
        "--usd-per-gpu-hour=1e+308",
    ),
    (["plan", "--model=tiny-llama", "--plot=/nonexistent/dir/x.png"], "--plot"),
    (["plan", "--model=tiny-llama", "--plot=memory.txt"], "--plot"),
    (["explain", "--model=tiny-llama", "--plot=/"], "--plot"),
    (["plan", "--model=/nonexistent-dir"], "--model"),
    (["plan", "--recipe=Megatron"], "did you mean 'megatron'"),
    (["plan", "--recipe="], "--recipe"),
    (["explain", "--recipe=nanotron", "--gpus=8", "--cp=2"], "--cp"),
    (["explain", "--recipe=nanotron", "--gpus=8", "--tp=2", "--zero=3"], "--zero"),
    (["explain", "--recipe=deepspeed", "--gpus=8", "--pp=2", "--zero=2"], "--zero"),
    (
        ["explain", "--recipe=megatron", "--gpus=8", "--pp=2", "--pp-schedule=zero-bubble"],
        "--pp-schedule",
    ),
    # torchtitan's default for an unset --zero is FSDP (recipes/defaults.py): state plain DDP
    (["explain", "--recipe=torchtitan", "--gpus=8", "--tp=2", "--zero=0"], "--zero"),
    (["explain", "--recipe=deepspeed", "--gpus=8", "--offload=params"], "--offload"),
    # a search the recipe cannot satisfy names the pinned flag (it named --gpus before)
    (["plan", "--recipe=nanotron", "--gpus=8", "--ac=selective"], "--ac"),
    (["plan", "--recipe=nanotron", "--gpus=8", "--offload=params"], "--offload"),
    (["plan", "--convention=13"], "--convention"),
    (["plan", "--convention=16.0"], "--convention"),
    (["plan", "--convention=16", "--json"], "--convention"),
    (["plan", "--params=7e9"], "--params"),
    (["plan", "--convention=16", "--ckpt-every=0"], "--ckpt-every"),
]


@pytest.mark.parametrize(("argv", "needle"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_cli_fault_is_one_line(capsys, argv, needle):
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors exit (one line too: cli._Parser)
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(err) == 1 and needle in err[0], err
    assert "Traceback" not in err[0]


@pytest.mark.parametrize(
    "env",
    [
        {"WORLD_SIZE": "two"},
        {"WORLD_SIZE": "2", "RANK": "2"},
        {"RANK": "-1"},
        {"WORLD_SIZE": "2", "RANK": "0"},
    ],
)
def test_cli_bad_launch_env_is_one_line(capsys, monkeypatch, env):
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["train", "--model.name=tiny-llama"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and (
        "RANK" in err[0] or "WORLD_SIZE" in err[0] or "MASTER_ADDR" in err[0]
    ), err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["explain", "--gpus=2", "--cp=2", "--seq-len=16"], "--cp"),  # ring attention, window 4
        (["plan", "--gpus=2", "--cp=2", "--seq-len=16"], "--cp"),
    ],
)
def test_sliding_window_with_context_parallel_is_one_line(capsys, tmp_path, argv, needle):
    """model.sliding_window < seq_len cannot run under ring attention: the layout is refused
    naming --cp and the window (a window >= seq_len is the documented no-op, and plans)."""
    cfg = tmp_path / "sw.toml"
    cfg.write_text('[model]\nname = "tiny-llama"\nsliding_window = 4\n')
    assert main([*argv, f"--config={cfg}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "sliding_window=4" in err[0], err
    cfg.write_text('[model]\nname = "tiny-llama"\nsliding_window = 16\n')
    assert main([*argv, f"--config={cfg}"]) == 0


# inconsistent batch flags: (argv tail, what the line must contain); every verb that takes the
# shared job flags names the flag the user gave and a fix, never a value it derived itself
BATCH_CASES = [
    (["--global-batch=3", "--dp=2"], ("--global-batch = 3", "multiple of dp=2", "use 2 or 4")),
    (["--global-batch=1", "--dp=4"], ("--global-batch = 1", "multiple of dp=4", "use 4")),
    (
        ["--global-batch=16", "--dp=2", "--micro-batch=16"],
        ("global", "= 16 is invalid", "micro_batch*dp = 16*2 = 32", "raise it to 32", "divides"),
    ),
    (["--global-batch=16", "--dp=2", "--micro-batch=3"], ("global-batch", "micro_batch=3")),
    (["--global-batch=2", "--pp=4", "--gpus=4"], ("global", "needs at least pp=4", "raise")),
    (["--global-batch=0"], ("--global-batch = 0", "positive integer")),
    (["--micro-batch=0"], ("--micro-batch = 0", "positive integer")),
    (["--global-batch=-2", "--dp=2"], ("--global-batch = -2", "positive integer")),
]


BATCH_ARGS = [
    *[
        (verb, tail, needles)
        for verb in ("plan", "explain", "dryrun")
        for tail, needles in BATCH_CASES
    ],
    # dp derived from --gpus (plan searches the layout there, and tp=2 dp=1 is legal)
    *[
        (verb, ["--global-batch=3", "--gpus=2"], ("--global-batch = 3", "multiple of dp=2"))
        for verb in ("explain", "dryrun")
    ],
]


@pytest.mark.parametrize(
    ("verb", "tail", "needles"), BATCH_ARGS, ids=[" ".join([a[0], *a[1]]) for a in BATCH_ARGS]
)
def test_inconsistent_batch_flags_are_one_line(capsys, verb, tail, needles):
    try:
        rc = main([verb, "--model=tiny-llama", *tail])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(err) == 1, err
    for needle in needles:
        assert needle in err[0], (needle, err)
    if not any(t.startswith("--micro-batch") for t in tail):  # no derived micro-batch named
        assert "micro_batch=16" not in err[0] and "micro_batch*dp" not in err[0], err


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--efficiency=1e-320"],  # a search: a list of estimates
        ["plan", "--dp=8", "--efficiency=1e-320"],  # one layout
        ["explain", "--dp=8", "--efficiency=1e-320"],
        ["plan", "--dp=8", "--efficiency=5e-324"],  # the smallest subnormal
    ],
    ids=lambda a: " ".join(a),
)
def test_json_output_refuses_non_finite_results(capsys, argv):
    """--json gets the same refusal as the text report when finite flags overflow the
    arithmetic (a step time of 0/0): one line, and no NaN/Infinity printed as JSON."""
    rc = main([*argv[:1], "--model=tiny-llama", "--gpus=8", *argv[1:], "--json"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (rc, lines)
    assert len(lines) == 1 and "not finite" in lines[0] and "--efficiency" in lines[0], lines
    assert out == "", out[:200]
    # the same flags without --json: the text report's refusal, same line
    assert main([*argv[:1], "--model=tiny-llama", "--gpus=8", *argv[1:]]) == 2
    assert "not finite" in capsys.readouterr().err
