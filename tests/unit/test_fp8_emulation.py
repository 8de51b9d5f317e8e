"""The fp8 GEMM emulation (`scaling.emulated_scaled_mm`) against `torch._scaled_mm`, and the
kernel choice (`precision.fp8_matmul`, `precision/fp8_matmul.py`)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from scaletrain.config import ConfigError, load_config
from scaletrain.precision import E4M3, E5M2, Float8Linear, quantize, scaling
from scaletrain.precision.fp8_matmul import (
    SLOWER_BY,
    Fp8MatmulProbe,
    choose_fp8_matmul,
    kernel_for,
)
from scaletrain.precision.scaling import emulated_scaled_mm, scaled_mm, tiled_scaled_mm

U32 = 2.0**-24  # fp32 unit roundoff
U_BF16 = 2.0**-8  # bf16 unit roundoff: round to nearest, 8 significant bits

# The GEMMs fp8.py runs, as (a's dtype, b's dtype, out dtype, scale mode): tensorwise forward
# (E4M3 x E4M3 -> the compute dtype: bf16 under autocast, fp32 without), dgrad (E5M2 dy x E4M3
# W -> x's dtype), wgrad (E5M2 dy^T x E4M3 x -> fp32); tilewise's per-128-slice rowwise GEMMs
# (E4M3 x E4M3 forward, E5M2 x E4M3 backward -> bf16 partials). E5M2 x E5M2 never runs.
CASES = [
    (E4M3, E4M3, torch.bfloat16, "tensorwise"),
    (E4M3, E4M3, torch.float32, "tensorwise"),
    (E5M2, E4M3, torch.bfloat16, "tensorwise"),
    (E5M2, E4M3, torch.float32, "tensorwise"),
    (E4M3, E4M3, torch.bfloat16, "rowwise"),
    (E5M2, E4M3, torch.bfloat16, "rowwise"),
]


def _operands(a_dtype, b_dtype, mode, m=32, k=128, n=48, seed=0):
    """fp8 a (m, k) row-major and b (k, n) column-major with scales as fp8.py makes them:
    `quantize` per tensor (0-dim scales) or per row of a and column of b (a (m, 1) and a
    (1, n) scale: the 1x128 / 128x128 tiles of one 128-wide K-slice). Heavy-tailed values
    (a few 30x outliers) so the scales and both formats' ranges are exercised."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g))
    w = torch.randn(n, k, generator=g)
    x[0, :4] *= 30.0
    tile = (1, k) if mode == "rowwise" else None
    a, sa = quantize(x, a_dtype, tile)
    wq, sw = quantize(w, b_dtype, tile)
    if mode == "rowwise":
        return a, wq.t(), sa.contiguous(), sw.t().contiguous()  # (m, 1), (1, n)
    return a, wq.t(), sa, sw


def _bound(a, b, sa, sb, ref, out_dtype):
    """How far two correct fp32-accumulating kernels may land apart, elementwise.

    Each computes S = sum_k (a_ik sa_i)(b_kj sb_j) in fp32 with K-1 additions in its own order
    (the emulation: a blocked BLAS sum of dequantized products; a fused fp8 GEMM: a sum of the
    exact fp8 products, then the scales). Rounding operands, products, K-1 partial sums and
    the scaling costs at most (K+2) roundings per term, so each result is within
    gamma_{K+2} * sum_k |a_ik sa_i||b_kj sb_j| of S (Higham, Accuracy and Stability of
    Numerical Algorithms, eq. 3.5; gamma_n = n u / (1 - n u)), whatever the summation order,
    blocking or thread count; the two results within twice that of each other. Not one ulp of
    fp32: cancellation can make S tiny next to sum |a||b|. A bf16 output rounds each result
    once more (half a bf16 ulp, <= u_bf16 |value|, each): within one bf16 ulp on top.
    """
    n = a.shape[1] + 2
    gamma = n * U32 / (1 - n * U32)
    abs_sum = (a.float().abs() * sa.abs()) @ (b.float().abs() * sb.abs())  # (M, N)
    e = 2 * gamma * abs_sum
    if out_dtype == torch.bfloat16:
        e = e + 2 * U_BF16 * (ref.float().abs() + e)
    return e


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize(("a_dtype", "b_dtype", "out_dtype", "mode"), CASES)
def test_emulation_matches_scaled_mm(a_dtype, b_dtype, out_dtype, mode, threads):
    """`emulated_scaled_mm` vs `torch._scaled_mm`: within `_bound` (fp32 output: the K-term fp32
    summation bound; bf16 output: that plus one bf16 ulp), not asserted bitwise. The two are
    bitwise equal where the CPU's `_scaled_mm` is torch's reference path (dequantize, fp32
    matmul: AMD EPYC / AVX-512 without AMX, measured), but oneDNN's fp8 GEMM (AMX hosts) and
    cuBLASLt accumulate in their own order, so bitwise cannot be promised. The bound holds for
    any order, so 1, 2 and 4 threads (different blockings) must all pass."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b, sa, sb = _operands(a_dtype, b_dtype, mode)
        ref = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
        emu = emulated_scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    finally:
        torch.set_num_threads(before)
    assert emu.dtype == ref.dtype == out_dtype and emu.shape == ref.shape
    err = (emu.float() - ref.float()).abs()
    bound = _bound(a, b, sa, sb, ref, out_dtype)
    assert bool((err <= bound).all()), f"worst excess {(err - bound).max().item():.3g}"


def test_the_bound_is_not_vacuous():
    """The tolerance rejects a wrong kernel: dropping one operand's scale, or one K-term."""
    a, b, sa, sb = _operands(E4M3, E4M3, "tensorwise")
    ref = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    bound = _bound(a, b, sa, sb, ref, torch.float32)
    wrong = emulated_scaled_mm(a[:, 1:], b[1:], scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    assert bool(((wrong - ref).abs() > bound).any())
    unscaled = emulated_scaled_mm(a, b, scale_a=sa, scale_b=sb * 0 + 1, out_dtype=torch.float32)
    assert bool(((unscaled - ref).abs() > bound).any())


class _CountScaledMm(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.ops.aten._scaled_mm.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("scaling", ["tensorwise", "tilewise"])
def test_float8_linear_emulated_runs_no_scaled_mm(scaling):
    """matmul='emulated': forward and backward of a Float8Linear issue no `_scaled_mm`;
    'scaled_mm' issues them all (3 GEMMs tensorwise, one per 128-slice tilewise). The
    emulated forward is exactly `emulated_scaled_mm` of the layer's own fp8 operands."""
    torch.manual_seed(0)
    x = torch.randn(64, 256, requires_grad=True)
    counts = {}
    for matmul in ("emulated", "scaled_mm"):
        lin = Float8Linear(256, 128, bias=False, scaling=scaling, matmul=matmul)
        with _CountScaledMm() as c:
            lin(x).sum().backward()
        counts[matmul] = c.calls
    assert counts["emulated"] == 0
    assert counts["scaled_mm"] == (3 if scaling == "tensorwise" else 2 + 1 + 1)
    if scaling == "tensorwise":
        lin = Float8Linear(256, 128, bias=False, matmul="emulated")
        with torch.no_grad():
            xq, sx = quantize(x, E4M3)
            wq, sw = quantize(lin.weight, E4M3)
            want = scaled_mm(xq, sx, wq.t(), sw, torch.float32, emulate=True)
            assert torch.equal(lin(x), want)


def test_tiled_emulation_matches_tiled_scaled_mm():
    """Tile-wise: the same bf16 partial per K-slice within `_bound`, summed in the same fp32
    order: within K/128 partial bounds plus the sums' own rounding."""
    a, b, sa, sb = _operands(E4M3, E4M3, "tensorwise", k=256)
    del sa, sb
    xa, sxa = quantize(a.float(), E4M3, (1, 128))  # (32, 256), (32, 2)
    wq, sw = quantize(b.t().float(), E4M3, (1, 128))  # (48, 256), (48, 2)
    ref = tiled_scaled_mm(xa, sxa, wq.t(), sw.t().contiguous())
    emu = tiled_scaled_mm(xa, sxa, wq.t(), sw.t().contiguous(), emulate=True)
    bound = torch.zeros_like(ref)
    for i in range(2):
        sl = slice(i * 128, (i + 1) * 128)
        part = emulated_scaled_mm(
            xa[:, sl],
            wq.t()[sl],
            scale_a=sxa[:, i : i + 1].contiguous(),
            scale_b=sw[:, i : i + 1].t().contiguous(),
            out_dtype=torch.bfloat16,
        )
        bound += _bound(
            xa[:, sl], wq.t()[sl], sxa[:, i : i + 1], sw[:, i : i + 1].t(), part, torch.bfloat16
        )
    bound += 2 * U32 * (ref.abs() + bound)  # the partials' fp32 sum, rounded in both
    assert bool(((emu - ref).abs() <= bound).all())


def test_kernel_follows_the_measured_ratio():
    def probe(scaled_s: float, emulated_s: float) -> Fp8MatmulProbe:
        return Fp8MatmulProbe(scaled_s, emulated_s, shape=(32, 128, 512), threads=2)

    assert kernel_for(probe(1.0, 1.0)) == "scaled_mm"
    assert kernel_for(probe(SLOWER_BY * 0.9, 1.0)) == "scaled_mm"
    assert kernel_for(probe(1.19, 0.001)) == "emulated"  # issue 32's AMX host, roughly


def test_choice_settings():
    forced = choose_fp8_matmul("emulated", "cpu")
    assert forced.emulate and forced.probe is None
    assert forced.line() == "fp8 matmul: emulated (precision.fp8_matmul=emulated, set)"
    assert choose_fp8_matmul("scaled_mm", "cpu").kernel == "scaled_mm"
    cuda = choose_fp8_matmul("auto", "cuda")
    assert cuda.kernel == "scaled_mm" and cuda.probe is None
    first, again = choose_fp8_matmul("auto", "cpu"), choose_fp8_matmul("auto", "cpu")
    assert first.probe is not None and again.probe is first.probe  # measured once
    assert first.kernel == kernel_for(first.probe)
    assert "\n" not in first.line() and first.line().startswith("fp8 matmul: ")
    with pytest.raises(ValueError, match="fp8 matmul 'fast'"):
        choose_fp8_matmul("fast", "cpu")
    with pytest.raises(ValueError, match="fp8 matmul"):
        Float8Linear(16, 16, matmul="fast")


def test_fp8_matmul_field_parses_and_refuses_bad_values():
    assert load_config(None, []).precision.fp8_matmul == "auto"
    for v in ("auto", "scaled_mm", "emulated"):
        assert load_config(None, [f"--precision.fp8_matmul={v}"]).precision.fp8_matmul == v
    with pytest.raises(ConfigError) as e:
        load_config(None, ["--precision.fp8_matmul=emulate"])
    msg = str(e.value)
    assert e.value.field == "precision.fp8_matmul" and "\n" not in msg
    assert "emulated" in msg  # the valid names (and the did-you-mean)


def test_planner_figures_do_not_depend_on_the_kernel():
    """The planner (torch-free) models our fp8 as `_scaled_mm` runs it on a GPU: on our
    backend the kernel setting reaches no plan input, so no planned figure changes. It only
    picks the backend: 'auto' never gives torchao an emulated run (`config.fp8_backend_for`),
    so 'emulated' plans ours where the others may plan torchao's."""
    from scaletrain.planner import estimate
    from scaletrain.planner.types import plan_input_from_job

    base = ["--model.name=llama3-8b", "--precision.dtype=fp8", "--hardware.gpu=h100-sxm"]
    base += ["--batch.global_batch=64", "--batch.micro_batch=2", "--batch.seq_len=4096"]
    plans = []
    for kernel in ("auto", "scaled_mm", "emulated"):
        job = load_config(
            None, [*base, f"--precision.fp8_matmul={kernel}", "--precision.fp8_backend=scaletrain"]
        )
        layout = job.layout(8)
        plans.append(estimate(plan_input_from_job(job, layout)).to_json())
    assert plans[0] == plans[1] == plans[2]
    emulated = load_config(None, [*base, "--precision.fp8_matmul=emulated"])
    assert plan_input_from_job(emulated, emulated.layout(8)).fp8_backend == "scaletrain"


@pytest.mark.parametrize(
    ("setting", "device", "kernel"),
    [
        ("auto", "cuda", "scaled_mm"),
        ("emulated", "cpu", "emulated"),
        ("scaled_mm", "cpu", "scaled_mm"),
    ],
)
def test_build_run_gives_the_layers_the_kernel_chosen_for_the_target(setting, device, kernel):
    """`build_run(fp8_device=...)` (the dry-run models its target's kernel): 'auto' resolved
    for that device and handed to every Float8Linear (ours: torchao's would take the Linears
    on 'cuda'), so fake CPU tensors do not re-decide."""
    from scaletrain.trainer.build import build_run

    job = load_config(
        None,
        [
            "--model.name=tiny-llama",
            "--precision.dtype=fp8",
            f"--precision.fp8_matmul={setting}",
            "--precision.fp8_backend=scaletrain",
        ],
    )
    run = build_run(job, data=False, fp8_device=device)
    assert run.fp8_matmul is not None and run.fp8_matmul.kernel == kernel
    assert run.job.precision.fp8_matmul == setting  # the job as configured
    states = [m.fp8_state for m in run.model.modules() if isinstance(m, Float8Linear)]
    assert states and all(s.matmul == kernel for s in states)


@pytest.mark.parametrize(("device", "backend"), [("cuda", "torchao"), ("cpu", "scaletrain")])
def test_build_run_converts_the_linears_as_the_target_would(device, backend):
    """`build_run(fp8_device=...)` decides fp8's backend for the target device, as the matmul
    kernel: a dry-run for GPUs on a CPU host runs torchao's Float8Linear, as a GPU run would
    (it was decided by this host's CUDA)."""
    pytest.importorskip("torchao.float8")
    from scaletrain.precision import fp8_backend_of
    from scaletrain.trainer.build import build_run

    job = load_config(None, ["--model.name=tiny-llama", "--precision.dtype=fp8"])
    run = build_run(job, data=False, fp8_device=device)
    assert fp8_backend_of(run.model) == backend


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_widen_is_the_plain_cast_bit_for_bit(dtype):
    """`widen` (bit moves through fp16 on CPU) gives exactly `data.float() * scale` for every bit
    pattern (NaNs included), with a 0-dim scale, a row or column scale,
    and a column-major operand, which keeps its layout."""
    every = torch.arange(256, dtype=torch.uint8).view(dtype).reshape(16, 16)
    scale = torch.tensor(0.0123, dtype=torch.float32)
    rows = torch.linspace(0.5, 3.0, 16).unsqueeze(1)
    for data, s in [
        (every, None),
        (every, scale),
        (every, rows),
        (every.t(), scale),
        (every.t(), rows.t()),
    ]:
        want = data.float() if s is None else data.float() * s
        got = scaling.widen(data, s)
        assert got.dtype == torch.float32 and got.stride() == want.stride()
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
        assert torch.equal(got.isnan(), want.isnan())


@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16])
def test_quantize_fast_paths_equal_the_plain_expressions(src):
    """`abs_max` (aminmax) and `cast_to_fp8` (in-place quotient) equal the expressions they
    replace: `t.float().abs().amax()` and `(t.float() / scale).clamp(-max, max).to(fp8)`;
    a NaN propagates into the amax in both; the input is never modified."""
    g = torch.Generator().manual_seed(1)
    t = (torch.randn(64, 96, generator=g) * 5).to(src)
    keep = t.clone()
    assert torch.equal(scaling.abs_max(t), t.float().abs().amax())
    scale = scaling.abs_max(t) / scaling.fp8_max(E4M3)
    for dtype in (E4M3, E5M2):
        fmax = scaling.fp8_max(dtype)
        want = (t.float() / scale).clamp(-fmax, fmax).to(dtype)
        got = scaling.cast_to_fp8(t, scale, dtype)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(t, keep)
    t[3, 4] = float("nan")
    assert scaling.abs_max(t).isnan() and t.float().abs().amax().isnan()


class _Sub(torch.Tensor):
    """A tensor subclass: `scaling.abs_max` takes its non-CPU-fast path for it, on real values."""


@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16])
def test_abs_max_off_the_cpu_fast_path_is_exact_and_allocates_only_scalars(src):
    """CUDA and fake tensors take amin/amax: the same value as `t.float().abs().amax()` (NaN
    too), and no op of it outputs more than one element (the old expression held an fp32 copy
    of t and its |.|: 8 GiB on Llama-3-70B's gathered TP8+SP input)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    g = torch.Generator().manual_seed(2)
    t = (torch.randn(64, 96, generator=g) * 5).to(src)
    sub = t.as_subclass(_Sub)
    assert torch.equal(scaling.abs_max(sub).as_subclass(torch.Tensor), t.float().abs().amax())
    t[5, 6] = float("nan")
    assert scaling.abs_max(t.as_subclass(_Sub)).isnan()

    class Outputs(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, tuple) else (out,):
                if isinstance(o, torch.Tensor):
                    self.largest = max(self.largest, o.numel())
            return out

    with FakeTensorMode() as fake:
        x = fake.from_tensor(torch.empty(4096, 1024, dtype=src))
        with Outputs() as seen:
            a = scaling.abs_max(x)
    assert a.shape == () and a.dtype == torch.float32
    assert seen.largest == 1


@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16])
def test_abs_max_of_a_dtensor_holds_no_fp32_copy(src):
    """A DTensor (under TP the input of a column-parallel linear, gathered under SP, and a
    row-parallel one's output gradient) takes `abs().amax()` in its own dtype: the value of
    `t.float().abs().amax()`, replicated or sharded, and no op outputs an fp32 tensor of t's
    size from a 16-bit t (the old expression held an fp32 copy and its |.|: 8 B per element,
    8 GiB on Llama-3-70B's TP8+SP dry-run). One rank of the fake process group, on which
    every collective is the identity: the values are the single-process ones."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    class Fp32Outputs(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, tuple) else (out,):
                if isinstance(o, torch.Tensor) and o.dtype == torch.float32:
                    self.largest = max(self.largest, o.numel())
            return out

    g = torch.Generator().manual_seed(3)
    t = (torch.randn(64, 96, generator=g) * 5).to(src)
    t[7, 8] = -100.0  # the largest |value| is a negative one
    want = t.float().abs().amax()
    dist.init_process_group("fake", rank=0, world_size=1, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (1,))
        for placement in (Replicate(), Shard(0), Shard(1)):
            d = DTensor.from_local(t, mesh, [placement], run_check=False)
            with Fp32Outputs() as seen:
                got = scaling.abs_max(d)
            assert got.dtype == torch.float32 and got.shape == ()
            assert torch.equal(got.full_tensor(), want), placement
            assert seen.largest == (t.numel() if src == torch.float32 else 1), placement
        nan = t.clone()
        nan[1, 2] = float("nan")
        assert scaling.abs_max(DTensor.from_local(nan, mesh, [Shard(0)])).full_tensor().isnan()
    finally:
        dist.destroy_process_group()
