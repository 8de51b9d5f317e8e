"""MoE experts as grouped GEMMs (issue #37 item 3): every kernel of `grouped_expert_mlp`
against the per-expert loop (forward and backward), the kernel 'auto' picks, fake tensors,
and an op count per forward that does not grow with the number of experts, with token
dropping too."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from scaletrain.models import MoE
from scaletrain.models.moe import ExpertWeights, expert_kernel, grouped_expert_mlp
from scaletrain.models.moe_dispatch import Capacity


def _weights(
    num_experts: int, h: int, f: int, *, activation: str, bias: bool, dtype: torch.dtype
) -> ExpertWeights:
    g = torch.Generator().manual_seed(0)

    def p(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * 0.3).to(dtype)

    e = num_experts
    return ExpertWeights(
        p(e, f, h),
        p(e, h, f),
        p(e, f, h) if activation == "swiglu" else None,
        p(e, f) if bias else None,
        p(e, h) if bias else None,
        p(e, f) if bias and activation == "swiglu" else None,
    )


def _run(kernel: str, x: torch.Tensor, counts: list[int], activation: str, w: ExpertWeights):
    """Output and the gradients of x and every weight for one kernel (fresh leaves)."""
    x = x.detach().clone().requires_grad_()
    w = w.map(lambda t: t.detach().clone().requires_grad_())
    y = grouped_expert_mlp(x, counts, activation, w, kernel=kernel)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(1)
    y.backward(torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.dtype))
    grads = [t.grad for t in (x, *w) if t is not None]
    return y.detach(), grads


COUNTS = [5, 0, 11, 1, 7, 0]  # an empty expert, a one-row expert, uneven loads


@pytest.mark.parametrize("activation,bias", [("swiglu", False), ("gelu", True), ("swiglu", True)])
def test_padded_bmm_matches_the_loop_in_float64(activation: str, bias: bool) -> None:
    w = _weights(len(COUNTS), 16, 24, activation=activation, bias=bias, dtype=torch.float64)
    x = torch.randn(sum(COUNTS), 16, dtype=torch.float64)
    ref, ref_grads = _run("loop", x, COUNTS, activation, w)
    out, grads = _run("padded_bmm", x, COUNTS, activation, w)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("activation,bias", [("swiglu", False), ("gelu", True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_matches_the_loop(activation: str, bias: bool, dtype: torch.dtype) -> None:
    """torch._grouped_mm takes no float64: fp32 (its CPU kernel) to 1e-5, and bf16 to bf16's
    rounding (the loop in bf16 rounds the same products in another order)."""
    w = _weights(len(COUNTS), 16, 24, activation=activation, bias=bias, dtype=dtype)
    x = torch.randn(sum(COUNTS), 16, dtype=torch.float64).to(dtype)
    ref, ref_grads = _run("loop", x, COUNTS, activation, w)
    out, grads = _run("grouped_mm", x, COUNTS, activation, w)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, atol=tol * 4, rtol=tol)


@pytest.mark.parametrize("kernel", ["grouped_mm", "padded_bmm", "loop"])
def test_no_rows_at_all(kernel: str) -> None:
    """An expert-parallel rank nobody routed to: (0, h) out, zero weight gradients."""
    w = _weights(3, 16, 24, activation="swiglu", bias=True, dtype=torch.bfloat16)
    w = w.map(lambda t: t.requires_grad_())
    x = torch.zeros(0, 16, dtype=torch.bfloat16, requires_grad=True)
    y = grouped_expert_mlp(x, [0, 0, 0], "swiglu", w, kernel=kernel)  # type: ignore[arg-type]
    y.sum().backward()
    assert y.shape == (0, 16) and w.w1.grad is not None and not w.w1.grad.any()


def test_grouped_mm_takes_a_broadcast_gradient() -> None:
    """A `.sum()` right after the experts sends a zero-stride gradient, which `_grouped_mm`'s
    own backward refuses; the kernel hands it a contiguous one."""
    w = _weights(3, 16, 24, activation="swiglu", bias=False, dtype=torch.bfloat16)
    w = w.map(lambda t: t.requires_grad_())
    x = torch.randn(9, 16, dtype=torch.bfloat16, requires_grad=True)
    grouped_expert_mlp(x, [2, 3, 4], "swiglu", w, kernel="grouped_mm").sum().backward()
    assert x.grad is not None and w.w1.grad is not None


def test_auto_picks_grouped_mm_where_torch_runs_it_padded_bmm_else_loop_for_fp8() -> None:
    bf16 = _weights(2, 16, 24, activation="swiglu", bias=False, dtype=torch.bfloat16)
    x16 = torch.zeros(4, 16, dtype=torch.bfloat16)
    assert expert_kernel(x16, bf16, F.linear) == "grouped_mm"
    odd = _weights(2, 16, 20, activation="swiglu", bias=False, dtype=torch.bfloat16)
    assert expert_kernel(x16, odd, F.linear) == "padded_bmm"  # f*2 bytes not a multiple of 16
    fp32 = bf16.map(lambda t: t.float())
    assert expert_kernel(x16.float(), fp32, F.linear) == "grouped_mm"  # the CPU kernel
    x32 = x16.float()
    with FakeTensorMode() as mode:  # its meta kernel takes bf16 only
        assert expert_kernel(mode.from_tensor(x32), fp32, F.linear) == "padded_bmm"
        assert expert_kernel(mode.from_tensor(x16), bf16, F.linear) == "grouped_mm"
    f64 = bf16.map(lambda t: t.double())
    assert expert_kernel(x16.double(), f64, F.linear) == "padded_bmm"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with FakeTensorMode() as mode:  # the matmuls run in bf16
            assert expert_kernel(mode.from_tensor(x32), fp32, F.linear) == "grouped_mm"
        assert expert_kernel(x16.double(), f64, F.linear) == "padded_bmm"  # float64 stays

    def fp8_like(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, w, b)

    assert expert_kernel(x16, bf16, fp8_like) == "loop"


def test_autocast_output_dtype_matches_the_loop() -> None:
    torch.manual_seed(0)
    w = _weights(3, 16, 24, activation="swiglu", bias=True, dtype=torch.float32)
    x = torch.randn(9, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = grouped_expert_mlp(x, [2, 3, 4], "swiglu", w, kernel="loop")
        out = grouped_expert_mlp(x, [2, 3, 4], "swiglu", w)  # auto: grouped_mm in bf16
    assert out.dtype == ref.dtype == torch.bfloat16
    # both round to bf16 (the grouped one adds its bias after rounding the product, F.linear
    # inside it), so each is within bf16's rounding of the float64 answer: about a dozen
    # roundings of 2^-9 on the way (x and the weights cast, two products, SiLU, the gate's
    # product, the second product's input and output, the bias), bounded at 16 x 2^-8 of the
    # answer's scale (1,000 seeds on this CPU: at most 4.8 for either kernel). A wrong expert
    # assignment or a dropped bias is off by O(1).
    exact = grouped_expert_mlp(x.double(), [2, 3, 4], "swiglu", w.map(torch.Tensor.double))
    bound = 16 * 2**-8 * exact.abs().max().item()
    assert (ref.double() - exact).abs().max().item() <= bound
    assert (out.double() - exact).abs().max().item() <= bound


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_forward_backward_under_fake_tensors(dtype: torch.dtype) -> None:
    with FakeTensorMode():
        moe = MoE(16, 24, 8, 2, activation="swiglu", bias=True, aux_loss_coef=0.01)
        for p in moe.parameters():  # (Module.to cannot swap fake parameters)
            p.data = p.data.to(dtype)
        x = torch.randn(2, 12, 16, dtype=dtype, requires_grad=True)
        y = moe(x)
        y.sum().backward()
        assert y.shape == x.shape and moe.experts.w1.grad is not None


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _ops_per_step(
    num_experts: int, dtype: torch.dtype, kernel: str, capacity: Capacity | None = None
) -> int:
    torch.manual_seed(0)
    moe = MoE(16, 24, num_experts, 2, activation="swiglu", bias=False, aux_loss_coef=0.01)
    moe = moe.to(dtype)
    moe.experts.kernel = kernel  # type: ignore[assignment]
    moe.capacity = capacity
    x = torch.randn(4, 64, 16, dtype=dtype, requires_grad=True)  # 512 assignments: none empty
    with _CountOps() as counter:
        moe(x).float().square().mean().backward()
    if capacity is not None:  # the capacity is in force: some expert overflowed and dropped
        kept, routed = moe.last_kept_per_expert, moe.last_tokens_per_expert
        assert kept is not None and routed is not None and int(kept.sum()) < int(routed.sum())
    return sum(counter.ops.values())


@pytest.mark.parametrize(
    "dtype,kernel",
    [(torch.bfloat16, "grouped_mm"), (torch.float32, "grouped_mm"), (torch.float64, "padded_bmm")],
)
def test_op_count_does_not_grow_with_the_number_of_experts(dtype, kernel) -> None:
    """aten ops per forward + backward of one MoE layer at 4, 16 and 64 experts: the same
    count with the grouped kernels ('auto' picks them here), 3 more matmuls (and their
    gradients) per expert with the loop."""
    counts = {e: _ops_per_step(e, dtype, "auto") for e in (4, 16, 64)}
    assert len(set(counts.values())) == 1, counts
    loop = {e: _ops_per_step(e, dtype, "loop") for e in (4, 16)}
    assert loop[16] - loop[4] >= 12 * 3, loop
    assert (
        expert_kernel(
            torch.zeros(1, 16, dtype=dtype),
            _weights(2, 16, 24, activation="swiglu", bias=False, dtype=dtype),
            F.linear,
        )
        == kernel
    )


@pytest.mark.parametrize("pad", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("policy", ["probs", "position"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_op_count_with_token_dropping_does_not_grow_with_the_number_of_experts(
    dtype, policy, pad
) -> None:
    """With an expert capacity (models/moe_dispatch.py, factor 0.9: every expert count
    drops some) the permutation is still done once: the same aten op count at 4, 16 and 64
    experts, with the grouped GEMMs and with the padded bmm."""
    capacity = Capacity(0.9, policy, pad)
    counts = {e: _ops_per_step(e, dtype, "auto", capacity) for e in (4, 16, 64)}
    assert len(set(counts.values())) == 1, counts


@pytest.mark.parametrize("kernel", ["grouped_mm", "padded_bmm"])
def test_dry_run_flop_counter_counts_the_grouped_gemms_as_the_loop(kernel: str) -> None:
    """Forward + backward FLOPs of the grouped kernels equal the loop's in the dry-run's
    counter (`_grouped_mm` taught to it; the padded bmm counts its padding, none here)."""
    from scaletrain.dryrun.flops import flop_counter

    counts = [4, 4, 4, 4]  # balanced, as the dry-run dispatches
    w = _weights(4, 16, 24, activation="swiglu", bias=False, dtype=torch.bfloat16)
    x = torch.randn(16, 16, dtype=torch.bfloat16)
    flops = {}
    for k in ("loop", kernel):
        with flop_counter() as counter:
            _run(k, x, counts, "swiglu", w)
        flops[k] = counter.get_total_flops()
    assert flops[kernel] == flops["loop"] == 3 * 3 * 2 * 16 * 16 * 24, flops


def test_selective_ac_saves_the_grouped_gemms_like_the_loops_mm() -> None:
    """ac='selective' keeps every matmul's output: the experts' `_grouped_mm` too, else the
    backward recomputes them (+18% FLOPs on mixtral-8x7b-L2 ep8 selective in the dry-run)."""
    from scaletrain.parallel.ac import SELECTIVE_SAVED_OPS

    assert torch.ops.aten._grouped_mm.default in SELECTIVE_SAVED_OPS
