"""The parity matrix: every parallel strategy, and their combinations, == one process.

Each row trains one model for 5 AdamW steps (lr 1e-3, gradient clipping at 0.5) in float64 on
its ranks' shares of the same global batches (4 sequences x 16 tokens, same order) and must
reproduce the float64 single-process run: the loss and the pre-clip gradient norm of every step
within 1e-10 relative, every final parameter within 1e-6 (tests/adam_tolerance.py derives both
from the arithmetic; fp32 verdicts depended on the CPU's kernels: AdamW amplifies a near-eps
gradient's rounding up to lr / eps, and an Intel AMX host failed 9 fp32 rows).
Pipeline ranks each return the parameters of their stages; together they
must cover the whole model.

Models: `llama` = tiny-llama (RoPE, GQA 4q/2kv heads, RMSNorm, SwiGLU, untied head); `gpt2` =
tiny (learned positions, tied head, LayerNorm, GELU; under pp its last stage holds a head copy
of the embedding, which must equal the reference's embedding); `llama4` = tiny-llama with 4 layers
(2 pipeline ranks x 2 virtual stages need 4); `moe` = tiny-moe (4 experts, top-2), whose
reference sees the 2 data-parallel shards as 2 accumulation micro-batches because the
load-balancing loss depends on the tokens of one forward.

Measured in float64 (torch 2.13 CPU, AMD EPYC AVX-512, 1 thread per rank, every row of this
matrix and of test_tp_ddp.py): losses and gradient norms <= 1.1e-15 relative; the largest
parameter difference 1.3e-15..1.2e-14 for the data-parallel, pipeline and EP rows, up to 5.5e-14
with tp or cp (cp2xtp2-llama). The bounds sit 5 and 7 orders of magnitude above that, and 3
orders below what a real fault does (a parameter off by ~lr = 1e-3 after one step).

One spawn per world size runs all its rows (start-up dominates otherwise); the two spawns also
feed the per-rank memory test of the ZeRO stages and the mesh-layout test.
"""

from __future__ import annotations

import pytest

from scaletrain.parallel.launch import spawn

from ._parity_fns import assert_matches_reference, reference, train_modes, world4_suite

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

MODELS = {"llama": "tiny-llama", "gpt2": "tiny", "llama4": "tiny-llama-4l", "moe": "tiny-moe"}
DENSE = ("llama", "gpt2")
_1F1B = dict(pp=2, pp_schedule="1f1b")

# mode -> (world size, layout, micro-batches per step, models). Micro-batches are gradient
# accumulation (dp2 and zero3 exercise it), or the pipeline's micro-batches when pp > 1.
MATRIX: dict[str, tuple[int, dict, int, tuple[str, ...]]] = {
    "dp2": (2, dict(dp=2, zero=0), 2, DENSE),
    "zero1": (2, dict(dp=2, zero=1), 1, DENSE),
    "zero2": (2, dict(dp=2, zero=2), 1, DENSE),
    "zero3": (2, dict(dp=2, zero=3), 2, DENSE),
    "hsdp2x2": (4, dict(dp=4, dp_replicate=2, zero=3), 1, DENSE),
    "tp2": (2, dict(tp=2), 1, DENSE),
    "tp2+sp": (2, dict(tp=2, sp=True), 1, DENSE),
    "pp2-gpipe": (2, dict(pp=2, pp_schedule="gpipe"), 4, ("llama4",)),
    "pp2-1f1b": (2, _1F1B, 4, ("llama4", "gpt2")),
    "pp2-interleaved": (2, dict(pp=2, pp_schedule="interleaved", pp_virtual=2), 4, ("llama4",)),
    "pp2-zero-bubble": (2, dict(pp=2, pp_schedule="zero-bubble", pp_virtual=2), 4, ("llama4",)),
    # DeepSeek-V3's V: rank 0 holds stages 0 and 3 (the loss), rank 1 stages 1 and 2
    "pp2-dualpipev": (2, dict(pp=2, pp_schedule="dualpipev", pp_virtual=2), 4, ("llama4",)),
    "cp2": (2, dict(cp=2), 1, DENSE),
    "ep2": (2, dict(dp=2, ep=2), 1, ("moe",)),
    # MoE under pipelining: each stage attaches its load-balancing loss to its backward; 2
    # micro-batches = the moe reference's 2 shards
    "pp2-moe": (2, _1F1B, 2, ("moe",)),
    "fsdp2xtp2": (4, dict(dp=2, zero=3, tp=2, sp=True), 2, DENSE),
    "pp2xfsdp2": (4, dict(dp=2, zero=3, **_1F1B), 2, ("llama4", "gpt2")),
    # ZeRO-3 under a split backward: torch finds the weights' gradient paths through the
    # stage's registered parameters, so its units stay gathered from UNSHARD to RESHARD
    # (`config.fsdp_reshard_after_forward`); resharded after forward, the last stage got no
    # weight gradient at all (v1), or its head and norm none (v2)
    "pp2xfsdp2-zero-bubble": (
        4,
        dict(dp=2, zero=3, pp=2, pp_schedule="zero-bubble"),
        2,
        ("llama4",),
    ),
    "pp2v2xfsdp2-zero-bubble": (
        4,
        dict(dp=2, zero=3, pp=2, pp_schedule="zero-bubble", pp_virtual=2),
        2,
        ("llama4",),
    ),
    # later stages receive T/tp of the sequence under SP: RoPE positions must still span T
    "pp2xtp2+sp": (4, dict(tp=2, sp=True, **_1F1B), 2, ("llama4",)),
    # tp forbids DDP, so the cp ranks (which hold the same weights) share FSDP shards
    "cp2xtp2": (4, dict(cp=2, tp=2, sp=True, zero=3), 1, DENSE),
}
ROWS = [(mode, model) for mode, spec in MATRIX.items() for model in spec[3]]


def _modes(world: int) -> dict[str, tuple]:
    return {
        f"{mode}/{model}": (MODELS[model], layout, micro)
        for mode, (w, layout, micro, models) in MATRIX.items()
        if w == world
        for model in models
    }


@pytest.fixture(scope="module")
def world2() -> list[dict]:
    return spawn(train_modes, 2, _modes(2))


@pytest.fixture(scope="module")
def world4() -> list[dict]:
    return spawn(world4_suite, 4, _modes(4))


@pytest.fixture(scope="module")
def references() -> dict:
    return {m: reference(p, shards=2 if m == "moe" else 1) for m, p in MODELS.items()}


@pytest.mark.parametrize(("mode", "model"), ROWS, ids=[f"{m}-{n}" for m, n in ROWS])
def test_parity(request, references, mode, model):
    world = MATRIX[mode][0]
    per_rank = request.getfixturevalue(f"world{world}")
    ref = references[model]
    covered: set[str] = set()
    for rank, results in enumerate(per_rank):
        covered |= assert_matches_reference(
            results[f"{mode}/{model}"], ref, f"{mode}/{model} rank {rank}"
        )
    assert covered == ref["params"].keys()


def test_matrix_covers_the_acceptance_list():
    assert set(MATRIX) >= {
        "dp2",
        "zero1",
        "zero2",
        "zero3",
        "hsdp2x2",
        "tp2",
        "tp2+sp",
        "pp2-gpipe",
        "pp2-1f1b",
        "pp2-interleaved",
        "pp2-zero-bubble",
        "pp2-dualpipev",
        "cp2",
        "ep2",
        "fsdp2xtp2",
        "pp2xfsdp2",
        "pp2xfsdp2-zero-bubble",
        "cp2xtp2",
    }


def test_zero_stages_shard_what_they_promise(world2):
    """Per-rank bytes of training state at world size 2 (exact local storage on CPU).

    ZeRO-0 (DDP): everything full. ZeRO-1: optimizer states split across ranks (whole
    parameters per rank: the two ranks' shares add up to the full states, neither holds all).
    ZeRO-2: gradients sharded too, blocks' parameters still full between forward and backward.
    ZeRO-3: blocks' parameters sharded during forward/backward as well.
    """
    for model in DENSE:
        mem = {
            m: [r[f"{m}/{model}"]["mem"] for r in world2]
            for m in ("dp2", "zero1", "zero2", "zero3")
        }
        full = mem["dp2"][0]
        assert all(m == full for m in mem["dp2"])
        assert full["optimizer"] == 2 * full["params_at_rest"] == 2 * full["grads"]
        # ZeRO-1: states partitioned, grads and params full.
        z1 = mem["zero1"]
        assert sum(m["optimizer"] for m in z1) == full["optimizer"]
        assert max(m["optimizer"] for m in z1) < full["optimizer"]
        assert all(m["grads"] == full["grads"] for m in z1)
        assert all(
            m["block_params_after_forward"] == full["block_params_after_forward"] for m in z1
        )
        # ZeRO-2: + gradients sharded; full block parameters live from forward to backward.
        for m in mem["zero2"]:
            assert m["optimizer"] == full["optimizer"] // 2
            assert m["grads"] == full["grads"] // 2
            assert m["params_at_rest"] == full["params_at_rest"] // 2
            assert m["block_params_after_forward"] == full["block_params_after_forward"]
        # ZeRO-3: + block parameters resharded right after each block's forward.
        for m in mem["zero3"]:
            assert m["optimizer"] == full["optimizer"] // 2
            assert m["grads"] == full["grads"] // 2
            assert m["block_params_after_forward"] == full["block_params_after_forward"] // 2
        # TP: block weights split over the 2 ranks (norm weights and row-wise biases stay
        # replicated, hence not exactly half).
        for m in (r[f"tp2/{model}"]["mem"] for r in world2):
            assert m["block_params_after_forward"] < 0.55 * full["block_params_after_forward"]


def test_world4_mesh_axes_and_ranks(world4):
    """Axes outermost first pp, dp_replicate, dp_shard, cp, tp: on 2x2 layouts rank r has
    index r // 2 on the outer axis and r % 2 on the inner one."""
    for rank, res in enumerate(world4):
        outer, inner = rank // 2, rank % 2
        hsdp = res["hsdp2x2/llama"]["meshes"]
        assert hsdp["dp"] == (4, rank) and hsdp["dp_cp"] == (4, rank)
        assert hsdp["dp_shard_cp"] == (2, inner)  # shards inside a replica group
        fsdp_tp = res["fsdp2xtp2/llama"]["meshes"]
        assert fsdp_tp["tp"] == (2, inner)
        assert fsdp_tp["dp"] == fsdp_tp["dp_shard_cp"] == (2, outer)
        pp_fsdp = res["pp2xfsdp2/llama4"]["meshes"]
        assert pp_fsdp["pp"] == (2, outer) and pp_fsdp["dp_shard_cp"] == (2, inner)
        cp_tp = res["cp2xtp2/llama"]["meshes"]
        assert cp_tp["cp"] == cp_tp["dp_shard_cp"] == (2, outer) and cp_tp["tp"] == (2, inner)
        assert cp_tp["dp"] == (1, 0)  # cp ranks read the same sequences
        # Expert parallel (ep=2 of dp=4): groups of adjacent data-parallel ranks.
        assert res["ep_group"] == ([0, 1] if rank < 2 else [2, 3])
        # ...and the ranks holding the same experts, whose gradients are averaged together
        assert res["ep_replicate_group"] == ([0, 2] if rank % 2 == 0 else [1, 3])
