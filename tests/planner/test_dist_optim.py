"""The optimizer a NeMo run states (planner/recipes/dist_optim.py): Apex DistributedFusedAdam's
gradient buffer in grad_sync_dtype, its master remainders / stored master / no master, its
optimizer-dtype Adam states, its gradient shard at the step and fp32 embedding gradients;
Megatron-Core's bf16 gradient buffer with the step's fp32 shard copy; the fields' errors, the
corpus rows that state them, and the plans that state nothing left unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.config import ConfigError, Layout
from scaletrain.planner.estimate import estimate
from scaletrain.planner.recipes.dist_optim import plan_recipe, stated_optimizer
from scaletrain.planner.recipes.memory import recipe_rank_memory, recipe_worst_rank
from scaletrain.planner.recipes.published import load_runs, parse_runs, plan_input, recipe_of
from scaletrain.planner.recipes.registry import RECIPES
from scaletrain.planner.types import PlanInput

from .test_recipes import SMALL, _params, _plan

APEX = "apex_distributed_fused_adam"


def _nemo(dp: int = 4, **kw: object) -> PlanInput:
    plan = _plan("nemo", Layout(dp=dp, zero=1), gb=dp)
    return dataclasses.replace(plan, **kw)  # type: ignore[arg-type]


def _emb() -> int:
    """SMALL's word + position embedding (the first stage's fp32-gradient buckets)."""
    pc = SMALL.param_counts()
    return pc.embedding + pc.position


def test_unstated_is_the_recipe_itself() -> None:
    plan = _nemo()
    assert stated_optimizer(plan, RECIPES["nemo"]) is RECIPES["nemo"]
    assert plan_recipe(dataclasses.replace(plan, recipe="scaletrain")) is None


@pytest.mark.parametrize(
    ("precision", "optim_dtype", "fp8_params", "grad", "master", "states"),
    [
        # bf16 weights, fp32 optimizer: store_param_remainders (int16), grads in grad_sync bf16
        ("bf16", "unstated", None, 2.0, 2.0, 4.0),
        # fp8 (fp8_params assumed): store_params, an fp32 master shard
        ("fp8", "unstated", None, 2.0, 4.0, 4.0),
        # a bf16 run whose YAML keeps fp8_params on: the fp32 master shard stored too
        ("bf16", "unstated", True, 2.0, 4.0, 4.0),
        # optim.dtype bf16 = the model's: no master shard, bf16 Adam states
        ("bf16", "bf16", None, 2.0, 0.0, 2.0),
        # ... with fp8_params: a master shard in the optimizer dtype
        ("fp8", "bf16", None, 2.0, 2.0, 2.0),
    ],
)
def test_apex_bytes_per_param(
    precision: str,
    optim_dtype: str,
    fp8_params: bool | None,
    grad: float,
    master: float,
    states: float,
) -> None:
    plan = _nemo(
        precision=precision,
        dist_optimizer=APEX,
        grad_sync_dtype="bf16",
        optimizer_dtype=optim_dtype,
        fp8_params=fp8_params,
    )
    r = stated_optimizer(plan, RECIPES["nemo"])
    assert (r.grad_bytes, r.master_bytes, r.optimizer_state_bytes) == (grad, master, states)
    assert r.bucket_elem_bytes == grad and r.grad_shard_step_bytes == grad
    assert r.grad_buffer_full_under_zero1 and r.shards_master and r.fp32_embedding_grads
    assert r.name == "nemo"  # every name-keyed rule (overlap, defaults) still applies


def test_apex_grad_sync_dtype_defaults_to_the_optimizer_dtype() -> None:
    """Apex DistributedFusedAdam.__init__: grad_sync_dtype None -> dtype (fp32 by NeMo's
    default)."""
    r = stated_optimizer(_nemo(dist_optimizer=APEX), RECIPES["nemo"])
    assert r.grad_bytes == 4.0 and r.master_bytes == 2.0


def test_apex_rank_memory_by_hand() -> None:
    """Apex over 4 ranks, bf16 grad sync: bf16 weights 2 + bf16 grad buffer 2 (the embedding's
    fp32: +2 on it) + (int16 remainders 2 + Adam 8) / 4; the step holds the bf16 grad shard
    2 / 4 beside the states; Megatron-Core's own terms: 2 + 4 + 12 / 4."""
    P, E = _params(SMALL), _emb()
    plan = _nemo(dist_optimizer=APEX, grad_sync_dtype="bf16")
    r = stated_optimizer(plan, RECIPES["nemo"])
    mem = recipe_rank_memory(plan, r, 0)
    assert mem.params == 2 * P
    assert mem.grads == pytest.approx(2 * P + 2 * E)
    assert mem.detail["grads.fp32_embedding"] == pytest.approx(2 * E)
    assert mem.optimizer == pytest.approx((2 + 8) * P / 4)
    assert mem.detail["optimizer_step.temp"] == pytest.approx(2 * P / 4)
    base = recipe_rank_memory(_nemo(), RECIPES["nemo"], 0)
    assert base.grads == 4 * P and base.optimizer == 12 * P / 4
    assert base.detail["optimizer_step.temp"] == 0.0
    # recipe_worst_rank applies the plan's optimizer itself
    worst, _ = recipe_worst_rank(plan)
    assert worst.grads == pytest.approx(mem.grads)


def test_mcore_bf16_grad_buffer_and_step_copy() -> None:
    """grad_reduce_in_fp32 False: a bf16 buffer (2 B), and DistributedOptimizer.
    _copy_model_grads_to_main_grads's .float() of the rank's shard at the step (4 / N)."""
    P = _params(SMALL)
    for name in ("megatron", "nemo"):
        plan = dataclasses.replace(_nemo(), recipe=name, grad_sync_dtype="bf16")
        r = stated_optimizer(plan, RECIPES[name])
        mem = recipe_rank_memory(plan, r, 0)
        assert mem.grads == 2 * P
        assert mem.optimizer == 12 * P / 4
        assert mem.detail["optimizer_step.temp"] == pytest.approx(4 * P / 4)
        assert r.bucket_elem_bytes == 2.0


def test_bf16_grad_sync_halves_the_dp_reduce_scatter_bytes() -> None:
    plan = _nemo(dp=8)
    t32 = estimate(plan).time.comm_total_s
    t16 = estimate(dataclasses.replace(plan, grad_sync_dtype="bf16")).time.comm_total_s
    assert t16 < t32


def test_fp32_plans_keep_fp32_states() -> None:
    plan = _nemo(precision="fp32", dist_optimizer=APEX, grad_sync_dtype="bf16")
    assert stated_optimizer(plan, RECIPES["nemo"]) is RECIPES["nemo"]


@pytest.mark.parametrize(
    ("recipe", "kw", "field"),
    [
        ("megatron", {"dist_optimizer": APEX}, "dist_optimizer"),
        ("torchtitan", {"grad_sync_dtype": "bf16"}, "dist_optimizer"),
        ("nemo", {"dist_optimizer": "apex"}, "dist_optimizer"),
        ("nemo", {"grad_sync_dtype": "fp16"}, "grad_sync_dtype"),
        ("nemo", {"optimizer_dtype": "bf16"}, "optimizer_dtype"),
        ("nemo", {"fp8_params": True}, "fp8_params"),
    ],
)
def test_errors(recipe: str, kw: dict[str, object], field: str) -> None:
    plan = dataclasses.replace(_nemo(), recipe=recipe, **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as e:
        stated_optimizer(plan, RECIPES[recipe])
    assert e.value.field == field


def test_apex_needs_zero1() -> None:
    plan = dataclasses.replace(
        _plan("nemo", Layout(dp=4, zero=0), gb=4), dist_optimizer=APEX, grad_sync_dtype="bf16"
    )
    with pytest.raises(ConfigError) as e:
        stated_optimizer(plan, RECIPES["nemo"])
    assert e.value.field == "parallel.zero"


def _row(layout_extra: dict[str, object]) -> dict[str, object]:
    return {
        "runs": [
            {
                "name": "x",
                "framework": "nemo",
                "source": "https://example.org table",
                "gpu": "h100-sxm",
                "num_gpus": 8,
                "seq_len": 2048,
                "model": {"preset": "llama3-8b"},
                "layout": {"dp": 8, "zero": 1, "micro_batch": 1, "global_batch": 8} | layout_extra,
                "measured": {"step_s": 1.0},
            }
        ]
    }


def test_row_fields_reach_the_plan() -> None:
    (run,) = parse_runs(
        _row({"dist_optimizer": APEX, "grad_sync_dtype": "bf16", "fp8_params": True})
    )
    plan = plan_input(run, "nemo")
    assert (plan.dist_optimizer, plan.grad_sync_dtype, plan.fp8_params) == (APEX, "bf16", True)
    own = plan_input(run, "scaletrain")
    assert (own.dist_optimizer, own.grad_sync_dtype, own.fp8_params) == ("unstated",) * 2 + (None,)


def test_row_with_an_unknown_optimizer_is_refused() -> None:
    with pytest.raises(ConfigError):
        parse_runs(_row({"dist_optimizer": "fused_adam"}))


@pytest.mark.parametrize(
    "name",
    [
        "dgxc-h100-llama31-8b-8g-cp2-bf16",
        "dgxc-h100-llama31-405b-576g-tp8-pp9-cp2-vp7-bf16",
        "dgxc-h100-nemotron4-340b-128g-tp8-pp8-vp12-bf16",
        "dgxc-h100-nemotron4-340b-128g-tp8-pp8-vp12-fp8",
    ],
)
def test_dgxc_rows_state_apex_and_fit(name: str) -> None:
    """The DGX Cloud recipes' own YAMLs name distributed_fused_adam with grad_sync_dtype bf16;
    with it the runs that ran are planned as fitting (they were planned as OOM with
    Megatron-Core's fp32 buffer)."""
    (run,) = [r for r in load_runs() if r.name == name]
    assert run.layout.dist_optimizer == APEX and run.layout.grad_sync_dtype == "bf16"
    plan = plan_input(run, recipe_of(run))
    assert estimate(plan).memory.fits
    mcore = dataclasses.replace(
        plan, dist_optimizer="unstated", grad_sync_dtype="unstated", optimizer_dtype="unstated"
    )
    assert not estimate(mcore).memory.fits
