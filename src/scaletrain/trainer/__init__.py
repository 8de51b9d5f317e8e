"""The trainer: build_* functions and one readable loop (see loop.py)."""

from .loop import RunResult, train

__all__ = ["train", "RunResult"]
