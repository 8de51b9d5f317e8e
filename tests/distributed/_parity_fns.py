"""Rank functions of the parity matrix (module-level: `spawn` pickles them).

Every mode trains one preset for `STEPS` AdamW steps (gradient clipping on) on its share of the
same fixed global batches and returns, per step, the global mean loss and the pre-clip gradient
norm, plus the final full values of the parameters this rank holds. `reference` is the same
training on one process: the numbers every mode must reproduce.

A mode is (preset, layout, micro-batches): the micro-batches are gradient accumulation, or the
pipeline's micro-batches when pp > 1. A mode's opts may name another `OPTIMIZERS` entry (the
reference then takes the same one).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from scaletrain.config import MODEL_PRESETS, Layout, MemoryConfig, PrecisionConfig
from scaletrain.models import build_model, causal_lm_loss, clean_fqn, materialize, moe_aux_loss
from scaletrain.parallel import (
    ParallelDims,
    clip_grad_norm_,
    local_state_bytes,
    loss_context,
    maybe_no_sync,
    parallelize,
    sync_gradients,
    update_router_biases,
    wrap_optimizer,
)
from scaletrain.parallel.context_parallel import cp_positions, cp_shard
from scaletrain.parallel.pipeline import build_pipeline
from scaletrain.trainer.adafactor import Adafactor

from ..adam_tolerance import FLOAT64_RTOL, assert_float64_close, float64_default

STEPS, LR, MAX_NORM = 5, 1e-3, 0.5
OPTIMIZERS = {
    "adamw": (torch.optim.AdamW, {"lr": LR}),
    # the trainer's Adafactor with its first moment; lr caps a step relative to each
    # parameter's RMS (so 50x AdamW's), weight decay on, to move every term of the update
    "adafactor": (Adafactor, {"lr": 0.05, "beta1": 0.9, "weight_decay": 0.1}),
}
"""The optimizers a mode may name (`opts['optimizer']`, default AdamW): class and arguments."""
GLOBAL_BATCH, SEQ_LEN = 4, 16
# The presets, plus tiny-llama with 4 layers: 2 pipeline ranks x 2 virtual stages need >= 4.
CONFIGS = {
    **{p: MODEL_PRESETS[p]() for p in ("tiny", "tiny-llama", "tiny-moe")},
    "tiny-llama-4l": dataclasses.replace(MODEL_PRESETS["tiny-llama"](), num_layers=4),
    # q/k/v from one matmul (model.fused_qkv); tensor parallelism keeps three sharded Linears
    "tiny-llama-fused": dataclasses.replace(MODEL_PRESETS["tiny-llama"](), fused_qkv=True),
    # Qwen2's q/k/v biases (split with their column-wise Linears under tp); Qwen3's per-head
    # q/k norms (replicated weights, gradients summed over tp) with a 32-wide head: q is 128
    # wide on the 64-wide residual stream
    "tiny-qwen2": dataclasses.replace(MODEL_PRESETS["tiny-llama"](), qkv_bias=True),
    "tiny-qwen3": dataclasses.replace(
        MODEL_PRESETS["tiny-llama"](), qk_norm=True, head_dim_override=32
    ),
    # DeepSeek-V3's pieces: MLA (q and kv latents, decoupled RoPE, values narrower than q/k),
    # a dense first block, sigmoid group-limited routing with shared experts and the
    # auxiliary-loss-free bias, updated after every step (a bias rate large enough to move
    # the routing within the 5 steps)
    "tiny-deepseek": dataclasses.replace(MODEL_PRESETS["tiny-deepseek"](), router_bias_rate=0.05),
    # under context parallelism the sequence-wise balance loss sees each rank's shard of a
    # sequence, not the sequence (models/deepseek_moe.py): off for the cp row
    "tiny-deepseek-noaux": dataclasses.replace(
        MODEL_PRESETS["tiny-deepseek"](), router_bias_rate=0.05, moe_aux_loss_coef=0.0
    ),
    # Qwen3-MoE's pieces: q/k norms, 8 experts, top 3, weights not renormalized
    "tiny-qwen3-moe": dataclasses.replace(
        MODEL_PRESETS["tiny-moe"](),
        qk_norm=True,
        head_dim_override=32,
        num_experts=8,
        experts_per_token=3,
        moe_norm_topk=False,
    ),
    # Gemma 2's: GeGLU, scaled embeddings, (1 + w) norms before and after each sub-layer,
    # soft-capped scores (naive core) and logits, q.k / sqrt(24), a window of 8 < 16 tokens on
    # the first layer and full attention on the second, a tied head
    "tiny-gemma2": dataclasses.replace(
        MODEL_PRESETS["tiny-llama"](),
        activation="geglu",
        attention="naive",
        attn_scale_dim=24,
        attn_softcap=20.0,
        logit_softcap=15.0,
        sliding_window=8,
        full_attention_every=2,
        norm_plus_one=True,
        post_norms=True,
        scale_embeddings=True,
        tie_embeddings=True,
    ),
    # Gemma 3's additions: (1 + w) q/k norms and the local layer's own RoPE base; no caps
    "tiny-gemma3": dataclasses.replace(
        MODEL_PRESETS["tiny-llama"](),
        activation="geglu",
        attn_scale_dim=24,
        sliding_window=8,
        full_attention_every=2,
        rope_local_theta=100.0,
        qk_norm=True,
        norm_plus_one=True,
        post_norms=True,
        scale_embeddings=True,
        tie_embeddings=True,
    ),
}


def batch(preset: str, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: tokens and shifted targets, (GLOBAL_BATCH, SEQ_LEN) each."""
    vocab = CONFIGS[preset].vocab_size
    g = torch.Generator().manual_seed(1000 + step)
    seq = torch.randint(0, vocab, (GLOBAL_BATCH, SEQ_LEN + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def one_process_loss_grads(preset: str) -> tuple[float, dict[str, torch.Tensor]]:
    """The single-process logits path (`causal_lm_loss(model(x), y)`) on batch 0, at one
    intra-op thread: the reference loss and every parameter's gradient by clean name."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_model(CONFIGS[preset], device="cpu", seed=0)
        x, y = batch(preset, 0)
        loss = causal_lm_loss(model(x), y)
        loss.backward()
        return float(loss.detach()), {clean_fqn(n): p.grad for n, p in model.named_parameters()}
    finally:
        torch.set_num_threads(threads)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def assert_matches_reference(got: dict, ref: dict, where: str) -> set[str]:
    """One rank's float64 run against the float64 single-process reference: every step's loss
    and pre-clip gradient norm within FLOAT64_RTOL relative, every parameter it holds within
    FLOAT64_PARAM_ATOL (tests/adam_tolerance.py derives both). A tied model's last pipeline
    stage holds a copy of the embedding as its head, checked against the embedding.
    Returns the reference names covered, so that a test can check its ranks cover the model."""
    for key in ("losses", "norms"):
        torch.testing.assert_close(
            torch.tensor(got[key], dtype=torch.float64),
            torch.tensor(ref[key], dtype=torch.float64),
            rtol=FLOAT64_RTOL,
            atol=0,
            msg=lambda m, key=key: f"{where} {key}: {m}",
        )
    covered = set()
    for name, value in got["params"].items():
        ref_name = (
            "tok_embeddings.weight"
            if name == "output.weight" and name not in ref["params"]
            else name
        )
        assert_float64_close(value, ref["params"][ref_name], where=f"{where} {name}")
        covered.add(ref_name)
    return covered


def reference(preset: str, shards: int = 1, optimizer: str = "adamw") -> dict:
    """One process, the whole global batch per step, plain AdamW (or `optimizer`: `OPTIMIZERS`).

    shards: the batch is cut into this many equal parts whose losses are averaged. The MoE
    load-balancing loss is a function of the tokens one forward sees, so an MoE reference must
    see the data-parallel ranks' shards separately; for dense models the mean of equal shards'
    mean losses is the full-batch mean loss (1 shard).

    float64 (tests/adam_tolerance.py: why), on one thread like every spawned rank.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with float64_default():
            return _reference(preset, shards, optimizer)
    finally:
        torch.set_num_threads(threads)


def _reference(preset: str, shards: int, optimizer: str) -> dict:
    model = build_model(CONFIGS[preset], device="cpu", seed=0)
    cls, kw = OPTIMIZERS[optimizer]
    opt = cls(model.parameters(), **kw)
    losses, norms = [], []
    for step in range(STEPS):
        x, y = batch(preset, step)
        total = 0.0
        for xs, ys in zip(x.chunk(shards), y.chunk(shards), strict=True):
            loss = causal_lm_loss(model(xs), ys)
            ((loss + moe_aux_loss(model)) / shards).backward()
            total += float(loss.detach()) / shards
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        opt.step()
        update_router_biases([model], None)  # DeepSeek's balancing bias (else a no-op)
        opt.zero_grad()
        losses.append(total)
    params = {clean_fqn(n): p.detach().clone() for n, p in model.named_parameters()}
    params |= _router_biases([model])
    return {"losses": losses, "norms": norms, "params": params}


def _router_biases(modules) -> dict[str, torch.Tensor]:
    """The DeepSeek routers' balancing biases (fp32 buffers, moved by `update_router_biases`),
    held to the same bound as the parameters (as float64: the comparison's dtype)."""
    return {
        clean_fqn(n): b.detach().to(torch.float64)
        for m in modules
        for n, b in m.named_buffers()
        if n.endswith("moe.expert_bias")
    }


def _block_param_bytes(model) -> int:
    return sum(_local_bytes(p) for p in model.layers.parameters())


def _local_bytes(p: torch.Tensor) -> int:
    """Bytes of this rank's storage of `p` (its shard for a DTensor)."""
    local = p.to_local() if isinstance(p, DTensor) else p
    return local.numel() * local.element_size()


def _dense_step(
    model, dims: ParallelDims, x, y, accum: int, mem: dict, loss_parallel: bool
) -> torch.Tensor:
    """Forward + backward of this rank's batch in `accum` micro-batches; its mean loss."""
    positions = None
    if dims.cp > 1:  # this rank's load-balanced sequence chunks and their global positions
        x, y = cp_shard(x, dims.cp_rank, dims.cp), cp_shard(y, dims.cp_rank, dims.cp)
        positions = cp_positions(SEQ_LEN, dims.cp_rank, dims.cp)
    total = torch.zeros(())
    for i, (xm, ym) in enumerate(zip(x.chunk(accum), y.chunk(accum), strict=True)):
        with maybe_no_sync(model, i == accum - 1):
            logits = model(xm, positions)
            mem["block_params_after_forward"] = _block_param_bytes(model)
            mem["logits_type"] = type(logits).__name__
            with loss_context(dims.submesh("tp"), enabled=loss_parallel):
                loss = causal_lm_loss(logits, ym)
                ((loss + moe_aux_loss(model)) / accum).backward()
        total += _full(loss).detach() / accum
    sync_gradients(model)  # expert-parallel models' data parallelism (else a no-op)
    return total


def _build(preset: str, dims: ParallelDims, micro: int, opts: dict):
    """(modules holding this rank's parameters, pipeline runtime or None)."""
    kw = dict(
        precision=PrecisionConfig(dtype=opts.get("dtype", "fp32")),
        memory=MemoryConfig(ac=opts.get("ac", "none"), offload=opts.get("offload", "none")),
    )
    model = build_model(CONFIGS[preset])  # meta
    if dims.pp == 1:
        parallelize(model, dims, loss_parallel=opts.get("loss_parallel", True), **kw)
        materialize(model, device="cpu", seed=0)
        return [model], None

    def stage(mod):  # every stage is parallelized like a whole model, then materialized
        parallelize(mod, dims, loss_parallel=False, **kw)
        materialize(mod, device="cpu", seed=0)
        return mod

    runtime = build_pipeline(
        model,
        pp_group=dims.submesh("pp"),
        pp_rank=dims.pp_rank,
        pp_size=dims.pp,
        schedule=dims.layout.pp_schedule,
        virtual=dims.layout.pp_virtual,
        n_microbatches=micro,
        loss_fn=causal_lm_loss,
        device="cpu",
        parallelize_stage=stage,
        cp_group=dims.submesh("cp"),
    )
    return runtime.stages, runtime


def _train(preset: str, layout: dict, micro: int, opts: dict | None = None) -> dict:
    """opts: precision `dtype`, memory `ac` / `offload`, `loss_parallel` (default on),
    `optimizer` (an `OPTIMIZERS` name; default adamw).

    Precision fp32 (the default) runs in float64, like `reference`; a 16-bit `dtype` runs its
    mixed precision over fp32 master weights, as the trainer does."""
    opts = opts or {}
    if opts.get("dtype", "fp32") == "fp32":
        with float64_default():
            return _train_at_default_dtype(preset, layout, micro, opts)
    return _train_at_default_dtype(preset, layout, micro, opts)


def _train_at_default_dtype(preset: str, layout: dict, micro: int, opts: dict) -> dict:
    dims = ParallelDims.from_layout(
        Layout(**layout), dist.get_world_size(), CONFIGS[preset], seq_len=SEQ_LEN
    )
    dims.build_mesh("cpu")
    modules, pipeline = _build(preset, dims, micro, opts)
    params = [p for m in modules for p in m.parameters()]
    cls, kw = OPTIMIZERS[opts.get("optimizer", "adamw")]
    opt = wrap_optimizer(cls, params, dims, **kw)
    dp_cp = dims.submesh("dp_cp")
    losses, norms, mem = [], [], {}
    for step in range(STEPS):
        x, y = batch(preset, step)
        x, y = x.chunk(dims.dp_size)[dims.dp_rank], y.chunk(dims.dp_size)[dims.dp_rank]
        if pipeline is not None:  # mean over micro-batches, on every pp rank
            loss = pipeline.step(x, y)
            for m in modules:  # data parallelism over DTensor parameters (else a no-op)
                sync_gradients(m)
        else:
            loss = _dense_step(
                modules[0], dims, x, y, micro, mem, loss_parallel=opts.get("loss_parallel", True)
            )
        # every dp x cp rank saw an equal share of the tokens: the global mean is their mean
        dist.all_reduce(loss, group=dp_cp.get_group())
        losses.append(float(loss) / dp_cp.size())
        mem["grads"] = sum(local_state_bytes(m)["grads"] for m in modules)
        extra = pipeline.group if pipeline is not None else None
        exclude = pipeline.norm_exclude if pipeline is not None else ()
        norms.append(
            float(clip_grad_norm_(params, MAX_NORM, extra_group=extra, norm_exclude=exclude))
        )
        opt.step()
        update_router_biases(modules, dp_cp.get_group())  # the step's global expert loads
        opt.zero_grad()
    mem["params_at_rest"] = sum(local_state_bytes(m)["params"] for m in modules)
    mem["optimizer"] = local_state_bytes(modules[0], opt)["optimizer"]
    experts = [p for m in modules for n, p in m.named_parameters() if ".moe.experts." in n]
    mem["expert_params"] = sum(_local_bytes(p) for p in experts)
    local_opt = getattr(opt, "optim", opt)  # ZeRO-1's own partition
    mem["expert_optimizer"] = sum(
        _local_bytes(v)
        for p in experts
        for v in local_opt.state.get(p, {}).values()
        if torch.is_tensor(v) and v.dim() > 0
    )
    held = {
        clean_fqn(n): _full(p).detach().clone() for m in modules for n, p in m.named_parameters()
    }
    held |= _router_biases(modules)
    meshes = {
        n: (dims.submesh(n).size(), dims.submesh(n).get_local_rank())
        for n in ("pp", "dp", "dp_shard_cp", "dp_cp", "cp", "tp", "ep")
    }
    dtypes = sorted({str(p.dtype) for p in held.values()})
    return {
        "losses": losses,
        "norms": norms,
        "params": held,
        "mem": mem,
        "meshes": meshes,
        "param_dtypes": dtypes,
        "logits_type": mem.pop("logits_type", None),
    }


def train_modes(modes: dict[str, tuple]) -> dict:
    """Run each mode name -> (preset, layout, micro-batches[, opts]) in turn; results keyed by
    name."""
    return {name: _train(*spec) for name, spec in modes.items()}


def world4_suite(modes: dict[str, tuple]) -> dict:
    """`train_modes(modes)` plus the ranks of this rank's expert-parallel group for dp 4, ep 2."""
    out = train_modes(modes)
    dims = ParallelDims.from_layout(
        Layout(dp=4, zero=3, ep=2), dist.get_world_size(), CONFIGS["tiny-moe"]
    )
    dims.build_mesh("cpu")
    out["ep_group"] = dist.get_process_group_ranks(dims.submesh("ep").get_group())
    out["ep_replicate_group"] = dist.get_process_group_ranks(
        dims.submesh("ep_replicate").get_group()
    )
    return out
