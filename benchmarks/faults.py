"""The fault suite (tests/faults/) run once, with its outcome counted per category.

Each test file of tests/faults/ is one category (command line, TOML, config values, Hugging
Face config.json, data, checkpoints (damage, pickle payloads, retention, resume checks), run
lock, launch environment, ranks, signals, fit check, OOM classification). Every case asserts
either a one-line error naming the field or file, or the documented recovery; this script counts
passed / failed / errored cases and their seconds per category from pytest's JUnit XML and
writes benchmarks/results/faults.md. A second table counts the same cases by fault class
(tests/faults/classes.py: the classes of the issue-38 audit, e.g. checkpoint path escape,
--nproc signals, ENOSPC/EROFS), read from the `fault_class` property that each marked case
(`@pytest.mark.fault(NAME)`) carries into the XML; a class with no case shows as 0.

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


def _classes() -> dict[str, str]:
    """tests/faults/classes.py's CLASSES (name -> what it covers), read without importing the
    test package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "fault_classes", ROOT / "tests" / "faults" / "classes.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return dict(mod.CLASSES)


def _outcome(case: ET.Element) -> str:
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return tag
    return "passed"


def run_suite(quick: bool) -> tuple[dict[str, Counter], dict[str, float], dict[str, Counter]]:
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
        by_class: dict[str, Counter] = {name: Counter() for name in _classes()}
        for case in ET.parse(xml).getroot().iter("testcase"):
            category = case.get("classname", "?").rsplit(".", 1)[-1].removeprefix("test_")
            seconds[category] = seconds.get(category, 0.0) + float(case.get("time", 0))
            outcome = _outcome(case)
            counts.setdefault(category, Counter())[outcome] += 1
            for prop in case.iter("property"):
                if prop.get("name") == "fault_class":
                    by_class.setdefault(prop.get("value", "?"), Counter())[outcome] += 1
        return counts, seconds, by_class


def write(
    counts: dict[str, Counter], seconds: dict[str, float], by_class: dict[str, Counter], quick: bool
) -> Path:
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
    described = _classes()
    lines += [
        "",
        "## By fault class (tests/faults/classes.py)",
        "",
        "| class | what | cases | passed | failed | errors | skipped |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in by_class.items():
        lines.append(
            f"| {name} | {described.get(name, '?')} | {sum(c.values())} | {c['passed']} | "
            f"{c['failure']} | {c['error']} | {c['skipped']} |"
        )
    lines += [
        "",
        "Each class's cases assert one line naming the field, file or rank (or the documented "
        "recovery) and, where the fault meets a run that already wrote files, that every one "
        "of them is still there byte for byte. Cases of earlier rounds carry no class and "
        "count only in the table above. "
        + (
            "--quick: classes whose cases all run the CLI or spawn ranks show 0."
            if quick
            else "A class at 0 cases has lost its tests."
        ),
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
