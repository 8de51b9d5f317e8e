"""Which layout of a GPU count trains fastest and fits? The layout search.

- `layouts.py`: `search(...)` enumerates every legal layout (`config.layout_problems`), drops
  those that do not fit, ranks the rest by step time and tallies why each family lost.
- `result.py`: what it returns: `SearchResult` and, per strategy family, `FamilyOutcome`.
"""
