"""`scaletrain report`: a real tiny run (with a loss spike the guard rolls back) becomes one
self-contained HTML page that headless Chromium renders with every figure decoded."""

import argparse
import json
import re
import subprocess
from pathlib import Path

import pytest

import scaletrain.cli.report as report_cli
import scaletrain.models.transformer as transformer
from scaletrain.cli import main
from scaletrain.config import ConfigError, load_config
from scaletrain.report import load_run, predict_run, write_report
from scaletrain.report.plots import split_rollbacks
from scaletrain.trainer import train

CHROMIUM = "/usr/bin/chromium"
SPIKE_STEP = 9
NUM_FIGURES = 5  # loss, throughput, optimizer, memory bars, memory timeline


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """12 steps of the tiny model; the 9th training forward's loss is multiplied by 10 so the guard
    rolls back to the step-5 checkpoint (a guard event on the loss curve)."""
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "held.txt").write_text("a held-out text, scored on its own. " * 20)
    job = load_config(
        None,
        [
            f"--data.eval_sources=held={tmp / 'held.txt'}",
            "--model.name=tiny",
            "--batch.seq_len=32",
            "--batch.global_batch=4",
            "--batch.micro_batch=4",
            "--train.steps=12",
            "--train.eval_every=4",
            "--train.eval_batches=2",
            "--train.sample_tokens=24",
            "--train.progress=false",
            "--train.tensorboard=false",
            "--data.num_tokens=60000",
            f"--data.cache_dir={tmp / 'cache'}",
            f"--train.run_dir={tmp / 'run'}",
            "--checkpoint.every=5",
            "--guard.window=10",
            "--guard.min_history=4",
            "--guard.skip_steps=2",
        ],
    )
    real, calls = transformer.linear_cross_entropy, {"n": 0}

    def spiky(hidden, weight, targets, **kw):
        loss = real(hidden, weight, targets, **kw)
        if not hidden.requires_grad:  # evaluation (no_grad) is not a training step
            return loss
        calls["n"] += 1
        return loss * 10.0 if calls["n"] == SPIKE_STEP else loss

    with pytest.MonkeyPatch.context() as mp:  # the model's fused head + loss (`head_loss`)
        mp.setattr(transformer, "linear_cross_entropy", spiky)
        result = train(job)
    assert result.rollbacks == 1 and result.steps == 12
    run = tmp / "run"
    # measurement.json gets a per-step memory timeline once measure/ records one for live runs;
    # until then borrow the dry-run's timeline of the same job (the same schema: event, bytes)
    from scaletrain.dryrun import dryrun

    measurement = json.loads((run / "measurement.json").read_text())
    measurement["timeline"] = [
        [e, b] for e, b in dryrun(job, world_size=1, count_flops=False).timeline
    ]
    (run / "measurement.json").write_text(json.dumps(measurement))
    return run


def _chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed: run scripts/install_test_deps.sh")
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1200,3200",
        *args,
        page.resolve().as_uri(),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)


@pytest.mark.slow
def test_report_is_self_contained_and_renders_every_figure(run_dir, tmp_path, capsys):
    assert main(["report", str(run_dir)]) == 0
    page = run_dir / "report.html"
    assert str(page.resolve()) in capsys.readouterr().out
    text = page.read_text()

    # self-contained: every image is an inline PNG, no stylesheet/script/font is fetched
    srcs = re.findall(r'<img [^>]*src="([^"]*)"', text)
    assert len(srcs) == NUM_FIGURES
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r"<(link|script)\b|@import|url\(", text)
    assert not re.search(r'(src|href)="(https?:)?//', text)
    # the sections hold the run's own numbers
    events = [json.loads(line) for line in (run_dir / "guard.jsonl").open()]
    assert events[0]["spike_step"] == SPIKE_STEP and events[0]["restored_step"] == 5
    guard = text.split("Loss-spike guard</h2>", 1)[1].split("<h2>", 1)[0]
    assert re.search(rf"<td>{SPIKE_STEP}</td><td>5</td><td>5..10</td>", guard)
    assert "memory: params" in text and "tokens/s (whole job)" in text and "MFU" in text
    assert "best achievable" in text and "<h2>Sample</h2>" in text
    held = json.loads((run_dir / "run_info.json").read_text())["eval"]["held"]
    assert f"held loss (ppl)<b>{held['val_loss']:.4f} ({held['ppl']:.2f})</b>" in text
    assert 'href="checkpoints/step_00000010/"' in text and 'href="metrics.jsonl"' in text

    # rendered: a probe script (added to a copy, the report itself has none) writes each image's
    # decode state into the DOM after the load event; --dump-dom prints that DOM
    probe = tmp_path / "probe.html"
    script = (
        "<script>window.addEventListener('load', () => { const p = document.createElement("
        "'pre'); p.id = 'probe'; p.textContent = JSON.stringify([...document.images].map("
        "i => [i.complete, i.naturalWidth, i.naturalHeight])); document.body.append(p);"
        "});</script>"
    )
    probe.write_text(text.replace("</body>", script + "</body>"))
    dom = _chromium(tmp_path, probe, "--dump-dom", "--virtual-time-budget=3000").stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom)
    assert found, dom[-2000:]
    images = json.loads(found.group(1))
    assert len(images) == NUM_FIGURES
    assert all(ok and w >= 300 and h >= 200 for ok, w, h in images), images

    # and the screenshot is a page, not a blank: many distinct colours across its height
    from PIL import Image

    shot = tmp_path / "report.png"
    _chromium(tmp_path, page, f"--screenshot={shot}")
    with Image.open(shot) as im:
        rgb = im.convert("RGB")
        assert rgb.size == (1200, 3200)
        assert len(rgb.getcolors(maxcolors=1 << 20) or []) > 100
        # the figures are where the page is: the middle third is not empty either
        middle = rgb.crop((0, 1000, 1200, 2100))
        assert len(middle.getcolors(maxcolors=1 << 20) or []) > 50


@pytest.mark.slow
def test_predicted_vs_measured_uses_the_planner_and_the_measurement(run_dir):
    run = load_run(run_dir)
    pred = predict_run(run)
    assert pred.estimate is not None, pred.error
    assert pred.memory_measured is not None and pred.memory_predicted is not None
    # state bytes are exact on both sides for the tiny fp32 model: the planner agrees exactly
    for cat in ("params", "grads", "optimizer"):
        assert pred.memory_rel_error[cat] == pytest.approx(0.0, abs=1e-9)
    tok_pred, tok_meas = pred.tokens_per_s
    assert tok_pred > 0 and tok_meas == pytest.approx(run.info["tokens_per_s"])


def test_rollback_records_are_split_from_the_kept_curve():
    rows = [{"step": s, "loss": float(s)} for s in (1, 2, 3, 4)]
    rows += [{"step": s, "loss": 10.0 + s} for s in (3, 4, 5)]  # rolled back to step 2
    kept, discarded = split_rollbacks(rows)
    assert [r["step"] for r in kept] == [1, 2, 3, 4, 5]
    assert [r["loss"] for r in kept] == [1.0, 2.0, 13.0, 14.0, 15.0]
    assert [r["loss"] for r in discarded] == [3.0, 4.0]


def test_missing_or_empty_run_dir_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="run_dir"):
        write_report(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="config.json nor metrics.jsonl"):
        write_report(tmp_path)
    assert main(["report", str(tmp_path)]) == 2


def test_a_run_that_died_of_oom_still_gets_a_report(tmp_path):
    """No run_info, measurement or checkpoints: the page shows the plan, the planner's memory
    alone, the curves logged so far, and the OOM report."""
    job = load_config(
        None,
        [
            "--model.name=tiny",
            "--batch.seq_len=32",
            "--batch.global_batch=4",
            "--batch.micro_batch=4",
        ],
    )
    (tmp_path / "config.json").write_text(json.dumps(job.to_dict()))
    rows = [
        {
            "step": s,
            "loss": 5.0 - 0.1 * s,
            "lr": 1e-4 * s,
            "grad_norm": 1.0,
            "tokens_per_s": 100.0 + s,
            "mfu": 1e-3,
            "step_s": 1.0,
            "skipped": s == 2,
        }
        for s in (1, 2, 3)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n{truncated")
    (tmp_path / "oom_report_rank0.json").write_text(
        json.dumps(
            {
                "step": 4,
                "rank": 0,
                "error": "CUDA out of memory <tried 2 GiB>",
                "advice": "set memory.ac=full",
                "overflowed_category": "activations",
            }
        )
    )
    text = write_report(tmp_path).read_text()
    assert "<h2>Out of memory</h2>" in text and "set memory.ac=full" in text
    assert "CUDA out of memory &lt;tried 2 GiB&gt;" in text  # escaped, not markup
    assert "No measurement.json" in text and "no checkpoints" in text
    assert "1 step(s) skipped for non-finite gradients" in text
    # loss, throughput, optimizer and the planner-only memory bars; no timeline
    assert text.count('src="data:image/png;base64,') == 4


def test_flag_set_snapshot():
    parser = argparse.ArgumentParser()
    report_cli.add_arguments(parser, "report")
    flags = sorted(
        o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")
    )
    assert flags == ["--out"]  # grow this list only on purpose (STYLE.md #10)
    assert parser.parse_args(["runs/x"]).run_dir == "runs/x"


def test_out_writes_elsewhere(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    rows = [{"step": s, "loss": 3.0, "tokens_per_s": 10.0, "mfu": 0.0} for s in (1, 2)]
    (tmp_path / "run" / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)))
    out = tmp_path / "elsewhere.html"
    assert main(["report", str(tmp_path / "run"), "--out", str(out)]) == 0
    text = out.read_text()
    assert not (tmp_path / "run" / "report.html").exists()
    assert "The plan cannot be shown" in text  # no config.json: curves only
    assert text.count('src="data:image/png;base64,') == 3


def _tiny_run_without_measurement(tmp_path: Path, step_s: list[float]) -> Path:
    job = load_config(
        None,
        [
            "--model.name=tiny",
            "--batch.seq_len=32",
            "--batch.global_batch=4",
            "--batch.micro_batch=4",
        ],
    )
    (tmp_path / "config.json").write_text(json.dumps(job.to_dict()))
    rows = [
        {"step": i + 1, "loss": 3.0, "tokens_per_s": 128 / s, "mfu": 1e-3, "step_s": s}
        for i, s in enumerate(step_s)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    return tmp_path


def test_measured_step_time_comes_from_the_metrics(tmp_path):
    """Issue #41 item 6: the page's measured step time was blank. It is the mean of the timed
    steps (the first logged step excluded, measure/throughput.py), next to the planner's."""
    run = load_run(_tiny_run_without_measurement(tmp_path, [9.0, 0.25, 0.75]))
    pred = predict_run(run)
    planned, measured = pred.step_s
    assert measured == pytest.approx(0.5) and planned is not None and planned > 0
    text = write_report(run.run_dir).read_text()
    cells = re.search(r"<td>step time \(s\)</td><td>([^<]*)</td><td>([^<]*)</td>", text)
    assert cells is not None and cells.group(2) == "0.5"
    assert cells.group(1) == f"{planned:.4g}"


def test_memory_bar_parts_add_up_to_the_total(tmp_path):
    """Issue #41 item 6: the planned bar rose above its own total (the planner's fields are each
    term's own peak; a backward trades activations for gradients). The filled parts now end at
    the total; what the fields hold beyond it is a separate, hatched part."""
    from scaletrain.report.plots import OTHER, stack_segments

    cats = ("params", "grads", "optimizer", "activations", "buffers")

    def filled(segments):
        return sum(s.height for s in segments if not s.beyond_total)

    def beyond(segments):
        return sum(s.height for s in segments if s.beyond_total)

    over = {"params": 4.0, "grads": 4.0, "optimizer": 8.0, "activations": 10.0, "total": 20.0}
    segs = stack_segments(over, cats)
    assert filled(segs) == 20.0 and beyond(segs) == 6.0
    assert all(s.bottom >= 20.0 for s in segs if s.beyond_total)  # above the total only
    # a part that straddles the total is split at it
    assert [(s.label, s.height) for s in segs if s.label == "activations"] == [
        ("activations", 4.0),
        ("activations", 6.0),
    ]
    under = stack_segments({"params": 4.0, "buffers": 1.0, "total": 8.0}, cats)
    assert filled(under) == 8.0 and under[-1].label == OTHER and under[-1].height == 3.0
    assert filled(stack_segments({"params": 4.0, "grads": 2.0}, cats)) == 6.0  # no total
    # the planner's own prediction for a run with no measurement (the bars the page draws)
    pred = predict_run(load_run(_tiny_run_without_measurement(tmp_path, [1.0, 1.0])))
    p = pred.memory_predicted
    assert p is not None and sum(p[c] for c in cats) > p["total"]  # the case that rose above
    assert filled(stack_segments(p, cats)) == pytest.approx(p["total"], rel=1e-12)
