"""The closing line of `explain` and `dryrun`: fits or does not fit, and by how much."""

from __future__ import annotations

from scaletrain.config import HardwareSpec, fmt_bytes

__all__ = ["verdict_line"]


def verdict_line(used_bytes: float, hardware: HardwareSpec, *, what: str) -> str:
    """'verdict: fits ...' or 'verdict: DOES NOT FIT ...' with the figure and the margin, each
    in binary units (`config.units`)."""
    cap = hardware.memory_bytes
    margin = cap - used_bytes
    head = "fits" if margin >= 0 else "DOES NOT FIT"
    side = f"{fmt_bytes(abs(margin), digits=2)} {'to spare' if margin >= 0 else 'over'}"
    return (
        f"verdict: {head} on {hardware.name} ({hardware.capacity_text()}): {what} "
        f"{fmt_bytes(used_bytes, digits=2)}, {side}"
    )
