"""Torch-free analytic planner (see DESIGN.md §5)."""
