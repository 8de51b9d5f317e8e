"""The run report: one self-contained HTML page per run directory (`scaletrain report`)."""

from .data import Prediction, RunData, load_run, plan_input, predict_run
from .html import render_report, write_report

__all__ = [
    "write_report",
    "render_report",
    "load_run",
    "predict_run",
    "plan_input",
    "RunData",
    "Prediction",
]
