"""A CPU allocation failure is recognised as out-of-memory (and so gets the OOM report)."""

from __future__ import annotations

import pytest
import torch

from scaletrain.trainer.oom import is_allocation_failure


def test_a_real_cpu_allocation_failure_is_an_oom():
    with pytest.raises(RuntimeError) as e:
        torch.empty(2**62, dtype=torch.uint8)  # 4 EiB: no host can give it
    assert is_allocation_failure(e.value), str(e.value)


@pytest.mark.parametrize(
    ("error", "oom"),
    [
        (MemoryError(), True),
        (torch.OutOfMemoryError("CUDA out of memory"), True),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 bytes"), True),
        (RuntimeError("[enforce fail] not enough memory: you tried to allocate 9 bytes"), True),
        (RuntimeError("shape mismatch"), False),
        (ValueError("not enough memory"), False),
    ],
)
def test_classification(error, oom):
    assert is_allocation_failure(error) is oom


@pytest.mark.fault("oom_advice")
def test_next_layout_advice_never_repeats_the_layout_that_ran_out(monkeypatch):
    """The planner's first choice may be the very layout that just failed (its estimate was
    short of the device): the advice is then its second choice, never the same layout."""
    from types import SimpleNamespace

    from scaletrain.config import Layout, hardware_preset, load_config
    from scaletrain.planner.search.layouts import search
    from scaletrain.trainer import report

    job = load_config(None, ["--model.name=gpt2-124m", "--batch.micro_batch=2"])
    top = search(
        job.model,
        hardware_preset("a100-80gb"),
        8,
        seq_len=job.batch.seq_len,
        global_batch=job.batch.global_batch,
        precision=job.precision.dtype,
        top_k=2,
    ).top
    first = top[0].plan
    failed = SimpleNamespace(
        job=load_config(
            None,
            [
                "--model.name=gpt2-124m",
                f"--batch.micro_batch={first.micro_batch}",
                f"--memory.ac={first.ac}",
            ],
        ),
        hardware=hardware_preset("a100-80gb"),
        env=SimpleNamespace(world_size=8),
        dims=SimpleNamespace(layout=first.layout),
    )
    advice = report._next_layout_advice(failed)
    L = first.layout
    same = (
        f"--parallel.dp={L.dp} --parallel.zero={L.zero} --parallel.tp={L.tp} "
        f"--parallel.sp={str(L.sp).lower()} --parallel.pp={L.pp} --parallel.cp={L.cp} "
        f"--batch.micro_batch={first.micro_batch} --memory.ac={first.ac}"
    )
    assert advice is not None and same not in advice, advice
    assert isinstance(L, Layout)
