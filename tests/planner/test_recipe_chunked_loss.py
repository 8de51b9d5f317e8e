"""torchtitan's chunked head + loss under the torchtitan recipe (`PlanInput.chunked_loss` True,
`Recipe.chunked_loss_tokens`; recipes/activations.py `recipe_head_bytes` and
`_chunked_wrapper_temp`, after torchtitan/components/loss.py ChunkedLossWrapper at 94609ad):
the head and loss run forward and backward one chunk at a time inside the loss call, so no
logits are stored for the decoder's backward; the loss call holds the replicated hidden states,
their fp32 gradient accumulator and one chunk's loss temporaries."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import Layout, hardware_preset, model_preset
from scaletrain.planner.recipes.activations import recipe_head_bytes
from scaletrain.planner.recipes.memory import recipe_rank_memory
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.types import PlanInput

TT = RECIPES["torchtitan"]


def _plan(seq: int = 4096, micro: int = 4, **layout: object) -> PlanInput:
    L = Layout(**{"dp": 2, "zero": 3, **layout})  # type: ignore[arg-type]
    return PlanInput(
        model=model_preset("llama3-8b"),
        hardware=hardware_preset("h100-sxm"),
        num_gpus=L.dp * L.tp * L.pp * L.cp,
        layout=L,
        seq_len=seq,
        global_batch=L.dp * micro,
        micro_batch=micro,
        ac="full",
        recipe="torchtitan",
    )


def _sizes(plan: PlanInput) -> tuple[float, float, float]:
    """(T tokens of the rank, h, V_l)."""
    L = plan.layout
    return (
        float(plan.seq_len) / L.cp * plan.micro_batch,
        float(plan.model.dim),
        plan.model.vocab_size / L.tp,
    )


@pytest.mark.parametrize("tp", [1, 4])
def test_chunked_stores_no_logits_and_no_head_input(tp: int) -> None:
    """Stated chunked: the stored head tensors are the unchunked ones less the head's saved
    input (e*T*h, /tp only with the shard-saving rule) and the fp32 log-softmax (4*T*V_l)."""
    base = _plan(tp=tp, sp=tp > 1)
    T, h, v_l = _sizes(base)
    stored, _ = recipe_head_bytes(base, TT)
    chunked, _ = recipe_head_bytes(dataclasses.replace(base, chunked_loss=True), TT)
    tsp = tp if TT.sp_linear_saves_shard else 1
    assert stored - chunked == pytest.approx(2.0 * T * h / tsp + 4.0 * T * v_l)


@pytest.mark.parametrize("tp,per_logit", [(1, 12.0), (4, 16.0)])
def test_eager_chunk_temporaries(tp: int, per_logit: float) -> None:
    """Eager: hidden states e*T*h + fp32 accumulator 4*T*h + one chunk's 16-bit logits and loss
    temporaries, (e + 16)*c*V_l under TP (the vocab-parallel backward's zeros_like, exp and sum
    beside the saved fp32 log-probs), (e + 12)*c*V_l without."""
    base = dataclasses.replace(_plan(tp=tp, sp=tp > 1), chunked_loss=True)
    T, h, v_l = _sizes(base)
    c = float(TT.chunked_loss_tokens)
    assert c < T
    chunk = (2.0 + per_logit) * c * v_l
    assert chunk > 2.0 * T * h  # the chunk, not the end's 16-bit cast, is the larger
    _, temp = recipe_head_bytes(base, TT)
    assert temp == pytest.approx(6.0 * T * h + chunk)


def test_compiled_chunk_temporaries() -> None:
    """Compiled loss (compile_loss True): one chunk's 16-bit logits and 16-bit gradient plus
    8 B per token; here the end's 16-bit cast of the accumulated gradient is the larger."""
    base = dataclasses.replace(_plan(tp=4, sp=True), chunked_loss=True, compile_loss=True)
    T, h, v_l = _sizes(base)
    c = float(TT.chunked_loss_tokens)
    chunk = 4.0 * c * v_l + 8.0 * c
    _, temp = recipe_head_bytes(base, TT)
    assert temp == pytest.approx(6.0 * T * h + max(chunk, 2.0 * T * h))
    eager = recipe_head_bytes(dataclasses.replace(base, compile_loss=False), TT)[1]
    assert temp < eager


def test_chunk_length_override_and_cap() -> None:
    """PlanInput.loss_chunk_tokens > 0 sets the chunk; a chunk is at most the rank's tokens."""
    base = dataclasses.replace(_plan(tp=4, sp=True), chunked_loss=True)
    T, h, v_l = _sizes(base)
    small = recipe_head_bytes(dataclasses.replace(base, loss_chunk_tokens=1024), TT)[1]
    large = recipe_head_bytes(dataclasses.replace(base, loss_chunk_tokens=10 * int(T)), TT)[1]
    assert small == pytest.approx(6.0 * T * h + max(18.0 * 1024 * v_l, 2.0 * T * h))
    assert large == pytest.approx(6.0 * T * h + 18.0 * T * v_l)


def test_unstated_or_false_keeps_the_whole_logits_loss() -> None:
    """chunked_loss None / False: the recipe's unchunked loss (torchtitan before its model
    configs picked ChunkedLossWrapper), as before."""
    base = _plan(tp=4, sp=True)
    whole = recipe_head_bytes(base, TT)
    assert recipe_head_bytes(dataclasses.replace(base, chunked_loss=False), TT) == whole
    chunked = recipe_head_bytes(dataclasses.replace(base, chunked_loss=True), TT)
    assert chunked[0] < whole[0] and chunked[1] < whole[1]


def test_recipes_without_a_chunked_loss_ignore_the_flag() -> None:
    """A recipe with no chunked loss of its own (Recipe.chunked_loss_tokens 0) plans the same
    whatever the row states."""
    for name in ("automodel", "megatron", "nanotron"):
        r = RECIPES[name]
        assert r.chunked_loss_tokens == 0
        base = dataclasses.replace(_plan(), recipe=name)
        assert recipe_head_bytes(dataclasses.replace(base, chunked_loss=True), r) == (
            recipe_head_bytes(base, r)
        )


def test_rank_peak_drops_by_the_logits_terms() -> None:
    """Through recipe_rank_memory: the stated chunked loss lowers the last stage's peak, and
    its loss temporaries are what `loss_backward_temp` reports."""
    base = _plan(seq=8192, micro=8, tp=4, sp=True)
    whole = recipe_rank_memory(base, TT, 0)
    plan = dataclasses.replace(base, chunked_loss=True)
    chunked = recipe_rank_memory(plan, TT, 0)
    assert chunked.total < whole.total
    assert chunked.buffer_terms["loss_backward_temp"] == pytest.approx(
        recipe_head_bytes(plan, TT)[1]
    )
