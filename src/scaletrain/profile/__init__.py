"""`scaletrain profile`: where a training step's time goes, and what to do about it.

profile (torch.profiler around the trainer's own step) -> phase breakdown, op classes, per-op
arithmetic intensity on the hardware's roofline -> bottleneck verdict -> techniques, checked
against the planner -> re-profile (seed 004's loop).
"""

from .driver import ProfileResult, profile_job, profile_run
from .ops import OP_CLASSES, OpAnalysis, OpStat, analyse_events, op_class
from .report import breakdown_rows, plot_roofline, render, to_json, write_outputs
from .verdict import Recommendation, Verdict, classify, memory_bound_share, ridge_point

__all__ = [
    "profile_job",
    "profile_run",
    "ProfileResult",
    "classify",
    "Verdict",
    "Recommendation",
    "render",
    "to_json",
    "plot_roofline",
    "write_outputs",
    "breakdown_rows",
    "analyse_events",
    "op_class",
    "OpAnalysis",
    "OpStat",
    "OP_CLASSES",
    "ridge_point",
    "memory_bound_share",
]
