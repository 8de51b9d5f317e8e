"""Measurements of real and fake (dry-run) steps, in the planner's memory schema."""
