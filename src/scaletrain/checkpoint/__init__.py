"""Checkpoints: atomic, verified DCP save/resume; Hugging Face safetensors export (hf.py)."""

from .dcp import (
    AsyncCheckpointer,
    CheckpointError,
    latest_good,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)

__all__ = [
    "AsyncCheckpointer",
    "CheckpointError",
    "latest_good",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
]
