"""What torch forces on the dry-run (`dryrun/torch_compat.py`), pinned to the torch version.

When torch changes, these tests say whether the workaround is still needed: torch's pipeline
schedules still cannot step under fake tensors (so `ActionSchedule` stays).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from scaletrain.config import load_config
from scaletrain.trainer.build import DistEnv, build_run
from scaletrain.trainer.step import train_step


def test_written_against_torch_2_13():
    assert torch.__version__.startswith("2.13"), (
        "dryrun/torch_compat.py was written against torch 2.13: re-check "
        "test_torch_schedules_cannot_step_under_fake_tensors and the ModTracker hook"
    )


def test_torch_schedules_cannot_step_under_fake_tensors():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    job = load_config(
        None,
        {
            "model": {"name": "tiny"},
            "parallel": {"pp": 2},
            "batch": {"seq_len": 16, "micro_batch": 1, "global_batch": 2},
            "hardware": {"gpu": "cpu"},
        },
    )
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        run = build_run(
            job,
            env=DistEnv(0, 2, 0, torch.device("cpu")),
            data=False,
            init_weights=False,
            materialize_in=fake,
        )  # torch's own schedule
        with fake:
            batches = iter(
                [(torch.randint(0, 64, (1, 16)), torch.randint(0, 64, (1, 16))) for _ in range(2)]
            )
            # `.item()` (aten._local_scalar_dense) has no value to return under fake tensors
            with pytest.raises(Exception, match="_local_scalar_dense"):
                train_step(run, batches)
    finally:
        dist.destroy_process_group()


def _peak(tracker, model: torch.nn.Module) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracker.track_external(model, opt)
    with tracker:
        for _ in range(2):  # the second step holds the optimizer states
            model(torch.randn(8, 32)).square().sum().backward()
            opt.step()
            opt.zero_grad()
            tracker.reset_mod_stats()
    return tracker.get_tracker_snapshot("peak")


def test_global_peak_tracker_keeps_torchs_peak():
    """The dry-run's trackers skip torch's per-module peak statistics (`_GlobalPeakOnly`): the
    process-wide peak snapshot, the only one the dry-run reads, is torch's own to the byte, and
    `FSDPMemTracker` still inherits the one method replaced."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    from scaletrain.dryrun.torch_compat import frozen_aware_mem_tracker

    assert FSDPMemTracker._update_peak_stats is MemTracker._update_peak_stats

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)
        )

    ours, theirs = _peak(frozen_aware_mem_tracker(), model()), _peak(MemTracker(), model())
    assert ours == theirs and sum(v["Total"] for v in ours.values()) > 0
