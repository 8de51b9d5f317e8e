"""Measurements of real steps and their schema, shared with the planner and the dry-run
(`scaletrain.dryrun`, which drives the trainer and so sits above it)."""

from .schema import Measurement, plan_dict
from .verify import compare, predict, verify_run

__all__ = ["Measurement", "plan_dict", "compare", "predict", "verify_run"]
