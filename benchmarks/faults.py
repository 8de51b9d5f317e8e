"""The fault suite (tests/faults/) run once, with its outcome counted per category.

Each test file of tests/faults/ is one category (command line, TOML, config values, Hugging
Face config.json, data, checkpoints (damage, pickle payloads, retention, resume checks), run
lock, launch environment, ranks, signals, fit check, OOM classification). Every case asserts
either a one-line error naming the field or file, or the documented recovery; this script counts
passed / failed / errored cases and their seconds per category from pytest's JUnit XML and
writes benchmarks/results/faults.md.

    python benchmarks/faults.py            # all cases (the subprocess ones take ~3 minutes)
    python benchmarks/faults.py --quick    # without the subprocess (slow-marked) cases
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from _common import RESULTS, git_revision, machine

ROOT = Path(__file__).resolve().parents[1]


def run_suite(quick: bool) -> tuple[dict[str, Counter], dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "faults.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests" / "faults"),
            f"--junitxml={xml}",
        ]
        if quick:
            cmd += ["-m", "not slow"]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
        subprocess.run(cmd, cwd=ROOT, env=env, check=False)
        counts: dict[str, Counter] = {}
        seconds: dict[str, float] = {}
        for case in ET.parse(xml).getroot().iter("testcase"):
            category = case.get("classname", "?").rsplit(".", 1)[-1].removeprefix("test_")
            seconds[category] = seconds.get(category, 0.0) + float(case.get("time", 0))
            outcome = "passed"
            for tag in ("failure", "error", "skipped"):
                if case.find(tag) is not None:
                    outcome = tag
            counts.setdefault(category, Counter())[outcome] += 1
        return counts, seconds


def write(counts: dict[str, Counter], seconds: dict[str, float], quick: bool) -> Path:
    m = machine()
    lines = [
        "# Fault suite (tests/faults/)",
        "",
        f"revision {git_revision()}, {m['platform']}, {m['cpus']} CPUs, "
        f"{'quick (no subprocess cases)' if quick else 'all cases'}",
        "",
        "| category | cases | passed | failed | errors | skipped | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    total: Counter = Counter()
    for cat, c in sorted(counts.items()):
        n = sum(c.values())
        total.update(c)
        lines.append(
            f"| {cat} | {n} | {c['passed']} | {c['failure']} | {c['error']} | "
            f"{c['skipped']} | {seconds.get(cat, 0.0):.1f} |"
        )
    lines.append(
        f"| **total** | {sum(total.values())} | {total['passed']} | "
        f"{total['failure']} | {total['error']} | {total['skipped']} | "
        f"{sum(seconds.values()):.1f} |"
    )
    lines += [
        "",
        "A passed case ended in a one-line error naming the field, variable or file "
        "(cli, napkin, toml, config values, hf_config, data, chat templates, checkpoint "
        "damage, resume, lock, launch env, ranks, fit check, pickle payload, run "
        "directories) or in the documented recovery (signals: saved and resumed bitwise; "
        "retention and damaged checkpoints: the newest good checkpoint kept and resumed "
        "from; byte-tokenized text kept byte-exact; a damaged run-directory file that "
        "verify/status/report can do without passed over). "
        "Seconds: the cases' own time as pytest measured it (2 shared cores; the "
        "subprocess and spawned-rank cases dominate).",
    ]
    out = RESULTS / "faults.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(write(*run_suite(args.quick), args.quick).read_text())


if __name__ == "__main__":
    main()
