"""The fused head + cross-entropy (`models.loss.linear_cross_entropy`) equals
`F.cross_entropy` on the full logits: loss and both gradients, against a float64 reference.

Tolerance: the fp32 results differ from the float64 reference only by fp32 rounding of sums
over h = 32 and V = 50 terms (relative error ~ sqrt(n) * 2^-24 ~ 1e-7 per element); 1e-6
relative leaves margin for the chunked accumulation order of the weight gradient.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scaletrain.models.loss import auto_chunk_tokens, linear_cross_entropy

N, H, V = 37, 32, 50  # 37 tokens: no chunk size below divides it


def _inputs(seed: int = 0, ignore: bool = False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g, dtype=torch.float64)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64) * 0.3
    targets = torch.randint(0, V, (N,), generator=g)
    if ignore:
        targets[::5] = -100
    return hidden, weight, targets


def _grads(fn, hidden, weight, targets, dtype):
    h = hidden.detach().to(dtype).clone().requires_grad_()
    w = weight.detach().to(dtype).clone().requires_grad_()
    loss = fn(h, w, targets)
    loss.backward()
    return loss.detach().double(), h.grad.double(), w.grad.double()


def _reference(h, w, t):
    return F.cross_entropy(
        (h @ w.t()).float() if h.dtype != torch.float64 else h @ w.t(), t, ignore_index=-100
    )


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float) -> None:
    # relative to the tensor's scale, so near-zero elements do not dominate
    assert (a - b).abs().max() <= rtol * b.abs().max(), ((a - b).abs().max(), b.abs().max())


@pytest.mark.parametrize("chunk", [1, 5, 16, 37, 100, 0])
@pytest.mark.parametrize("ignore", [False, True])
def test_matches_full_logits_cross_entropy(chunk, ignore):
    hidden, weight, targets = _inputs(ignore=ignore)
    ref = _grads(_reference, hidden, weight, targets, torch.float64)
    got = _grads(
        lambda h, w, t: linear_cross_entropy(h, w, t, chunk_tokens=chunk),
        hidden,
        weight,
        targets,
        torch.float32,
    )
    for a, b in zip(got, ref, strict=True):
        _close(a, b, 1e-6)


def test_float64_is_exact_to_float64_rounding():
    hidden, weight, targets = _inputs(seed=1, ignore=True)
    ref = _grads(_reference, hidden, weight, targets, torch.float64)
    got = _grads(
        lambda h, w, t: linear_cross_entropy(h, w, t, chunk_tokens=7),
        hidden,
        weight,
        targets,
        torch.float64,
    )
    for a, b in zip(got, ref, strict=True):
        _close(a, b, 1e-12)


def test_bf16_autocast_matches_the_head_linear_path():
    """Under autocast the head matmul runs in bf16 as the nn.Linear head would; the loss
    agrees with the logits path to bf16 rounding of the logits (~2^-8 relative)."""
    hidden, weight, targets = _inputs(seed=3)
    h, w = hidden.float(), weight.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(h, w, targets, chunk_tokens=8)
        plain = F.cross_entropy(F.linear(h, w).float(), targets)
    assert fused.dtype == torch.float32
    assert abs(float(fused) - float(plain)) <= 1e-2 * abs(float(plain))


def test_auto_chunk_bounds_the_fp32_logits():
    for v in (50_257, 128_256, 131_072 // 8, 16):
        c = auto_chunk_tokens(v)
        assert c * v * 4 <= 256 * 2**20 < (c + 1) * v * 4 or v * 4 > 256 * 2**20


def test_no_tokens_by_vocab_tensor_is_saved():
    """What backward keeps: the hidden states, the weight, targets, per-token lse and the
    count — no (N, V) tensor, whatever the chunk size."""
    hidden, weight, targets = _inputs()
    h = hidden.float().requires_grad_()
    w = weight.float().requires_grad_()
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: shapes.append(t.shape) or t, lambda t: t
    ):
        linear_cross_entropy(h, w, targets, chunk_tokens=5)
    assert torch.Size([N, V]) not in shapes
    assert sorted(shapes, key=str) == sorted(
        [h.shape, w.shape, targets.shape, torch.Size([N]), torch.Size([])], key=str
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_gradient_accumulator_becomes_the_weight_grad_without_a_copy(dtype):
    """The backward's (V, h) accumulator is the head weight's gradient itself: AccumulateGrad
    takes the returned tensor as .grad (same storage), also for an fp32 weight under 16-bit
    compute; no second V x h buffer exists. The planner counts it once, as `head_grad`
    (planner/memory/head.head_grad_bytes), not among the loss's temporaries."""
    torch.manual_seed(0)
    hidden = torch.randn(64, 16, dtype=dtype, requires_grad=True)
    weight = torch.randn(100, 16, requires_grad=True)  # fp32 parameter
    incoming: list[int] = []
    weight.register_hook(lambda g: incoming.append(g.data_ptr()))
    linear_cross_entropy(hidden, weight, torch.randint(0, 100, (64,)), chunk_tokens=16).backward()
    assert weight.grad is not None and weight.grad.dtype == torch.float32
    assert incoming == [weight.grad.data_ptr()]


def _bf16_head_grads(hidden, weight, targets, chunk):
    """Loss and gradients of an fp32 head under bf16 compute (the DDP / ZeRO-1 autocast case)."""
    h = hidden.detach().to(torch.bfloat16).clone().requires_grad_()
    w = weight.detach().float().clone().requires_grad_()
    loss = linear_cross_entropy(h, w, targets, chunk_tokens=chunk)
    loss.backward()
    return loss.detach().double(), h.grad.double(), w.grad.double()


@pytest.mark.parametrize("rows", [1, 7, 16])
def test_fp32_head_under_bf16_is_cast_in_blocks(monkeypatch, rows):
    """A head larger than WEIGHT_CAST_BYTES in the compute dtype is cast and multiplied in
    blocks of rows: no (V, h) 16-bit tensor is ever created (neither the cast nor a chunk's
    weight-gradient product), and the results equal the unblocked path's to bf16 rounding.

    Tolerance: both paths multiply the same bf16 operands with fp32 accumulation; they differ
    in where the hidden gradient's sum over V is rounded to bf16 (once per block and then
    summed in fp32, vs once), so by a few bf16 ulps of the hidden gradient (2^-8 relative to
    its scale, times 2 for margin); the weight gradient is accumulated in fp32 on both paths
    from bf16 products of the same operands, which a kernel of another shape may round to
    the other neighbouring bf16 value (one ulp, 2^-8 relative); the loss is an fp32 sum of
    the same fp32 logits (1e-6). A wrong block offset would be off by O(1)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import scaletrain.models.loss as loss_mod

    hidden, weight, targets = _inputs(seed=5)
    whole = _bf16_head_grads(hidden, weight, targets, chunk=8)
    monkeypatch.setattr(loss_mod, "WEIGHT_CAST_BYTES", rows * H * 2)
    made: list[tuple[torch.Size, torch.dtype]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    made.append((t.shape, t.dtype))
            return out

    with Record():
        blocked = _bf16_head_grads(hidden, weight, targets, chunk=8)
    assert (torch.Size([V, H]), torch.bfloat16) not in made
    assert (torch.Size([rows, H]), torch.bfloat16) in made  # the blocks
    assert abs(float(blocked[0] - whole[0])) <= 1e-6 * abs(float(whole[0]))
    _close(blocked[1], whole[1], 2 * 2**-8)
    _close(blocked[2], whole[2], 2**-8)
    # and against the float64 logits path, to bf16 rounding of the inputs and logits
    ref = _grads(_reference, hidden.to(torch.bfloat16).double(), weight, targets, torch.float64)
    assert abs(float(blocked[0] - ref[0])) <= 2**-7 * abs(float(ref[0]))


def test_planner_counts_the_blocked_cast_and_stays_under_1_gb():
    """The planner's copy of the block budget is the trainer's, and with it the loss's own
    temporaries of an fp32 256k x 4096 head under bf16 (DDP / ZeRO-1) at seq 8192 x 2 stay
    under issue #16's 1 GB (the unblocked cast alone was 2.1 GB, its product 2.1 GB more)."""
    import dataclasses

    import scaletrain.models.loss as loss_mod
    from scaletrain.config import resolve_model
    from scaletrain.planner.memory.head import (
        LOSS_WEIGHT_CAST_BYTES,
        MicroBatchShape,
        loss_backward_bytes,
    )

    assert LOSS_WEIGHT_CAST_BYTES == loss_mod.WEIGHT_CAST_BYTES
    model = dataclasses.replace(resolve_model("llama3-8b"), vocab_size=256_000)
    shape = MicroBatchShape(seq_len=8192, micro_batch=2)
    temp = loss_backward_bytes(model, shape, weight_bytes=4)
    assert temp <= 1e9, temp
    whole = dataclasses.replace(model, vocab_size=8_000)  # 8k x 4096 x 2 B: one block
    small = loss_backward_bytes(whole, shape, weight_bytes=4)
    bf16_weight = loss_backward_bytes(whole, shape, weight_bytes=2)
    assert small - bf16_weight == 2 * 8_000 * 4096  # the whole cast, counted once
