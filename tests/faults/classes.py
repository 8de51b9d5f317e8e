"""The fault classes of the reliability audits (issue 38), one name each.

A case of tests/faults/ that exercises one carries `@pytest.mark.fault(NAME)`; conftest.py
records it in the JUnit report and benchmarks/faults.py counts passed/failed cases per class,
and test_fault_classes.py checks that every class here has at least one case. A new class of
fault found by an audit gets a name here and its cases in the same change.
"""

from __future__ import annotations

CLASSES: dict[str, str] = {
    "path_escape": "a checkpoint index naming a file outside its directory or not in its manifest",
    "pickle_payload": "a planted pickle in a checkpoint's index or extra file",
    "checkpoint_format": "a checkpoint that matches its manifest but holds wrong fields",
    "all_corrupt": "every checkpoint of a run unusable: no silent restart over them",
    "nproc_signal": "SIGINT/SIGTERM to `train --nproc` (process group or launcher)",
    "rank_killed": "a --nproc rank killed mid-run",
    "output_path": "a run dir, cache dir or --out of the wrong kind, too long or unwritable",
    "disk_full_readonly": "the disk fills (ENOSPC) or turns read-only (EROFS) during a run",
    "resume_data_change": "a resume under another global batch, data seed or corpus",
    "layout_resume": "a resume under another parallel layout (TP degree)",
    "arithmetic_bounds": "values that pass a sign check but stop learning",
    "ignored_options": "options the chosen layout never reads",
    "data_cache_content": "a corpus edited in place with its size and mtime kept",
    "oom_advice": "the out-of-memory report's next layout",
    "run_end_sample": "the sample written at the end of a finished run",
    "interrupted_write": "a writer killed before its rename (ingest, checkpoint save): leftovers",
}
