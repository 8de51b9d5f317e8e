"""torchtune's eager terms beyond the shared Llama block count: its stack-based fp32 RoPE
(TUNE_ROPE_EXTRA) and its fp32 cross-entropy over the logits (TUNE_LOSS_BYTES), each against a
recount written out here kernel by kernel, and what torch.compile leaves of them."""

from __future__ import annotations

from dataclasses import replace

from scaletrain.planner import estimate
from scaletrain.planner.recipes.published import load_runs, plan_input, recipe_of
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.time.elementwise import (
    TUNE_LOSS_BYTES,
    TUNE_LOSS_UPCAST_BYTES,
    TUNE_ROPE_EXTRA,
    eager_elementwise_s,
    eager_loss_s,
    tune_rope_bytes,
)
from scaletrain.planner.types import PlanInput

F32, BF16 = 4.0, 2.0
TITAN_ROPE = (20.0, 20.0)  # torchtitan's complex-multiply RoPE per element, fwd / bwd (casts
# 6 + 6 and the complex product 8, each way), what EAGER_REST_* already holds


def _tune_rope_recount() -> tuple[float, float]:
    """(forward, backward) bytes per rotated element of Llama3ScaledRoPE.forward's kernels,
    (reads + writes) written out; a half is half the elements."""
    half = 0.5
    fwd = [
        BF16 + F32,  # x.float()
        *[half * F32 + half * F32] * 4,  # four products of a strided half with the cache
        *[2 * half * F32 + half * F32] * 2,  # the subtraction and the addition
        F32 + F32,  # torch.stack
        F32 + BF16,  # .type_as(x)
    ]
    bwd = [
        BF16 + F32,  # type_as backward (to fp32)
        half * F32 + half * F32,  # the subtraction's negated gradient
        *[half * F32 + half * F32] * 4,  # each product's gradient times the cache
        *[half * F32 + F32] * 4,  # select_backward per indexing: a full fp32 gradient
        *[2 * F32 + F32] * 3,  # the four select gradients summed
        F32 + BF16,  # .float() backward
    ]
    return sum(fwd), sum(bwd)


def _plan(run: str, **kw: object) -> PlanInput:
    r = {x.name: x for x in load_runs()}[run]
    return replace(plan_input(r, recipe_of(r)), **kw)  # type: ignore[arg-type]


ROW = "tune-a100-80g-l32-3b-full-packed"


def test_rope_extra_is_the_recount_less_torchtitans() -> None:
    fwd, bwd = _tune_rope_recount()
    assert (fwd, bwd) == (48.0, 92.0)
    assert (fwd - TITAN_ROPE[0], bwd - TITAN_ROPE[1]) == TUNE_ROPE_EXTRA


def test_loss_bytes_written_out() -> None:
    fwd = (BF16 + F32) + (F32 + F32)  # upcast, log_softmax
    bwd = F32 + (F32 + F32 + F32) + (F32 + BF16)  # nll grad zeros, log_softmax bwd, upcast bwd
    assert fwd + bwd == TUNE_LOSS_BYTES
    assert TUNE_LOSS_UPCAST_BYTES == (BF16 + F32) * 2


def test_eager_torchtune_block_and_loss_are_charged() -> None:
    p = _plan(ROW)
    assert RECIPES["torchtune"].eager_block == "torchtune"
    m, hw = p.model, p.hardware
    assert tune_rope_bytes(p) == sum(TUNE_ROPE_EXTRA) * (m.q_dim + m.kv_dim)
    llama = replace(RECIPES["torchtune"], eager_block="llama")
    extra = eager_elementwise_s(p, RECIPES["torchtune"]) - eager_elementwise_s(p, llama)
    assert abs(extra * hw.memory_bw - tune_rope_bytes(p)) < 1e-3
    assert eager_loss_s(p, RECIPES["torchtune"]) == TUNE_LOSS_BYTES * m.vocab_size / hw.memory_bw
    # full AC runs the RoPE forward again
    ac = replace(p, ac="full")
    assert tune_rope_bytes(ac) == (2 * TUNE_ROPE_EXTRA[0] + TUNE_ROPE_EXTRA[1]) * (
        m.q_dim + m.kv_dim
    )


def test_what_compile_leaves_of_the_loss() -> None:
    p = _plan(ROW + "-compile")
    r = RECIPES["torchtune"]
    assert p.compile and p.chunked_loss is False
    assert tune_rope_bytes(p) == 0.0
    # full_finetune_single_device drops compile_loss's compiled module: the loss stays eager
    per_logit = p.model.vocab_size / p.hardware.memory_bw
    assert eager_loss_s(p, r) == TUNE_LOSS_BYTES * per_logit
    # lora_finetune_single_device keeps it: the model's upcast only
    lora = replace(p, lora_rank=8, lora_targets=("q", "v"))
    assert eager_loss_s(lora, r) == TUNE_LOSS_UPCAST_BYTES * per_logit
    chunked = _plan(ROW + "-compile-chunkce")
    assert eager_loss_s(chunked, r) == 0.0
    # the compile pair: compile saves more than the fused block bytes alone
    eager, compiled = estimate(_plan(ROW)), estimate(p)
    saved = eager.time.step_s - compiled.time.step_s
    block_only = (
        (
            eager_elementwise_s(replace(_plan(ROW)), replace(r, eager_block="llama"))
            - eager_elementwise_s(p, r)
        )
        * p.model.num_layers
        * p.global_batch
        * p.seq_len
    )
    assert saved > block_only


def test_other_recipes_untouched() -> None:
    p = _plan(ROW)
    for name in ("torchtitan", "automodel"):
        if name in RECIPES:
            assert eager_loss_s(replace(p, recipe=name), RECIPES[name]) == 0.0
