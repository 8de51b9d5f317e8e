"""The closing line of `explain` and `dryrun`: fits or does not fit, and by how many GB."""

from __future__ import annotations

from scaletrain.config import HardwareSpec

__all__ = ["verdict_line"]


def verdict_line(used_bytes: float, hardware: HardwareSpec, *, what: str) -> str:
    """'verdict: fits ...' or 'verdict: DOES NOT FIT ...' with the margin in GB (1e9 bytes)."""
    cap = hardware.memory_bytes
    margin = (cap - used_bytes) / 1e9
    head = "fits" if margin >= 0 else "DOES NOT FIT"
    side = f"{margin:.2f} GB to spare" if margin >= 0 else f"{-margin:.2f} GB over"
    return (
        f"verdict: {head} on {hardware.name} ({hardware.capacity_text()}): {what} "
        f"{used_bytes / 1e9:.2f} GB, {side}"
    )
