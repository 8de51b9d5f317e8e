"""`scaletrain napkin TOOL` faults (in process, through `scaletrain.cli.main`): every numeric flag
of every tool refuses inf, nan and overflowing literals, every positive quantity refuses 0 and
negatives, and finite inputs whose arithmetic overflows end in one line naming the flags, never
a traceback nor a report that prints inf/nan. Each is exit code 2 and one stderr line."""

from __future__ import annotations

import pytest

from scaletrain.cli import main

# tool -> (the flags of a good call, the float flags to break)
TOOLS = {
    "memory": (["--model=tiny-llama"], ["--params"]),
    "ckpt": (["--model=tiny-llama"], ["--layer-gb"]),
    "tokenizer": (
        ["--global-batch=8", "--seq-len=128", "--step-s=1"],
        ["--step-s", "--tokens-per-s-per-core", "--pcie-gbps"],
    ),
    "deadline": (
        ["--params=7e9", "--tokens=1e12", "--days=10"],
        ["--flops", "--params", "--tokens", "--efficiency", "--peak-tflops", "--days"],
    ),
    "rentbuy": (
        ["--params=7e9", "--tokens=1e12", "--gpus=8", "--buy-usd-per-gpu=30000"],
        [
            "--flops",
            "--params",
            "--tokens",
            "--peak-tflops",
            "--usd-per-gpu-hour",
            "--pue",
            "--buy-usd-per-gpu",
            "--usd-per-kwh",
        ],
    ),
    "run": (
        ["--params=7e9", "--tokens=1e12", "--gpus=8"],
        [
            "--flops",
            "--params",
            "--tokens",
            "--peak-tflops",
            "--usd-per-gpu-hour",
            "--pue",
            "--host-watts",
            "--grid-co2",
        ],
    ),
    "allreduce": (
        ["--params=7e9", "--gpus=8", "--gbps=12.5"],
        ["--bytes", "--params", "--grad-bytes", "--gbps", "--compute-s"],
    ),
}
NOT_FINITE = ["inf", "-inf", "nan", "1e999"]


def _without(flags: list[str], flag: str) -> list[str]:
    return [f for f in flags if not f.startswith(flag + "=")]


NON_FINITE_CASES = [
    (["napkin", tool, *_without(good, flag), f"{flag}={v}"], flag)
    for tool, (good, flags) in TOOLS.items()
    for flag in flags
    for v in NOT_FINITE
]

OTHER_CASES = [
    # allreduce's --params was not checked: 0 and negatives printed a negative all-reduce
    (["napkin", "allreduce", "--gpus=8", "--gbps=12.5", "--params=0"], "--params"),
    (["napkin", "allreduce", "--gpus=8", "--gbps=12.5", "--params=-1"], "--params"),
    (["napkin", "allreduce", "--gpus=8", "--gbps=12.5", "--params=-inf"], "--params"),
    # finite inputs whose arithmetic overflows: one line naming the flags
    (["napkin", "deadline", "--params=1e300", "--tokens=1e300", "--days=1"], "--tokens"),
    (["napkin", "run", "--params=1e300", "--tokens=1e10", "--gpus=8"], "--tokens"),
    (["napkin", "deadline", "--flops=1e308", "--days=1e-300"], "--days=1e-300"),
    (["napkin", "allreduce", "--params=1e308", "--gpus=8", "--gbps=1e-300"], "--gbps=1e-300"),
    (["napkin", "memory", "--params=1e308"], "--params=1e+308"),
    (["napkin", "run", "--params=7e9", "--tokens=1e12", "--gpus=8", "--pue=1e308"], "--pue=1e+308"),
    (["napkin", "memory", "--params=7e9", "--convention=13"], "--convention"),
    (["napkin", "memory", "--params=7e9", "--convention=16.0"], "--convention"),
    (["napkin", "memory", "--params=7e9", "--convention=nan"], "--convention"),
    (["napkin", "memory", "--params=7e9", "--convention=-16"], "--convention"),
    (["napkin", "memory", "--params=7e9", "--convention=0"], "--convention"),
    (["napkin", "memory", "--params=7e9", "--precision=fp32", "--convention=12"], "--convention"),
    (["napkin", "gemm", "--model=tiny-llama", "--tile=0x0"], "--tile"),
    (["napkin", "gemm", "--model=tiny-llama", "--tile=abc"], "--tile"),
    (["napkin", "memory", "--model=nope"], "--model"),
    (["napkin", "gemm", "--model=tiny-llama", "--gpu=nope"], "--gpu"),
    (["napkin", "waves"], "--size"),
    (["napkin", "deadline", "--params=7e9"], "--days"),
    (["napkin", "tokenizer", "--global-batch=8", "--seq-len=128"], "--step-s"),
    (["napkin"], "napkin"),
    (["napkin", "bogus"], "bogus"),
]
CASES = NON_FINITE_CASES + OTHER_CASES


@pytest.mark.parametrize(("argv", "needle"), CASES, ids=[" ".join(c[0][1:]) for c in CASES])
def test_napkin_fault_is_one_line(capsys, argv, needle):
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors (napkin's _OneLine parser)
        rc = e.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (rc, lines)
    assert len(lines) == 1 and needle in lines[0], lines
    assert "Traceback" not in err and out == "", out


@pytest.mark.parametrize(
    ("argv", "printed"),
    [
        (["napkin", "memory", "--params=7e9", "--convention=18"], "18 B/param"),
        (
            [
                "napkin",
                "rentbuy",
                "--params=7e9",
                "--tokens=1e12",
                "--gpus=8",
                "--buy-usd-per-gpu=30000",
            ],
            "financing",
        ),
        (["napkin", "run", "--params=7e9", "--tokens=1e12", "--gpus=8", "--host-watts=0"], "kWh"),
    ],
)
def test_good_napkin_calls_still_print(capsys, argv, printed):
    """The finiteness guard refuses inf/nan numbers, not words that contain them."""
    assert main(argv) == 0
    assert printed in capsys.readouterr().out
