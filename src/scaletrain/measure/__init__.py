"""Measurements of real and fake (dry-run) steps, in the planner's memory schema."""

from .dryrun import dryrun, plan_dict
from .schema import Measurement
from .verify import compare, predict, verify_run

__all__ = ["Measurement", "dryrun", "plan_dict", "compare", "predict", "verify_run"]
