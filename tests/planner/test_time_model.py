"""The time model's communication and efficiency terms (planner/time/comm.py, efficiency.py): each
rule against its arithmetic, on layouts where the answer follows from the placement alone."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset
from scaletrain.planner.time.comm import axis_link

A100 = hardware_preset("a100-80gb")


@pytest.mark.parametrize(
    "layout,per_node",
    [
        (Layout(dp=64, zero=3), 8),  # FSDP over 8 nodes: 8 of the group's ranks per node
        (Layout(dp=32, tp=2), 4),  # tp=2 inside: 4 dp ranks per node
        (Layout(dp=8, tp=8, sp=True), 1),  # one dp rank per node: the plain NIC figure
        (Layout(dp=16, tp=4), 2),
    ],
)
def test_multi_rail_ring_bandwidth(layout: Layout, per_node: int) -> None:
    """A ring crossing nodes leaves each node once per channel, channels spread over the
    group's NICs: g ranks per node run at min(NVLink, g x NIC) (comm.py docstring)."""
    bw, lat, inter = axis_link(layout, A100, "dp")
    assert inter and lat == A100.inter_node_latency_s
    assert bw == pytest.approx(min(A100.intra_node_bw, per_node * A100.inter_node_bw))


def test_multi_rail_capped_by_nvlink() -> None:
    """Eight 50 GB/s NICs (400) stay below a raw 450 GB/s NVLink; with a 200 GB/s NIC the
    ring is NVLink-bound, at the bus bandwidth NVLink achieves (the H100's 370 of 450 GB/s,
    HardwareSpec.intra_node_busbw): 8 x 50 = 400 is then capped at 370."""
    h100 = hardware_preset("h100-sxm")
    raw = dataclasses.replace(h100, intra_node_bw_efficiency=1.0)
    assert axis_link(Layout(dp=16), raw, "dp")[0] == pytest.approx(8 * h100.inter_node_bw)
    assert axis_link(Layout(dp=16), h100, "dp")[0] == pytest.approx(370e9)
    fat = dataclasses.replace(h100, inter_node_bw=200e9)
    assert axis_link(Layout(dp=16), fat, "dp")[0] == pytest.approx(fat.intra_node_busbw)
    # inside one node nothing changes
    assert axis_link(Layout(dp=8), h100, "dp")[:2] == (
        h100.intra_node_busbw,
        h100.intra_node_latency_s,
    )


def _attn(
    kernel: str,
    hw_name: str,
    *,
    recompute: bool = False,
    dropout: bool = False,
    recipe: str = "torchtitan",
    bf16_rate: float = 5e14,
    kernel_efficiency: bool = True,
) -> float:
    from scaletrain.planner.time.attention_core import AttentionCore, attention_seconds_per_token

    core = AttentionCore(
        kernel=kernel,
        core_flops=1e9,
        heads=32,
        seq_len=8192,
        recompute=recompute,
        dropout=dropout,
    )
    return attention_seconds_per_token(
        core,
        recipe=recipe,
        bf16_rate=bf16_rate,
        hardware=hardware_preset(hw_name),
        kernel_efficiency=kernel_efficiency,
    )


def test_flash2_runs_at_fa3_papers_rates_on_hopper() -> None:
    """FlashAttention-2 on H100: its forward at 35% of the bf16 peak (FlashAttention-3 paper's
    abstract), its backward at the paper's backward figure (322 of 989.4 TFLOP/s); the
    backward does 2.5x the forward's matmuls; a recompute adds one forward."""
    from scaletrain.planner.time.attention_core import (
        FLASH2_HOPPER_BACKWARD_EFFICIENCY,
        FLASH2_HOPPER_EFFICIENCY,
    )
    from scaletrain.planner.time.flops import FLASH_BACKWARD_FACTOR

    assert round(FLASH2_HOPPER_BACKWARD_EFFICIENCY, 4) == 0.3254
    assert FLASH2_HOPPER_BACKWARD_EFFICIENCY < FLASH2_HOPPER_EFFICIENCY
    peak = hardware_preset("h100-sxm").flops("bf16")
    fwd = 1e9 / (peak * FLASH2_HOPPER_EFFICIENCY)
    bwd = 1e9 * FLASH_BACKWARD_FACTOR / (peak * FLASH2_HOPPER_BACKWARD_EFFICIENCY)
    assert _attn("flash2", "h100-sxm") == pytest.approx(fwd + bwd)
    assert _attn("flash2", "h100-sxm", recompute=True) == pytest.approx(2 * fwd + bwd)
    # a slower matmul rate is not raised; A100 and Megatron's fused (cuDNN) kernel keep it
    assert _attn("flash2", "h100-sxm", bf16_rate=1e14) == pytest.approx(3.5e9 / 1e14)
    assert _attn("flash2", "a100-80gb") == pytest.approx(3.5e9 / 5e14)
    assert _attn("fused", "h100-sxm") == pytest.approx(3.5e9 / 5e14)
    # a user-set efficiency is kept for the attention too
    assert _attn("flash2", "h100-sxm", kernel_efficiency=False) == pytest.approx(3.5e9 / 5e14)


def test_naive_attention_full_block_and_score_traffic() -> None:
    """A materialized core computes the whole s x s block (2x the causal-halved FLOPs, backward
    2x forward) and moves NAIVE_SCORE_BYTES per score element (a x s per token) through
    memory: Megatron's fused softmax + dropout 9 B forward, 11 B backward."""
    v100 = hardware_preset("v100-32gb")
    a, s = 32, 8192
    matmul = 2 * 1e9 * 3 / 5e14
    drop = _attn("naive", "v100-32gb", recipe="deepspeed", dropout=True)
    assert drop == pytest.approx(matmul + (9 + 11) * a * s / v100.memory_bw)
    assert _attn("naive", "v100-32gb", recipe="deepspeed") == pytest.approx(
        matmul + (4 + 6) * a * s / v100.memory_bw
    )
    rc = _attn("naive", "v100-32gb", recipe="deepspeed", dropout=True, recompute=True)
    assert rc == pytest.approx(2 * 1e9 * 4 / 5e14 + (2 * 9 + 11) * a * s / v100.memory_bw)
    # scaletrain's own naive core: fp32 softmax path, 33 + 37 B per score
    own = _attn("naive", "v100-32gb", recipe="scaletrain")
    assert own == pytest.approx(matmul + (33 + 37) * a * s / v100.memory_bw)


def test_recipe_kernels_in_the_step() -> None:
    """The deepspeed recipe (Megatron-DeepSpeed's materialized attention) is slower than the
    default (SDPA) on the same V100 run; the torchtitan recipe on H100 pays FA2's 35%."""
    from scaletrain.config import model_preset
    from scaletrain.planner import PlanInput, estimate

    def plan(hw: str, recipe: str, model: str, seq: int) -> PlanInput:
        return PlanInput(
            model=model_preset(model),
            hardware=hardware_preset(hw),
            num_gpus=8,
            layout=Layout(dp=8, zero=1),
            seq_len=seq,
            global_batch=64,
            micro_batch=1,
            precision="fp16" if hw.startswith("v100") else "bf16",
            ac="none",
            recipe=recipe,
        )

    base = estimate(plan("v100-32gb", "scaletrain", "gpt2-1.5b", 1024)).time.compute_s
    ds = estimate(plan("v100-32gb", "deepspeed", "gpt2-1.5b", 1024)).time.compute_s
    assert ds > base
    h_def = estimate(plan("h100-sxm", "scaletrain", "llama3-8b", 8192)).time.compute_s
    h_meg = estimate(plan("h100-sxm", "megatron", "llama3-8b", 8192)).time.compute_s
    assert h_def > h_meg  # FA2 at 35% vs the fused kernel at the matmul rate


def test_fsdp_collectives_pay_latency_per_unit() -> None:
    """ZeRO-3 gathers and reduce-scatters one FSDP unit (block, then the root) at a time: each
    of the layers + 1 collectives pays the ring's (n-1) latency steps; bytes are unchanged."""
    from scaletrain.planner.time.comm import CommInputs, comm_terms, gather_time

    hw = hardware_preset("a100-80gb")
    layout = Layout(dp=1024, zero=3)
    kw = dict(
        layout=layout,
        hardware=hw,
        stage_params=1e9,
        layers=40,
        moe_layers=0,
        tokens=4096.0,
        hidden=4096,
        kv_dim=4096,
        experts_per_token=1,
        micro_batches=2,
    )
    t = comm_terms(CommInputs(**kw))
    bw, lat, _ = axis_link(layout, hw, "dp")
    n = 1024
    assert t["fsdp_all_gather"][0] == pytest.approx(4 * (n - 1) / n * 2e9)
    per = (n - 1) / n * 2e9 / bw + 41 * (n - 1) * lat
    assert t["fsdp_all_gather"][1] == pytest.approx(4 * per)
    assert t["fsdp_reduce_scatter"][1] == pytest.approx(2 * gather_time(4e9, n, bw, 41 * lat))
    # at 1,024 ranks the latency is a visible share: 41 x 1023 x 10 us = 0.42 s per gather
    assert 41 * (n - 1) * lat > 0.4


def test_torchtitan_op_sac_recomputes_every_second_matmul() -> None:
    """torchtitan's per-op SAC recomputes wk, wo and w3 of each Llama block (every second mm in
    call order) and keeps SDPA's output: the step's block FLOPs grow by exactly that."""
    from scaletrain.config import model_preset
    from scaletrain.planner import PlanInput, estimate
    from scaletrain.planner.time.flops import op_sac_recompute_flops_per_token

    m = model_preset("llama3-8b")
    want = 2.0 * (4096 * 1024 + 4096 * 4096 + 14336 * 4096)
    assert op_sac_recompute_flops_per_token(m) == pytest.approx(want)

    def compute(ac: str) -> float:
        p = PlanInput(
            model=m,
            hardware=A100,
            num_gpus=8,
            layout=Layout(dp=8, zero=3),
            seq_len=4096,
            global_batch=16,
            micro_batch=2,
            ac=ac,
            recipe="torchtitan",
            compile=True,
        )  # compiled: no eager elementwise
        return estimate(p).time.compute_s

    none, sel = compute("none"), compute("selective")
    # the extra matmuls run at the same rate as the block's: the ratio of the matmul FLOPs
    # (the attention core, unchanged, is a small share at 4k tokens)
    from scaletrain.planner.time.flops import matmul_params

    per_layer = matmul_params(m)[0]
    assert 1.0 < sel / none < 1.0 + want / (3 * 2.0 * per_layer)


def test_nemo_overlap_hides_tp_p2p_and_param_gather() -> None:
    """The 'nemo' recipe (efficiency.COMM_OVERLAP: NeMo's performance configs) hides TP,
    pipeline p2p and the updated weights' all-gather behind compute; the same layout under
    'megatron' (Megatron-LM's documented configuration: the interleaved schedule's p2p and
    --overlap-param-gather, no --tp-comm-overlap) hides the latter two and exposes TP. Its
    memory is megatron's, term for term (NeMo trains Megatron-Core's model and distributed
    optimizer)."""
    from scaletrain.config import model_preset
    from scaletrain.planner import PlanInput, estimate

    h100 = hardware_preset("h100-sxm")

    def est(recipe: str):
        return estimate(
            PlanInput(
                model=model_preset("llama2-70b"),
                hardware=h100,
                num_gpus=64,
                layout=Layout(
                    dp=4, zero=1, tp=4, sp=True, pp=4, pp_schedule="interleaved", pp_virtual=5
                ),
                seq_len=4096,
                global_batch=128,
                micro_batch=1,
                ac="none",
                recipe=recipe,
            )
        )

    meg, nemo = est("megatron").time, est("nemo").time
    assert meg.compute_s == pytest.approx(nemo.compute_s)
    for fam in ("tp", "pp_p2p", "zero_all_gather"):
        assert fam in meg.comm_terms and meg.comm_terms[fam] == nemo.comm_terms[fam]
    hidden = meg.comm_terms["tp"]  # what NeMo's tp_comm_overlap hides beyond megatron's
    assert nemo.comm_exposed_s <= meg.comm_exposed_s - hidden + 1e-9
    assert nemo.comm_exposed_s < meg.comm_exposed_s
    m_meg, m_nemo = est("megatron").to_json()["memory"], est("nemo").to_json()["memory"]
    assert m_meg == m_nemo


@pytest.mark.parametrize(
    "recipe,kernel,zero",
    [("torchtitan", "flash2", "3"), ("megatron", "fused", "1"), ("deepspeed", "naive", "1")],
)
def test_explain_names_the_attention_kernel(
    recipe: str, kernel: str, zero: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from scaletrain.cli import main

    rc = main(
        [
            "explain",
            "--recipe",
            recipe,
            "--model",
            "llama3-8b",
            "--gpus",
            "8",
            "--gpu",
            "h100-sxm",
            "--zero",
            zero,
            "--global-batch",
            "8",
        ]
    )
    assert rc == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines()]
    assert any(ln.startswith(f"[{recipe}] attention core: {kernel} (") for ln in lines)


_VIEWS = {
    "view",
    "_unsafe_view",
    "expand",
    "t",
    "transpose",
    "permute",
    "unsqueeze",
    "squeeze",
    "slice",
    "select",
    "detach",
    "alias",
    "as_strided",
    "view_as_complex",
    "view_as_real",
    "split",
    "unbind",
    "split_with_sizes",
    "empty_like",
    "empty",
    "zeros_like",
    "ones_like",
    "new_empty",
    "new_zeros",
    "lift_fresh",
    "randn_like",
    "randn",
    "device",
}  # prim.device: a query, no data


def _eager_block_bytes(
    h: int, heads: int, kv_heads: int, f: int, tokens_s: int, b: int, fused_norm: bool
) -> tuple[float, float]:
    """(forward, forward + backward) bytes per token of every aten op of a torchtitan-style
    Llama block (RMSNorm on x.float(), complex RoPE, SDPA, SwiGLU, bf16) that is not a
    matmul, SDPA or a view, dispatched under fake tensors; a fused norm is charged as one
    kernel (read x, write y; backward read x and dy, write dx)."""
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in _VIEWS or name in ("mm", "addmm", "bmm") or "scaled_dot" in name:
                return out
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            for a in list(args) + outs:
                for t in a if isinstance(a, (list, tuple)) else [a]:
                    if isinstance(t, torch.Tensor):
                        Count.total += t.numel() * t.element_size()
            return out

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if fused_norm:
            return x
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * w

    def rope(x: torch.Tensor, fc: torch.Tensor) -> torch.Tensor:
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * fc).flatten(3).type_as(x)

    hd, s = h // heads, tokens_s
    with FakeTensorMode():
        bf = torch.bfloat16
        w = {
            k: torch.randn(*sh, dtype=bf, requires_grad=True)
            for k, sh in {
                "q": (h, h),
                "k": (kv_heads * hd, h),
                "v": (kv_heads * hd, h),
                "o": (h, h),
                "w1": (f, h),
                "w3": (f, h),
                "w2": (h, f),
                "n1": (h,),
                "n2": (h,),
            }.items()
        }
        fc = torch.randn(1, s, 1, hd // 2, dtype=torch.complex64)
        x = torch.randn(b, s, h, dtype=bf, requires_grad=True)
        with Count():
            a = norm(x, w["n1"])
            q = rope(F.linear(a, w["q"]).view(b, s, heads, hd), fc)
            k = rope(F.linear(a, w["k"]).view(b, s, kv_heads, hd), fc)
            v = F.linear(a, w["v"]).view(b, s, kv_heads, hd)
            rep = heads // kv_heads
            k = k[:, :, :, None].expand(b, s, kv_heads, rep, hd).reshape(b, s, heads, hd)
            v = v[:, :, :, None].expand(b, s, kv_heads, rep, hd).reshape(b, s, heads, hd)
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            hh = x + F.linear(o.transpose(1, 2).reshape(b, s, h), w["o"])
            m = norm(hh, w["n2"])
            y = hh + F.linear(F.silu(F.linear(m, w["w1"])) * F.linear(m, w["w3"]), w["w2"])
            fwd = Count.total
            y.backward(torch.ones_like(y))
    n = b * s
    fused = (8.0 * h, 20.0 * h) if fused_norm else (0.0, 0.0)
    return fwd / n + fused[0], Count.total / n + fused[1]


@pytest.mark.parametrize("fused_norm", [False, True])
def test_eager_elementwise_bytes_recounted(fused_norm: bool) -> None:
    """elementwise.eager_elementwise_bytes against a recount of the eager block's kernels at a
    shape other than the four it was read at (h 768, 12 heads, 4 kv heads, f 2048, 2,048
    tokens); the counts are linear in h, kv, f up to terms that shrink with the batch (the
    RoPE table read by each complex multiply, the norm weights' gradients): 0.3% here, so the
    check holds to 0.5%."""
    from scaletrain.config import ModelConfig
    from scaletrain.planner.time.elementwise import eager_elementwise_bytes

    m = ModelConfig(
        dim=768,
        num_heads=12,
        num_kv_heads=4,
        ffn_dim=2048,
        num_layers=1,
        norm="rmsnorm",
        activation="swiglu",
        position="rope",
    )
    fwd, tot = _eager_block_bytes(768, 12, 4, 2048, 512, 4, fused_norm)
    assert eager_elementwise_bytes(m, fused_norm=fused_norm, recompute=False) == pytest.approx(
        tot, rel=5e-3
    )
    assert eager_elementwise_bytes(m, fused_norm=fused_norm, recompute=True) == pytest.approx(
        tot + fwd, rel=5e-3
    )


def test_torchtitan_eager_pays_its_elementwise_kernels() -> None:
    """torchtitan without compile: each block adds eager_elementwise_bytes per token over the
    memory bandwidth (Llama 3.1 8B: 1.92 MB per token per block, plus a forward's 0.62 MB
    under selective AC); compiled, the fused kernels' compiled_elementwise_bytes (0.61 MB);
    other recipes, nothing."""
    from scaletrain.config import model_preset
    from scaletrain.planner import PlanInput, estimate
    from scaletrain.planner.time.elementwise import (
        compiled_elementwise_bytes,
        eager_elementwise_bytes,
    )

    m, hw = model_preset("llama3-8b"), hardware_preset("h100-sxm")

    def step(recipe: str, compile: bool) -> float:
        return estimate(
            PlanInput(
                m,
                hw,
                8,
                Layout(dp=8, zero=3),
                8192,
                16,
                2,
                "bf16",
                "selective",
                compile=compile,
                recipe=recipe,
            )
        ).time.step_s

    per_tok = eager_elementwise_bytes(m, fused_norm=False, recompute=True)
    assert per_tok == pytest.approx(2.54e6, rel=0.01)
    per_tok -= compiled_elementwise_bytes(m, recompute=True)
    want = per_tok * m.num_layers * 8192 * 2 / hw.memory_bw  # 2 micro-batch rows per rank
    assert step("torchtitan", False) - step("torchtitan", True) == pytest.approx(want, rel=0.02)
    assert step("megatron", False) == step("megatron", True)


def test_explain_shows_torchtitan_eager_kernels(capsys: pytest.CaptureFixture[str]) -> None:
    from scaletrain.cli import main

    args = [
        "explain",
        "--recipe",
        "torchtitan",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--gpu",
        "h100-sxm",
        "--zero",
        "3",
        "--global-batch",
        "16",
        "--seq-len",
        "8192",
        "--micro-batch",
        "2",
        "--ac",
        "selective",
    ]
    assert main(args) == 0
    line = "[torchtitan] eager elementwise kernels: 2.54 MB per token per block"
    assert any(ln.strip().startswith(line) for ln in capsys.readouterr().out.splitlines())
    assert main(args + ["--compile"]) == 0
    out = capsys.readouterr().out
    assert "eager elementwise" not in out
    line = "[torchtitan] compiled (fused) elementwise kernels: 0.61 MB per token per block"
    assert any(ln.strip().startswith(line) for ln in out.splitlines())
