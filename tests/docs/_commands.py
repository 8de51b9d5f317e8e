"""Find the shell commands the documentation shows, and the argv that runs each in a test.

Sources (found generically, so a new README section is covered without editing this file):
- fenced ```bash / ```sh / ```shell / ```console blocks of README.md, benchmarks/README.md
  and docs/*.md
  (backslash continuations joined, `#` comments dropped, `a && b` split, `$ ` prompts removed);
- inline code spans of those files that start with a command word (`scaletrain ...`,
  `python benchmarks/...`, `torchrun ...`);
- the leading comment block of every configs/*.toml (`#   scaletrain plan --config ...`).

How each runs (`runnable`):
- `scaletrain train ...`: as written plus `--train.steps=2` (a short run);
- `torchrun ... -m scaletrain train CFG [--section.key=value]`: `scaletrain plan --config CFG
  --gpus nnodes*nproc --json` with the overrides as plan flags, and it must fit;
- `python benchmarks/NAME.py` and `scaletrain bench NAME`: `scaletrain bench NAME --out DIR`
  (never over the committed results); benchmarks that take minutes by design (all but
  `_BENCH_FULL`) run to their argument parsing (`--help`: the bench dispatch and the script's
  imports, where `_common` once failed), their numbers coming from `python benchmarks/NAME.py`;
- placeholders (NAME) become the cheapest benchmark, planner_search;
- `pip install`, `python -m pytest` (the suite running itself), ruff and mypy are skipped.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from scaletrain.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]
DOCS = (
    "README.md",
    "benchmarks/README.md",
    *sorted(f"docs/{f.name}" for f in (ROOT / "docs").glob("*.md")),
)
_FENCE = re.compile(r"^```(\w*)\s*$")
_INLINE = re.compile(
    r"`((?:scaletrain (?:"
    + "|".join(SUBCOMMANDS)
    + r")\b|torchrun )[^`]*|python benchmarks/[^`]+)`"
)
"""Inline spans that are commands: `scaletrain <subcommand> ...` (not output quoted in prose,
such as a `scaletrain watchdog: ...` message), `torchrun ...`, `python benchmarks/...`."""
_PLACEHOLDERS = {"NAME": "planner_search", "RUN_DIR": "runs/default", "$RUN_DIR": "runs/default"}
_SKIP_WORDS = ("pip", "ruff", "mypy", "cd", "export", "sbatch", "docker")
"""sbatch and docker need a Slurm cluster and a Docker daemon: tests/unit/test_slurm_script.py
renders and runs the sbatch script's torchrun line, tests/unit/test_dockerfiles.py lints the
images."""
_BENCH_FULL = ("planner_search", "gpu")
"""Benchmarks cheap enough to run whole in the docs test (gpu: without CUDA it only says so)."""


@dataclass(frozen=True)
class DocCommand:
    source: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.source}: {self.text}"


@dataclass(frozen=True)
class Runnable:
    argv: list[str]
    """Arguments after `python -m scaletrain` (or after the script, with `script`)."""
    must_fit: bool = False
    """The command's plan JSON (--json) must say the layout fits."""
    script: str | None = None
    """A repository script (`python scripts/X.py ...`) run with this Python instead."""


def _split(line: str) -> list[str]:
    """One shell line -> its commands (`a && b` -> [a, b]), comments and prompts dropped."""
    words = shlex.split(line, comments=True)
    out, cur = [], []
    for w in words:
        if w in ("&&", ";"):
            out.append(cur)
            cur = []
        else:
            cur.append(w)
    out.append(cur)
    return [shlex.join(c[1:] if c and c[0] == "$" else c) for c in out if c]


def _fenced(text: str) -> list[str]:
    lines, inside, lang, pending = [], False, "", ""
    for raw in text.splitlines():
        m = _FENCE.match(raw.strip())
        if m:
            inside, lang = (not inside, m.group(1)) if not inside else (False, "")
            continue
        if not inside or lang not in ("bash", "sh", "shell", "console"):
            continue
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if lang == "console" and not line.startswith("$ "):
            continue  # console blocks: only the prompted lines are commands
        if line and not line.startswith("#"):
            lines += _split(line)
    return lines


def _config_header(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        body = re.sub(r"\s+\([^)]*\)\s*$", "", line.lstrip("#").strip())  # "(predict)"
        if re.match(r"(scaletrain|torchrun|python) ", body):
            out += _split(body)
    return out


def doc_commands(root: Path = ROOT) -> list[DocCommand]:
    """Every command the docs show, in document order, each once."""
    found: list[DocCommand] = []
    for rel in DOCS:
        text = (root / rel).read_text()
        found += [DocCommand(rel, c) for c in _fenced(text)]
        found += [DocCommand(rel, c) for m in _INLINE.finditer(text) for c in _split(m.group(1))]
    for cfg in sorted((root / "configs").glob("*.toml")):
        found += [DocCommand(f"configs/{cfg.name}", c) for c in _config_header(cfg.read_text())]
    seen, out = set(), []
    for c in found:
        if c.text not in seen:
            seen.add(c.text)
            out.append(c)
    return out


def _torchrun(words: list[str]) -> Runnable:
    nproc = nnodes = 1
    i = 1
    while i < len(words) and words[i] != "-m":
        w = words[i]
        if w.startswith("--nproc-per-node") or w.startswith("--nproc_per_node"):
            nproc = int(w.split("=", 1)[1] if "=" in w else words[i + 1])
        if w == "--nnodes" or w.startswith("--nnodes="):
            nnodes = int(w.split("=", 1)[1] if "=" in w else words[i + 1])
        i += 1
    rest = words[i + 1 :]
    if rest[:2] != ["scaletrain", "train"]:
        raise ValueError(f"{shlex.join(words)}: only `-m scaletrain train` is mapped")
    config = [w for w in rest[2:] if not w.startswith("--")]
    argv = ["plan", "--gpus", str(nproc * nnodes), "--json"]
    argv += ["--config", config[0]] if config else []
    argv += [w for w in rest[2:] if w.startswith("--")]  # plan takes train's overrides
    return Runnable(argv, must_fit=True)


def runnable(cmd: DocCommand, out_dir: Path) -> Runnable | None:
    """How the test runs `cmd` (None: skipped on purpose, see the module docstring)."""
    words = [_PLACEHOLDERS.get(w, w) for w in shlex.split(cmd.text)]
    if words[0] in _SKIP_WORDS or words[:3] == ["python", "-m", "pytest"]:
        return None
    if words[0] == "torchrun":
        return _torchrun(words)
    if words[0] == "python" and len(words) > 1 and words[1].startswith("scripts/"):
        return Runnable(words[2:], script=words[1])
    if words[0] == "python" and len(words) > 1 and words[1].startswith("benchmarks/"):
        stem = Path(words[1]).stem
        words = ["scaletrain", "bench", _PLACEHOLDERS.get(stem, stem), *words[2:]]
    if words[0] != "scaletrain":
        raise ValueError(f"{cmd.id}: no rule to run this command; extend tests/docs/_commands.py")
    argv = words[1:]
    if argv[:1] == ["bench"] and "--out" not in argv:
        argv = [*argv[:2], "--out", str(out_dir / f"bench-{argv[1]}"), *argv[2:]]
        if argv[1] not in _BENCH_FULL:
            argv.append("--help")
    if argv[:1] == ["train"] and not any(a.startswith("--train.steps") for a in argv):
        argv.append("--train.steps=2")
    return Runnable(argv)


def is_slow(run: Runnable) -> bool:
    """Commands that run real or fake training steps of a large model, or several processes."""
    verb = run.argv[0]
    return verb in ("dryrun", "bench", "profile") or "--nproc" in run.argv
