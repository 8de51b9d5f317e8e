"""scaletrain: plan, dry-run, train and verify parallel transformer training."""

__version__ = "0.1.0"
