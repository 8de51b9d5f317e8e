"""The time model's communication and efficiency terms (planner/comm.py, efficiency.py): each
rule against its arithmetic, on layouts where the answer follows from the placement alone."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset
from scaletrain.planner.comm import axis_link

A100 = hardware_preset("a100-80gb")


@pytest.mark.parametrize("layout,per_node", [
    (Layout(dp=64, zero=3), 8),            # FSDP over 8 nodes: 8 of the group's ranks per node
    (Layout(dp=32, tp=2), 4),              # tp=2 inside: 4 dp ranks per node
    (Layout(dp=8, tp=8, sp=True), 1),      # one dp rank per node: the plain NIC figure
    (Layout(dp=16, tp=4), 2),
])
def test_multi_rail_ring_bandwidth(layout: Layout, per_node: int) -> None:
    """A ring crossing nodes leaves each node once per channel, channels spread over the
    group's NICs: g ranks per node run at min(NVLink, g x NIC) (comm.py docstring)."""
    bw, lat, inter = axis_link(layout, A100, "dp")
    assert inter and lat == A100.inter_node_latency_s
    assert bw == pytest.approx(min(A100.intra_node_bw, per_node * A100.inter_node_bw))


def test_multi_rail_capped_by_nvlink() -> None:
    """Eight 50 GB/s NICs (400) stay below the H100's NVLink (450); with a 200 GB/s NIC the
    ring is NVLink-bound."""
    h100 = hardware_preset("h100-sxm")
    assert axis_link(Layout(dp=16), h100, "dp")[0] == pytest.approx(8 * h100.inter_node_bw)
    fat = dataclasses.replace(h100, inter_node_bw=200e9)
    assert axis_link(Layout(dp=16), fat, "dp")[0] == pytest.approx(fat.intra_node_bw)
    # inside one node nothing changes
    assert axis_link(Layout(dp=8), h100, "dp")[:2] == (h100.intra_node_bw,
                                                        h100.intra_node_latency_s)


def _attn(kernel: str, hw_name: str, **kw: object) -> float:
    from scaletrain.planner.efficiency import attention_seconds_per_token

    args: dict = dict(kernel=kernel, recipe="torchtitan", core_flops=1e9, heads=32,
                      seq_len=8192, recompute=False, dropout=False, bf16_rate=5e14,
                      hardware=hardware_preset(hw_name))
    args.update(kw)
    return attention_seconds_per_token(**args)


def test_flash2_runs_at_fa3_papers_35_percent_on_hopper() -> None:
    """FlashAttention-2 on H100: 35% of the bf16 peak (FlashAttention-3 paper); its backward
    does 2.5x the forward's matmuls; a recompute adds one forward."""
    from scaletrain.planner.efficiency import FLASH2_HOPPER_EFFICIENCY
    from scaletrain.planner.flops import FLASH_BACKWARD_FACTOR

    peak = hardware_preset("h100-sxm").flops("bf16")
    want = 1e9 * (1 + FLASH_BACKWARD_FACTOR) / (peak * FLASH2_HOPPER_EFFICIENCY)
    assert _attn("flash2", "h100-sxm") == pytest.approx(want)
    assert _attn("flash2", "h100-sxm", recompute=True) == pytest.approx(
        want * (2 + FLASH_BACKWARD_FACTOR) / (1 + FLASH_BACKWARD_FACTOR))
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
        matmul + (4 + 6) * a * s / v100.memory_bw)
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
        return PlanInput(model=model_preset(model), hardware=hardware_preset(hw), num_gpus=8,
                         layout=Layout(dp=8, zero=1), seq_len=seq, global_batch=64,
                         micro_batch=1, precision="fp16" if hw.startswith("v100") else "bf16",
                         ac="none", recipe=recipe)

    base = estimate(plan("v100-32gb", "scaletrain", "gpt2-1.5b", 1024)).time.compute_s
    ds = estimate(plan("v100-32gb", "deepspeed", "gpt2-1.5b", 1024)).time.compute_s
    assert ds > base
    h_def = estimate(plan("h100-sxm", "scaletrain", "llama3-8b", 8192)).time.compute_s
    h_meg = estimate(plan("h100-sxm", "megatron", "llama3-8b", 8192)).time.compute_s
    assert h_def > h_meg  # FA2 at 35% vs the fused kernel at the matmul rate


def test_fsdp_collectives_pay_latency_per_unit() -> None:
    """ZeRO-3 gathers and reduce-scatters one FSDP unit (block, then the root) at a time: each
    of the layers + 1 collectives pays the ring's (n-1) latency steps; bytes are unchanged."""
    from scaletrain.planner.comm import comm_terms, gather_time

    hw = hardware_preset("a100-80gb")
    layout = Layout(dp=1024, zero=3)
    kw = dict(layout=layout, hardware=hw, stage_params=1e9, layers=40, moe_layers=0,
              tokens=4096.0, hidden=4096, kv_dim=4096, experts_per_token=1, micro_batches=2)
    t = comm_terms(**kw)
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
    from scaletrain.planner.flops import op_sac_recompute_flops_per_token

    m = model_preset("llama3-8b")
    want = 2.0 * (4096 * 1024 + 4096 * 4096 + 14336 * 4096)
    assert op_sac_recompute_flops_per_token(m) == pytest.approx(want)

    def compute(ac: str) -> float:
        p = PlanInput(model=m, hardware=A100, num_gpus=8, layout=Layout(dp=8, zero=3),
                      seq_len=4096, global_batch=16, micro_batch=2, ac=ac,
                      recipe="torchtitan")
        return estimate(p).time.compute_s

    none, sel = compute("none"), compute("selective")
    # the extra matmuls run at the same rate as the block's: the ratio of the matmul FLOPs
    # (the attention core, unchanged, is a small share at 4k tokens)
    from scaletrain.planner.flops import matmul_params

    per_layer = matmul_params(m)[0]
    assert 1.0 < sel / none < 1.0 + want / (3 * 2.0 * per_layer)


def test_nemo_overlap_hides_tp_p2p_and_param_gather() -> None:
    """The 'nemo' recipe (efficiency.COMM_OVERLAP: NeMo's performance configs) hides TP,
    pipeline p2p and the updated weights' all-gather behind compute; the same layout under
    'megatron' (Megatron-LM's defaults) exposes them. Its memory is megatron's, term for term
    (NeMo trains Megatron-Core's model and distributed optimizer)."""
    from scaletrain.config import model_preset
    from scaletrain.planner import PlanInput, estimate

    h100 = hardware_preset("h100-sxm")

    def est(recipe: str):
        return estimate(PlanInput(
            model=model_preset("llama2-70b"), hardware=h100, num_gpus=64,
            layout=Layout(dp=4, zero=1, tp=4, sp=True, pp=4, pp_schedule="interleaved",
                          pp_virtual=5), seq_len=4096, global_batch=128, micro_batch=1,
            ac="none", recipe=recipe))

    meg, nemo = est("megatron").time, est("nemo").time
    assert meg.compute_s == pytest.approx(nemo.compute_s)
    for fam in ("tp", "pp_p2p", "zero_all_gather"):
        assert fam in meg.comm_terms and meg.comm_terms[fam] == nemo.comm_terms[fam]
    hidden = meg.comm_terms["tp"] + meg.comm_terms["pp_p2p"]
    assert nemo.comm_exposed_s <= meg.comm_exposed_s - hidden + 1e-9
    assert nemo.comm_exposed_s < meg.comm_exposed_s
    m_meg, m_nemo = est("megatron").to_json()["memory"], est("nemo").to_json()["memory"]
    assert m_meg == m_nemo


@pytest.mark.parametrize("recipe,kernel,zero", [("torchtitan", "flash2", "3"),
                                                ("megatron", "fused", "1"),
                                                ("deepspeed", "naive", "1")])
def test_explain_names_the_attention_kernel(recipe: str, kernel: str, zero: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from scaletrain.cli import main

    rc = main(["explain", "--recipe", recipe, "--model", "llama3-8b", "--gpus", "8",
               "--gpu", "h100-sxm", "--zero", zero, "--global-batch", "8"])
    assert rc == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines()]
    assert any(ln.startswith(f"[{recipe}] attention core: {kernel} (") for ln in lines)
