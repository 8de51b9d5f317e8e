"""How are estimates shown? Readable output of the planner.

- `report.py`: tables of estimates and searches, the losing families' reasons, the JSON list.
- `explain.py`: one layout's arithmetic, formula by formula, numbers filled in.
- `plot.py`: memory bars and a pipeline Gantt chart (matplotlib, imported on use).
"""
