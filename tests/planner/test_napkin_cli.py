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

GPT2 = ["--model", "gpt2-124m", "--gpu", "h100-sxm", "--gpus", "16", "--dp", "16",
        "--seq-len", "1024", "--global-batch", "128"]


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
    argv = ["explain", *GPT2, "--tokens", "1e12", "--usd-per-gpu-hour", "3.5", "--pue", "1.1",
            "--grid-co2", "0.25", "--host-watts", "800", "--efficiency", "0.3"]
    t = _energy_terms(_run(capsys, argv))
    assert (t["price"], t["pue"], t["grid"], t["host"], t["efficiency"]) == (
        3.5, 1.1, 0.25, 800, 0.3)
    hours = t["seconds"] / 3600
    # 16 H100s x 700 W (datasheet TDP) + 2 nodes x 800 W, x hours x PUE
    assert t["kwh"] == pytest.approx((16 * 700 + 2 * 800) * hours * 1.1 / 1000, rel=2e-3)
    assert t["co2"] == pytest.approx(t["kwh"] * 0.25, rel=2e-3)
    assert t["usd"] == pytest.approx(16 * hours * 3.5, rel=2e-3)


def test_hardware_toml_is_honoured_like_the_flags(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "hw.toml"
    cfg.write_text('[hardware]\ngpu = "h100-sxm"\ngpus = 16\nusd_per_gpu_hour = 3.5\n'
                   'efficiency = 0.3\npue = 1.1\ngrid_kg_co2_per_kwh = 0.25\n'
                   'host_watts_per_node = 800\n')
    rest = ["--model", "gpt2-124m", "--dp", "16", "--seq-len", "1024", "--global-batch", "128",
            "--tokens", "1e12"]
    from_toml = _run(capsys, ["explain", "--config", str(cfg), *rest])
    from_flags = _run(capsys, ["explain", *GPT2, "--tokens", "1e12", "--usd-per-gpu-hour",
                               "3.5", "--pue", "1.1", "--grid-co2", "0.25", "--host-watts",
                               "800", "--efficiency", "0.3"])
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


@pytest.mark.parametrize("flag,value,needle", [
    ("--pue", "0.8", "--pue"), ("--grid-co2", "-1", "--grid-co2"),
    ("--efficiency", "1.5", "--efficiency"), ("--usd-per-gpu-hour", "-2", "--usd-per-gpu-hour"),
    ("--host-watts", "-5", "--host-watts")])
def test_bad_hardware_flags_are_one_line_errors(capsys: pytest.CaptureFixture[str], flag: str,
                                                value: str, needle: str) -> None:
    err = _error(capsys, ["explain", *GPT2, flag, value])
    assert needle in err
