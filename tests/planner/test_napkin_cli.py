"""What the seeds teach, on the command line (issue #20 item 5): [hardware] price, efficiency,
PUE and grid intensity from TOML and flags; `--convention`; `scaletrain napkin ...`.

Every test runs `scaletrain.cli.main([...])` and reads the printed text; seed numbers are held to
the precision the seed prints them with.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scaletrain.cli import main

GPT2 = [
    "--model",
    "gpt2-124m",
    "--gpu",
    "h100-sxm",
    "--gpus",
    "16",
    "--dp",
    "16",
    "--seq-len",
    "1024",
    "--global-batch",
    "128",
]


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan/explain wrap lines at the terminal's width (COLUMNS): keep each formula on one
    line whatever terminal runs the suite."""
    monkeypatch.setenv("COLUMNS", "1000")


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert "\n" not in err  # one line
    return err


def _num(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in output"
    return float(m.group(1).replace(",", ""))


def _energy_terms(out: str) -> dict[str, float]:
    return {
        "seconds": _num(out, r"time = tokens / tokens/s = \S+ / \S+ = ([\d,.e+]+) s"),
        "usd": _num(out, r"cost = gpus x hours x \$/GPU-hour = .* = \$([\d,.]+)"),
        "price": _num(out, r"cost = gpus x hours x \$/GPU-hour = \d+ x \S+ x ([\d.]+) ="),
        "kwh": _num(out, r"x hours x PUE = .* = ([\d,.]+) kWh"),
        "pue": _num(out, r"h x ([\d.]+) = [\d,.]+ kWh"),
        "host": _num(out, r"\d+ x ([\d.]+) W\) x"),
        "grid": _num(out, r"kWh x ([\d.]+) kg/kWh"),
        "co2": _num(out, r"kg/kWh = ([\d,.]+) kg CO2"),
        "efficiency": _num(out, r"efficiency=([\d.]+) of"),
    }


def test_hardware_flags_reach_explain_energy_and_co2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "explain",
        *GPT2,
        "--tokens",
        "1e12",
        "--usd-per-gpu-hour",
        "3.5",
        "--pue",
        "1.1",
        "--grid-co2",
        "0.25",
        "--host-watts",
        "800",
        "--efficiency",
        "0.3",
    ]
    t = _energy_terms(_run(capsys, argv))
    assert (t["price"], t["pue"], t["grid"], t["host"], t["efficiency"]) == (
        3.5,
        1.1,
        0.25,
        800,
        0.3,
    )
    hours = t["seconds"] / 3600
    # 16 H100s x 700 W (datasheet TDP) + 2 nodes x 800 W, x hours x PUE
    assert t["kwh"] == pytest.approx((16 * 700 + 2 * 800) * hours * 1.1 / 1000, rel=2e-3)
    assert t["co2"] == pytest.approx(t["kwh"] * 0.25, rel=2e-3)
    assert t["usd"] == pytest.approx(16 * hours * 3.5, rel=2e-3)


def test_hardware_toml_is_honoured_like_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "hw.toml"
    cfg.write_text(
        '[hardware]\ngpu = "h100-sxm"\ngpus = 16\nusd_per_gpu_hour = 3.5\n'
        "efficiency = 0.3\npue = 1.1\ngrid_kg_co2_per_kwh = 0.25\n"
        "host_watts_per_node = 800\n"
    )
    rest = [
        "--model",
        "gpt2-124m",
        "--dp",
        "16",
        "--seq-len",
        "1024",
        "--global-batch",
        "128",
        "--tokens",
        "1e12",
    ]
    from_toml = _run(capsys, ["explain", "--config", str(cfg), *rest])
    from_flags = _run(
        capsys,
        [
            "explain",
            *GPT2,
            "--tokens",
            "1e12",
            "--usd-per-gpu-hour",
            "3.5",
            "--pue",
            "1.1",
            "--grid-co2",
            "0.25",
            "--host-watts",
            "800",
            "--efficiency",
            "0.3",
        ],
    )
    assert _energy_terms(from_toml) == _energy_terms(from_flags)
    # a flag wins over the file
    flag_wins = _run(capsys, ["explain", "--config", str(cfg), *rest, "--pue", "1.3"])
    assert _energy_terms(flag_wins)["pue"] == 1.3


def test_efficiency_scales_compute_time(capsys: pytest.CaptureFixture[str]) -> None:
    def compute_s(eff: str) -> float:
        out = _run(capsys, ["explain", *GPT2, "--global-batch", "4096", "--efficiency", eff])
        return _num(out, r"/ \(peak x efficiency\) = ([\d.]+) s")

    # compute time = FLOPs / (peak x efficiency): half the efficiency, twice the time (printed
    # to 1 ms of ~1 s)
    assert compute_s("0.2") == pytest.approx(2 * compute_s("0.4"), rel=3e-3)


def test_plan_cost_line_uses_price_and_grid(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", *GPT2, "--tokens", "1e12", "--efficiency", "0.4"]
    a = _run(capsys, [*base, "--usd-per-gpu-hour", "1", "--grid-co2", "0.1"]).splitlines()[-1]
    b = _run(capsys, [*base, "--usd-per-gpu-hour", "2", "--grid-co2", "0.2"]).splitlines()[-1]
    usd = r"\$([\d,]+),"
    co2 = r"([\d,.]+) t CO2"
    assert _num(b, usd) == pytest.approx(2 * _num(a, usd), rel=1e-3)
    assert _num(b, co2) == pytest.approx(2 * _num(a, co2), rel=0.05)


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--pue", "0.8", "--pue"),
        ("--grid-co2", "-1", "--grid-co2"),
        ("--efficiency", "1.5", "--efficiency"),
        ("--usd-per-gpu-hour", "-2", "--usd-per-gpu-hour"),
        ("--host-watts", "-5", "--host-watts"),
    ],
)
def test_bad_hardware_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, needle: str
) -> None:
    err = _error(capsys, ["explain", *GPT2, flag, value])
    assert needle in err


# ---- scaletrain napkin: the seeds' worked examples ---------------------------------------------


def _napkin(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    return _run(capsys, ["napkin", *argv])


def test_seed000_20b_twelve_bytes_and_zero3(capsys: pytest.CaptureFixture[str]) -> None:
    # seed 000: 20B x (2 + 2 + 8) = 40 + 40 + 160 = 240 GB; ZeRO-3 over 8 GPUs: 30 GB
    out = _napkin(capsys, "memory", "--params", "20e9", "--convention", "12")
    assert "weights   = P x 2 B = 40.0 GB" in out
    assert "grads     = P x 2 B = 40.0 GB" in out
    assert "optimizer = P x 8 B = 160.0 GB" in out
    assert "states    = 240.0 GB" in out
    out = _napkin(
        capsys, "memory", "--params", "20e9", "--convention", "12", "--dp", "8", "--zero", "3"
    )
    assert "states    = 30.0 GB" in out


@pytest.mark.parametrize(
    "zero,weights,grads,opt",
    [
        (0, "14.0", "14.0", "84.0"),
        (1, "14.0", "14.0", "10.5"),
        (2, "14.0", "1.75", "10.5"),
        (3, "1.75", "1.75", "10.5"),
    ],
)
def test_seed003_zero_table_7b_8_gpus(
    capsys: pytest.CaptureFixture[str], zero: int, weights: str, grads: str, opt: str
) -> None:
    # seed 003 sec. 20.2 "Memory Comparison (7B model, 8 GPUs, fp16)", 16 B/param (7B -> 112 GB)
    out = _napkin(
        capsys, "memory", "--params", "7e9", "--convention", "16", "--dp", "8", "--zero", str(zero)
    )
    assert re.search(rf"weights   = .* = {re.escape(weights)} GB", out)
    assert re.search(rf"grads     = .* = {re.escape(grads)} GB", out)
    assert re.search(rf"optimizer = .* = {re.escape(opt)} GB", out)
    if zero == 0:
        assert "states    = 112.0 GB" in out


def test_seed004_gpt2_memory_walkthrough(capsys: pytest.CaptureFixture[str]) -> None:
    gpt2 = ["memory", "--model", "gpt2-1.5b", "--params", "1.5e9", "--seq-len", "1024"]
    # Napkin Math 1.3: batch 8, FP16, 12 B/param: 3 + 3 + 12 GB, activations 71.7 GB (the
    # per-layer items 104.9 + 104.9 + 1048.6 MB are Korthikanti's 34sbh + 5as^2b), 89.7 GB
    out = _napkin(capsys, *gpt2, "--micro-batch", "8", "--convention", "12", "--gpu", "v100-32gb")
    assert "x 48 layers = 71.7 GB" in out
    assert "total = states + activations = 18.0 GB + 71.7 GB = 89.7 GB" in out
    assert "DOES NOT FIT" in out
    # Napkin Math 1.6: batch 4. FP32 (16 B = 4 + 4 + 8): 95.7 GB; FP16 + master (2+2+4+8):
    # 59.9 GB; + checkpointing every 4 layers: activations 35.9 / 4 -> ~33 GB
    out = _napkin(capsys, *gpt2, "--micro-batch", "4", "--convention", "16", "--precision", "fp32")
    assert "= 24.0 GB + 71.7 GB = 95.7 GB" in out
    out = _napkin(capsys, *gpt2, "--micro-batch", "4", "--convention", "16", "--precision", "fp16")
    assert "x 48 layers = 35.9 GB" in out
    assert "= 24.0 GB + 35.9 GB = 59.9 GB" in out
    out = _napkin(
        capsys,
        *gpt2,
        "--micro-batch",
        "4",
        "--convention",
        "16",
        "--precision",
        "fp16",
        "--ckpt-every",
        "4",
    )
    assert re.search(r"total = .* = 33\.0 GB", out)
    # Table 19, batch 32: FP32 baseline 597.8 GB (activations 573.8 GB)
    out = _napkin(capsys, *gpt2, "--micro-batch", "32", "--convention", "16", "--precision", "fp32")
    assert "= 24.0 GB + 573.8 GB = 597.8 GB" in out


def test_seed004_7b_on_24gb(capsys: pytest.CaptureFixture[str]) -> None:
    # Napkin Math 1.4: 14 + 14 + 56 = 84 GB; activations b=1, s=2048, h=4096, 32 layers,
    # factor 57 x 2 bytes (= Korthikanti's 34 + 5as/h = 114) -> 30.6 GB
    out = _napkin(
        capsys,
        "memory",
        "--model",
        "llama2-7b",
        "--params",
        "7e9",
        "--convention",
        "12",
        "--seq-len",
        "2048",
        "--micro-batch",
        "1",
        "--gpu",
        "rtx4090",
    )
    assert "states    = 84.0 GB" in out
    assert "x 32 layers = 30.6 GB" in out
    assert "DOES NOT FIT" in out


def test_conventions_18_and_20(capsys: pytest.CaptureFixture[str]) -> None:
    # seed 002: 20 psi = 2 + 2 + 4 + 4 + 8; Megatron's 18 B = bf16 2 + fp32 grads 4 + 12, and
    # its distributed optimizer (ZeRO-1) keeps 6 + 12/d
    out = _napkin(capsys, "memory", "--params", "1e9", "--convention", "20")
    assert "states    = 20.0 GB" in out
    out = _napkin(
        capsys, "memory", "--params", "1e9", "--convention", "18", "--dp", "4", "--zero", "1"
    )
    assert f"states    = {6 + 12 / 4:.2f} GB" in out


def test_seed004_checkpoint_placement(capsys: pytest.CaptureFixture[str]) -> None:
    # Table 15 text: sqrt(48) ~ 7 checkpoints, 7 + 48/7 ~ 14 A, 71% saved, ~33% compute
    out = _napkin(capsys, "ckpt", "--layers", "48", "--k", "4")
    assert "sqrt(N) ~ 7:" in out
    assert "7 + 48/7 = 13.9 A (71% saved)" in out
    assert "41 layer forwards" in out
    assert "33% of a forward+backward step" in out
    assert "keep 1 in 4" in out and "(75% saved)" in out
    # A from Korthikanti at seed 004's batch 8: 1.49 GB, so 48 A = 71.7 GB (Napkin Math 1.3)
    out = _napkin(capsys, "ckpt", "--model", "gpt2-1.5b", "--seq-len", "1024", "--micro-batch", "8")
    assert "= 1.49 GB (Korthikanti" in out
    assert "memory N x A = 48 A = 71.7 GB" in out
    # Napkin Math 1.3: checkpointing cuts the 71.7 GB by 75 percent, to ~17.9 GB
    out = _napkin(
        capsys,
        "ckpt",
        "--model",
        "gpt2-1.5b",
        "--seq-len",
        "1024",
        "--micro-batch",
        "8",
        "--k",
        "4",
    )
    assert "memory N/k = 12.0 A = 17.9 GB (75% saved)" in out


@pytest.mark.parametrize(
    "size,units,util", [(32, 1, "100.0"), (33, 2, "51.6"), (64, 2, "100.0"), (65, 3, "67.7")]
)
def test_seed004_wave_quantization_table(
    capsys: pytest.CaptureFixture[str], size: int, units: int, util: str
) -> None:
    out = _napkin(capsys, "waves", "--size", str(size))
    assert f"units = ceil({size}/32) = {units}" in out
    assert f"= {util}%" in out


def test_gemm_alignment_and_waves(capsys: pytest.CaptureFixture[str]) -> None:
    # GPT-2's vocabulary 50257 is not a multiple of 8 (why nanoGPT pads it to 50304)
    out = _napkin(
        capsys,
        "gemm",
        "--model",
        "gpt2-1.5b",
        "--gpu",
        "h100-sxm",
        "--seq-len",
        "1024",
        "--micro-batch",
        "8",
    )
    assert "vocab 50257: NOT a multiple of 8" in out
    assert "132 SMs" in out
    # attn out: ceil(8192/128) x ceil(1600/128) = 64 x 13 = 832 tiles over 132 SMs = 6.30 waves,
    # 832 / (7 x 132) = 90.0% busy
    assert "= 832; waves 832/132 = 6.30 -> 90.0%" in out


def test_seed004_tokenizer_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    # Example 1.1: 32 x 1024 = 32.8K tokens; 500K tokens/s per core: 65.5 ms vs an 84.4 ms step;
    # 8 workers: 8.2 ms; 262.1 KB int64 batch; 0.017 ms over 15.75 GB/s
    out = _napkin(
        capsys,
        "tokenizer",
        "--global-batch",
        "32",
        "--seq-len",
        "1024",
        "--step-s",
        "0.0844",
        "--workers",
        "8",
    )
    for needle in (
        "= 32,768",
        "= 65.5 ms per batch vs the 84.4 ms step",
        "= 8.2 ms",
        "262.1 KB",
        "0.017 ms",
    ):
        assert needle in out


def test_seed004_deadline_and_rent_vs_buy(capsys: pytest.CaptureFixture[str]) -> None:
    # Napkin Math 1.5: 6 x 70e9 x 2e12 = 8.4e23 FLOPs; 989 TF x 0.5 = 494.5 TF; 53.8 years on
    # one GPU; 1,024 GPUs -> 19.2 days; rent $1.42M at $3/h, buy $30.7M: 21.7 runs
    flops = ["--params", "70e9", "--tokens", "2e12", "--peak-tflops", "989", "--efficiency", "0.5"]
    out = _napkin(capsys, "deadline", *flops, "--days", "19.2")
    for needle in ("= 8.4e+23", "= 494.5 TFLOP/s", "53.8 years", "= 1,024", "19.2 days"):
        assert needle in out
    out = _napkin(
        capsys,
        "rentbuy",
        *flops,
        "--gpus",
        "1024",
        "--usd-per-gpu-hour",
        "3",
        "--buy-usd-per-gpu",
        "30000",
    )
    for needle in ("19.2 days", "($1.42M)", "($30.7M)", "= 21.7 training runs"):
        assert needle in out


def test_seed004_carbon_footprint(capsys: pytest.CaptureFixture[str]) -> None:
    # Napkin Math 1.11: 6 x 7e9 x 1e12 = 4.2e22 at 156 TF (A100 312 x 0.5) on 1024 GPUs:
    # 3.04 days; (1024 x 400 W + 128 hosts x 200 W) x 73 h = 31,784.2 kWh; x 0.43 kg/kWh
    out = _napkin(
        capsys,
        "run",
        "--params",
        "7e9",
        "--tokens",
        "1e12",
        "--gpu",
        "a100-80gb",
        "--efficiency",
        "0.5",
        "--gpus",
        "1024",
        "--host-watts",
        "200",
        "--pue",
        "1",
        "--grid-co2",
        "0.43",
    )
    for needle in ("156 TFLOP/s", "3.04 days", "128 x 200 W", "31,784.2 kWh", "(13.67 t)"):
        assert needle in out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["memory", "--params", "7e9", "--convention", "14"], "--convention"),
        (["memory", "--params", "-1"], "--params"),
        (["memory"], "--params"),
        (
            ["memory", "--params", "7e9", "--convention", "12", "--precision", "fp32"],
            "--convention",
        ),
        (["ckpt"], "--layers"),
        (["waves", "--size", "0"], "--size"),
        (["gemm", "--model", "gpt2-124m", "--gpu", "cpu"], "--gpu"),
        (["gemm", "--model", "gpt2-124m", "--tile", "big"], "--tile"),
        (["deadline", "--days", "10"], "--flops"),
        (["deadline", "--flops", "1e23", "--days", "10", "--efficiency", "2"], "--efficiency"),
        (["run", "--flops", "1e23", "--gpus", "8", "--pue", "0.9"], "--pue"),
        (
            ["rentbuy", "--flops", "1e23", "--gpus", "8", "--buy-usd-per-gpu", "-1"],
            "--buy-usd-per-gpu",
        ),
        (["tokenizer", "--global-batch", "8", "--seq-len", "1024", "--step-s", "abc"], "--step-s"),
        (["memory", "--model", "no-such-model"], "--model"),
    ],
)
def test_bad_napkin_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    try:
        rc = main(["napkin", *argv])
    except SystemExit as e:  # argparse's type errors (our one-line parser)
        rc = int(e.code or 0)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert "\n" not in err, err
    assert needle in err


# ---- plan / explain --convention: the same worked examples beside the planner's model ---------

GPT2_XL_V100 = [
    "--model",
    "gpt2-1.5b",
    "--gpu",
    "v100-32gb",
    "--gpus",
    "1",
    "--seq-len",
    "1024",
    "--params",
    "1.5e9",
]


def test_explain_convention_reproduces_seed004_gpt2(capsys: pytest.CaptureFixture[str]) -> None:
    # Napkin Math 1.3 (batch 8, fp16, 12 B/param): 3 + 3 + 12 GB + 71.7 GB = 89.7 GB
    out = _run(
        capsys,
        [
            "explain",
            *GPT2_XL_V100,
            "--global-batch",
            "8",
            "--precision",
            "fp16",
            "--convention",
            "12",
        ],
    )
    assert "weights   = P/1 x 2 B = 3.00 GB" in out
    assert "optimizer = P/1 x 8 B = 12.0 GB" in out
    # the card: the 31.74 GiB CUDA reports on a V100 32GB (config/hardware.py)
    assert "= 89.7 GB vs 34.1 GB = 31.74 GiB -> DOES NOT FIT" in out
    # Napkin Math 1.6 (batch 4, 16 B/param with fp32 master): 59.9 GB; checkpointing every 4
    # layers: ~33 GB; FP32 baseline: 95.7 GB
    out = _run(
        capsys,
        [
            "explain",
            *GPT2_XL_V100,
            "--global-batch",
            "4",
            "--precision",
            "fp16",
            "--convention",
            "16",
        ],
    )
    assert "textbook total = 24.0 GB + 35.9 GB = 59.9 GB" in out
    out = _run(
        capsys,
        [
            "explain",
            *GPT2_XL_V100,
            "--global-batch",
            "4",
            "--precision",
            "fp16",
            "--convention",
            "16",
            "--ckpt-every",
            "4",
        ],
    )
    assert "textbook total = 24.0 GB + 8.97 GB = 33.0 GB" in out
    # the textbook fits and the planner does not (#41): the output names the term behind it,
    # and taking that term out of the planner's reserved bytes flips its verdict
    assert "-> fits (planner:" in out and "DOES NOT FIT" in out
    flat = " ".join(out.split())  # the line wraps at the terminal's width
    why = flat[flat.index("why the verdicts differ") : flat.index("ignores: buffers")]
    assert "the term that makes the difference is model states (+3.9 GB)" in why
    assert why.rstrip().endswith("without it the planner's 33.8 GB fits")
    out = _run(
        capsys,
        [
            "explain",
            *GPT2_XL_V100,
            "--global-batch",
            "4",
            "--precision",
            "fp32",
            "--convention",
            "16",
        ],
    )
    assert "textbook total = 24.0 GB + 71.7 GB = 95.7 GB" in out


def test_plan_convention_reproduces_seed003_zero3(capsys: pytest.CaptureFixture[str]) -> None:
    # seed 003: 7B, 8 GPUs, ZeRO-3, 16 B/param: 1.75 + 1.75 + 10.5 GB; seed 004 Napkin Math 1.4's
    # activations for b=1, s=2048 (Llama-2-7B shape): 30.6 GB
    out = _run(
        capsys,
        [
            "plan",
            "--model",
            "llama2-7b",
            "--gpu",
            "a100-80gb",
            "--gpus",
            "8",
            "--dp",
            "8",
            "--zero",
            "3",
            "--seq-len",
            "2048",
            "--global-batch",
            "8",
            "--convention",
            "16",
            "--params",
            "7e9",
        ],
    )
    assert "weights   = P/1 x 2 B / 8 = 1.75 GB" in out
    assert "grads     = P/1 x 2 B / 8 = 1.75 GB" in out
    assert "optimizer = P/1 x 12 B / 8 = 10.5 GB" in out
    assert "= 14.0 GB + 30.6 GB = 44.6 GB" in out


def test_convention_follows_tp_sp_and_selective(capsys: pytest.CaptureFixture[str]) -> None:
    def per_layer(*extra: str) -> float:
        out = _run(
            capsys,
            [
                "explain",
                "--model",
                "gpt2-774m",
                "--gpu",
                "a100-80gb",
                "--seq-len",
                "1024",
                "--global-batch",
                "8",
                "--convention",
                "16",
                *extra,
            ],
        )
        return _num(out, r"activations per layer \(Korthikanti.* = ([\d.]+) GB")

    full = per_layer("--gpus", "1")
    # Korthikanti Eq. 1 by hand: s*b*h*(34 + 5*a*s/h), 16-bit
    s, b, h, a = 1024, 8, 1280, 20
    assert full == pytest.approx(s * b * h * (34 + 5 * a * s / h) / 1e9, abs=0.005)
    # tensor parallel with sequence parallel divides every term by t (Table 2)
    assert per_layer("--gpus", "2", "--tp", "2", "--sp") == pytest.approx(full / 2, abs=0.005)
    # selective recomputation drops the 5as/h attention-score term
    assert per_layer("--gpus", "1", "--ac", "selective") == pytest.approx(
        s * b * h * 34 / 1e9, abs=0.005
    )


def test_default_output_has_no_textbook_section(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, ["explain", *GPT2])
    assert "textbook" not in out and "-- 9." not in out  # no --convention, no --tokens


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--convention", "14"], "--convention"),
        (["--params", "7e9"], "--params"),
        (["--convention", "16", "--params", "0"], "--params"),
        (["--convention", "16", "--ckpt-every", "0"], "--ckpt-every"),
        (["--convention", "12", "--precision", "fp32"], "--convention"),
        (["--convention", "16", "--json"], "--convention"),
    ],
)
def test_bad_convention_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    assert needle in _error(capsys, ["explain", *GPT2, *argv])


def test_napkin_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from scaletrain.cli import main; "
        "main(['napkin', 'memory', '--model', 'gpt2-124m', '--convention', '16']); "
        "main(['napkin', 'gemm', '--model', 'gpt2-124m']); "
        "assert 'torch' not in sys.modules, 'napkin imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_tokenizer_takes_the_plans_tokens_per_s(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["tokenizer", "--global-batch", "32", "--seq-len", "1024", "--workers", "2"]
    by_step = _napkin(capsys, *base, "--step-s", "0.0844")
    # 32,768 tokens / 0.0844 s = 388,246 tokens/s: the same budget from the rate explain prints
    by_rate = _napkin(capsys, *base, "--tokens-per-s", str(32768 / 0.0844))
    assert by_step.splitlines()[2:] == by_rate.splitlines()[2:]
    assert "= 32.8 ms; cores needed = ceil(388,246 / 500,000) = 1" in by_rate


def test_deadline_takes_n_from_a_model_and_memory_divides_by_tp(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from scaletrain.config import resolve_model

    n = resolve_model("llama2-7b").num_params()
    out = _napkin(
        capsys,
        "deadline",
        "--model",
        "llama2-7b",
        "--tokens",
        "1e12",
        "--days",
        "30",
        "--gpu",
        "h100-sxm",
        "--efficiency",
        "0.4",
    )
    flops = 6 * n * 1e12
    gpus = -(-flops // (989.4e12 * 0.4 * 30 * 86400))
    assert f"= {6 * n * 1e12:.3g}" in out and f"= {int(gpus):,}\n" in out
    out = _napkin(capsys, "memory", "--params", "7e9", "--tp", "2")
    assert "states    = 56.0 GB" in out  # 16 B x 7e9 / 2


def test_napkin_without_a_tool_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert "name a tool" in _error(capsys, ["napkin"])


def test_seed004_gpt2_layer_flops(capsys: pytest.CaptureFixture[str]) -> None:
    # Napkin Math 1.1: B=32, S=1024, d=1600: QKV ~503 GFLOP, QK^T 107 + AV 107 ~ 215, output
    # projection ~168, FFN 16BSd^2; 2228.01 GFLOP per layer, 320.8 TFLOP per step (48 layers),
    # 16041.7 PFLOP over 50,000 steps; 2.6 s per step at a V100's 125 TFLOP/s
    out = _napkin(
        capsys,
        "flops",
        "--model",
        "gpt2-1.5b",
        "--micro-batch",
        "32",
        "--seq-len",
        "1024",
        "--steps",
        "50000",
        "--gpu",
        "v100-32gb",
        "--precision",
        "fp16",
    )
    for needle in (
        "= 503.3 GFLOP",
        "= 214.7 GFLOP",
        "= 167.8 GFLOP",
        "per layer = 2,228.01",
        "= 320.8 TFLOP",
        "= 16,041.7 PFLOP",
        "= 2.57 s",
    ):
        assert needle in out


def test_seed003_and_004_ring_allreduce(capsys: pytest.CaptureFixture[str]) -> None:
    # seed 004 Napkin Math 1.10: 7B fp16 grads = 14 GB, 1.75 x 14 = 24.5 GB, 1.96 s at 12.5 GB/s
    out = _napkin(
        capsys, "allreduce", "--params", "7e9", "--gpus", "8", "--gbps", "12.5", "--compute-s", "1"
    )
    for needle in ("= 14 GB", "1.75 x 14 GB = 24.5 GB", "= 1.96 s", "the network is the wall"):
        assert needle in out
    # seed 003 sec. 19.3: 8 GPUs, 1 GB of gradients: each sends 1.75 GB in ~14 hops
    out = _napkin(capsys, "allreduce", "--bytes", "1e9", "--gpus", "8", "--gbps", "100")
    assert "= 1.75 GB in 2(N-1) = 14 steps" in out


def test_convention_beside_a_framework_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    # Megatron's distributed optimizer (ZeRO-1) at 18 B/param keeps 6 + 12/d bytes per param:
    # 7e9 x (6 + 12/8) = 52.5 GB, printed beside the megatron recipe's own plan
    out = _run(
        capsys,
        [
            "explain",
            "--recipe",
            "megatron",
            "--model",
            "llama2-7b",
            "--gpu",
            "h100-sxm",
            "--gpus",
            "8",
            "--dp",
            "8",
            "--zero",
            "1",
            "--seq-len",
            "4096",
            "--global-batch",
            "8",
            "--ac",
            "selective",
            "--convention",
            "18",
            "--params",
            "7e9",
        ],
    )
    assert "[megatron]" in out
    assert "states    = 52.5 GB" in out
