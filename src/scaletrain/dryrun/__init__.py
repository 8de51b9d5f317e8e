"""Dry-run: the trainer's own build and step under fake tensors, as any rank of any world."""

from .run import DRYRUN_MICROBATCHES, dryrun

__all__ = ["dryrun", "DRYRUN_MICROBATCHES"]
