"""Model architecture config, its exact analytic parameter count, presets and HF loading.

One decoder config covers the GPT-2 family (LayerNorm, learned positions, GELU, biases, tied
embeddings), the Llama family (RMSNorm, RoPE, SwiGLU, grouped-query attention, untied head),
Mixtral-style MoE (`num_experts > 0`) and the Llama-like families that add a piece or two:
Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm, an explicit head width), Phi-3 (fused
checkpoint tensors only). Pure Python: the planner imports this without torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from ._errors import ConfigError, require
from .choices import (
    Activation,
    Attention,
    HFModelType,
    MoEDropPolicy,
    Norm,
    Position,
    RouterScoring,
    check_choices,
)
from .deepseek import mla_attention_params, mla_replicated_params, validate_deepseek
from .hub import hub_snapshot, is_hub_id

__all__ = [
    "ModelConfig",
    "ParamCounts",
    "MODEL_PRESETS",
    "model_preset",
    "resolve_model",
    "expert_capacity",
]


@dataclass
class ModelConfig:
    """Architecture of a decoder-only transformer."""

    name: str = "custom"
    """Display name (a preset name, a config.json path, a hub id, or 'custom')."""
    vocab_size: int = 256
    """Number of token ids the embedding and head cover."""
    dim: int = 128
    """Hidden size h (residual stream width)."""
    num_layers: int = 4
    """Number of transformer blocks L."""
    num_heads: int = 4
    """Query heads a."""
    num_kv_heads: int = 0
    """Key/value heads g for grouped-query attention; 0 means equal to num_heads (plain MHA)."""
    ffn_dim: int = 0
    """MLP inner size f; 0 means 4*dim for GELU, Llama's rounded 8/3*dim for SwiGLU."""
    max_seq_len: int = 256
    """Longest sequence; sizes the learned position table (RoPE has no table)."""
    norm: Norm = "layernorm"
    """'layernorm' (GPT-2, weight + bias when `bias`) or 'rmsnorm' (Llama, weight only)."""
    activation: Activation = "gelu"
    """'gelu' (two matrices; the tanh approximation, GPT-2's and HF's `gelu_new`), 'gelu_exact'
    (two matrices; the erf form: torch's `nn.GELU()`, nanoGPT's, HF's `gelu`; about half the
    CPU time of the tanh form), 'swiglu' (three matrices: gate, up, down) or 'geglu' (three
    matrices, the gate through tanh-GELU instead of SiLU: Gemma's `gelu_pytorch_tanh`)."""
    position: Position = "learned"
    """'learned' absolute position embeddings (GPT-2) or 'rope' rotary embeddings (Llama)."""
    rope_theta: float = 10000.0
    """RoPE base frequency (Llama 2: 1e4, Llama 3: 5e5, Mixtral: 1e6)."""
    tie_embeddings: bool = True
    """Share the token embedding with the output head (GPT-2) or not (Llama)."""
    bias: bool = True
    """Biases in the attention/MLP linears (and LayerNorm); False for Llama."""
    norm_eps: float = 1e-5
    """Epsilon of the normalization layers."""
    num_experts: int = 0
    """Experts per MoE layer; 0 makes every MLP dense."""
    experts_per_token: int = 2
    """Top-k experts each token is routed to (MoE only)."""
    moe_aux_loss_coef: float = 0.01
    """Weight of the Switch/Mixtral load-balancing loss (MoE only)."""
    moe_norm_topk: bool = True
    """MoE routing weights: True renormalizes the k chosen experts' softmax probabilities to
    sum to one (Mixtral; Qwen3-MoE's `norm_topk_prob = true`); False keeps their probabilities
    under the softmax over all experts (`norm_topk_prob = false`). 'topk_softmax' routing
    only: DeepSeek's 'softmax'/'sigmoid' routing has `router_norm_topk` instead."""
    moe_capacity_factor: float = 0.0
    """MoE token dropping (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2022
    sec. 2.2; Megatron-Core's `moe_expert_capacity_factor`). 0, the default, drops nothing.
    c > 0 lets each expert take at most C = ceil(c * N * k / E) of the N*k (token, expert)
    assignments of the N tokens one MoE forward routes on one rank (`expert_capacity`; the
    group is a rank's micro-batch, b x s / cp tokens); the rest are dropped by
    `moe_drop_policy`: they add nothing to the layer's output (the token keeps its residual and
    its other experts), the kept assignments keep their weights (not renormalized). Hugging
    Face's Mixtral, Qwen3-MoE and DeepSeek configs have no capacity (they train dropless): an
    import leaves 0, an export writes none (the weights run dropless there)."""
    moe_drop_policy: MoEDropPolicy = "probs"
    """Which assignments an over-capacity expert drops: 'probs' its lowest routing weights,
    'position' its latest tokens (sequence position first, then the sequence's index in the
    micro-batch, as Megatron-Core's (s, b) token order). Ties keep the earlier position."""
    moe_pad_to_capacity: bool = False
    """With a capacity: every expert runs exactly C rows (padding rows after its kept ones,
    which add nothing), so every shape is static: the expert-parallel all-to-all splits need no
    count exchange and no host sync (Megatron-Core's `moe_pad_expert_input_to_capacity`), and
    the dry-run measures a real step's memory exactly. Costs the padding rows' compute."""
    attention: Attention = "sdpa"
    """Attention backend: 'sdpa' (flash / memory-efficient kernels) or 'naive' (S x S scores)."""
    init_std: float = 0.02
    """Standard deviation of the normal init of linear and embedding weights."""
    sliding_window: int = 0
    """0: full causal attention. W > 0 (Mistral's `sliding_window`): each query attends to
    the W most recent positions, itself included; a no-op while seq_len <= W."""
    fused_qkv: bool = False
    """Compute q, k and v with one matmul against the concatenated wq/wk/wv (nanoGPT's
    `c_attn`); the parameters, checkpoints and exports stay three. A speed option: fewer,
    larger matmuls (the nanoGPT CPU recipe turns it on); tensor parallelism and fp8 keep the
    three Linears (`models.attention.Attention`)."""
    qkv_bias: bool = False
    """Biases on wq, wk and wv only, the other linears without (Qwen2); `bias` puts them on
    every linear."""
    qk_norm: bool = False
    """RMSNorm of each query and key head over its head_dim, before RoPE (Qwen3's `q_norm` /
    `k_norm`: one (head_dim,) weight each, shared by the heads)."""
    head_dim_override: int = 0
    """Width of one attention head; 0 means dim / num_heads. Qwen3 sets it (128 at every
    size, so num_heads * head_dim may differ from dim: wq is (num_heads * head_dim, dim))."""
    attn_scale_dim: int = 0
    """Attention scores are q.k / sqrt(attn_scale_dim); 0 means head_dim (Gemma 2's
    `query_pre_attn_scalar`: 144 on the 27B, whose heads are 128 wide)."""
    attn_softcap: float = 0.0
    """0: off. c > 0: attention scores soft-capped to c * tanh(score / c) before the softmax
    (Gemma 2's `attn_logit_softcapping`, 50). SDPA has no soft-capping: needs
    attention='naive', whose S x S scores it caps; context parallelism refuses it."""
    logit_softcap: float = 0.0
    """0: off. c > 0: output logits soft-capped to c * tanh(logit / c) (Gemma 2's
    `final_logit_softcapping`, 30), in the fused loss and in the logits path alike."""
    rope_local_theta: float = 0.0
    """RoPE base of the sliding-window layers when it differs from the global layers'
    `rope_theta` (Gemma 3: 10,000 beside 1,000,000; its `rope_local_base_freq`); 0: one base
    for every layer."""
    full_attention_every: int = 0
    """With a sliding window: 0 slides every layer; N > 0 gives block i full causal attention
    when (i + 1) % N == 0 and the window otherwise (Gemma 2: 2, local and global alternating
    from a local first layer; Gemma 3: 6)."""
    norm_plus_one: bool = False
    """RMSNorm weights stored as offsets from one: y = (1 + w) * x / rms(x), w starting at 0
    (Gemma's norms, the final one included)."""
    post_norms: bool = False
    """Norms on the attention and MLP outputs too, before each residual add (Gemma 2's
    sandwich: `post_attention_layernorm`, `post_feedforward_layernorm`)."""
    scale_embeddings: bool = False
    """Token embeddings multiplied by sqrt(dim), rounded to the embedding's dtype as Gemma
    does (a tied head reads the unscaled table)."""
    hf_model_type: HFModelType = "auto"
    """The Hugging Face `model_type` a checkpoint export writes (and whose tensor layout an
    import reads): 'auto' picks it from the architecture (gpt2, llama, mistral with a sliding
    window, mixtral with experts, qwen2 with `qkv_bias`, qwen3 with `qk_norm`, qwen3_moe with
    experts and `qk_norm`, gemma2 with `post_norms`, gemma3_text with both); set by a
    config.json import to its own type, so an export reloads as the family it came from."""

    # ---- DeepSeek-V2 / V3 (config/deepseek.py holds their rules); all off by default ------
    kv_lora_rank: int = 0
    """> 0: Multi-head Latent Attention (DeepSeek-V2 sec. 2.1): keys and values come from a
    compressed latent of this width, c_kv = kv_norm(wkv_a x), expanded to every head by wkv_b;
    0: ordinary (grouped-query) attention."""
    q_lora_rank: int = 0
    """MLA: queries through a low-rank latent of this width, wq_b(q_norm(wq_a x)); 0: one full
    projection wq (DeepSeek-V2-Lite)."""
    qk_nope_head_dim: int = 0
    """MLA: per-head query/key width without position (from the latent)."""
    qk_rope_head_dim: int = 0
    """MLA: per-head query width carrying RoPE; the key's RoPE part (wk_rope x, this wide) is
    one for all heads (the decoupled RoPE of DeepSeek-V2 sec. 2.1.3)."""
    v_head_dim: int = 0
    """MLA: per-head value width."""
    num_dense_layers: int = 0
    """MoE models: the first N blocks keep a dense MLP of width `dense_ffn_dim` (DeepSeek's
    `first_k_dense_replace`)."""
    dense_ffn_dim: int = 0
    """Width of those dense MLPs; 0 means ffn_dim (which is then the experts' width)."""
    num_shared_experts: int = 0
    """MoE: experts every token goes through besides its routed ones (DeepSeekMoE), together
    one SwiGLU MLP of width num_shared_experts * ffn_dim."""
    router_scoring: RouterScoring = "topk_softmax"
    """MoE routing: 'topk_softmax' (Mixtral: softmax over the k best logits), 'softmax'
    (DeepSeek-V2: softmax over all experts, the k best taken as they are) or 'sigmoid'
    (DeepSeek-V3: sigmoid affinities, chosen with `router_bias_rate`'s bias)."""
    router_groups: int = 1
    """'softmax'/'sigmoid' routing: experts split into this many groups, of which a token may
    use only `router_topk_groups` (DeepSeek's n_group / topk_group; 1: no limit)."""
    router_topk_groups: int = 1
    """Groups a token's experts may come from (see `router_groups`)."""
    router_norm_topk: bool = False
    """'softmax'/'sigmoid': divide the k chosen scores by their sum (DeepSeek's norm_topk_prob)."""
    router_scale: float = 1.0
    """'softmax'/'sigmoid': factor on the routed experts' weights (routed_scaling_factor)."""
    router_bias_rate: float = 0.0
    """'sigmoid': update speed gamma of the auxiliary-loss-free balancing bias (Wang et al.
    2024, arXiv:2408.15664; DeepSeek-V3 sec. 2.1.2): after every optimizer step each MoE
    layer's per-expert bias b_i, added to the affinities for choosing the experts only, moves
    by gamma * sign(mean load - load_i) over the step's global batch. 0 freezes it."""

    def __post_init__(self) -> None:
        if self.num_kv_heads == 0:
            self.num_kv_heads = self.num_heads
        if self.ffn_dim == 0:
            self.ffn_dim = _llama_ffn(self.dim) if self.gated_mlp else 4 * self.dim
        self.validate()

    def validate(self) -> None:
        p = "model."
        for f in (
            "vocab_size",
            "dim",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "ffn_dim",
            "max_seq_len",
        ):
            v = getattr(self, f)
            require(isinstance(v, int) and v >= 1, p + f, v, "use a positive integer")
        check_choices(self, "model")  # norm, activation, position, attention, hf_model_type
        require(
            isinstance(self.head_dim_override, int) and self.head_dim_override >= 0,
            p + "head_dim_override",
            self.head_dim_override,
            "use 0 (dim / num_heads) or a head width >= 1",
        )
        require(
            self.head_dim_override > 0 or self.kv_lora_rank > 0 or self.dim % self.num_heads == 0,
            p + "num_heads",
            self.num_heads,
            f"num_heads must divide dim={self.dim} (or set model.head_dim_override)",
        )
        require(
            self.num_heads % self.num_kv_heads == 0,
            p + "num_kv_heads",
            self.num_kv_heads,
            f"num_kv_heads must divide num_heads={self.num_heads}",
        )
        if self.position == "rope" and not self.is_mla:
            require(
                self.head_dim % 2 == 0,
                p + "num_heads",
                self.num_heads,
                f"RoPE needs an even head dim; head_dim = {self.head_dim}",
            )
        require(self.num_experts >= 0, p + "num_experts", self.num_experts, "use 0 (dense) or more")
        if self.num_experts:
            require(
                1 <= self.experts_per_token <= self.num_experts,
                p + "experts_per_token",
                self.experts_per_token,
                f"use 1..num_experts={self.num_experts}",
            )
        self._validate_capacity()
        require(
            math.isfinite(self.init_std) and 0 < self.init_std <= 1,
            p + "init_std",
            self.init_std,
            "use a positive float up to 1 such as 0.02 (published models use 0.006-0.02; "
            "above 1 a deep stack's activations overflow)",
        )
        # A norm divides by sqrt(mean(x^2) + eps). The first block's input is the embedding,
        # of mean square init_std^2 (4e-4 at 0.02); an eps at or above that replaces the
        # activations' scale by its own: the output shrinks to ~x / sqrt(eps) and, at 1e30,
        # the loss never moves. Published models use 1e-5 or 1e-6.
        require(
            0 < self.norm_eps < self.init_std**2,
            p + "norm_eps",
            self.norm_eps,
            f"use a small positive float below init_std^2 = {self.init_std**2:.3g} (the "
            "embeddings' mean square), such as 1e-5",
        )
        require(
            math.isfinite(self.moe_aux_loss_coef) and self.moe_aux_loss_coef >= 0,
            p + "moe_aux_loss_coef",
            self.moe_aux_loss_coef,
            "use 0 (off) or a small positive weight such as 0.01 (a negative one rewards "
            "routing every token to one expert)",
        )
        require(
            isinstance(self.sliding_window, int) and self.sliding_window >= 0,
            p + "sliding_window",
            self.sliding_window,
            "use 0 (off) or a window W >= 1",
        )
        require(
            math.isfinite(self.rope_theta) and self.rope_theta > 0,
            p + "rope_theta",
            self.rope_theta,
            "use a finite positive float such as 10000.0",
        )
        validate_deepseek(self)
        self._validate_attention_extras()

    def _validate_capacity(self) -> None:
        """`moe_capacity_factor`, `moe_pad_to_capacity`: a factor >= 0 on an MoE model."""
        p, c = "model.", self.moe_capacity_factor
        require(
            isinstance(c, int | float) and math.isfinite(c) and c >= 0,
            p + "moe_capacity_factor",
            c,
            "use 0 (no token dropping) or a positive factor such as 1.25",
        )
        require(
            not c or self.is_moe,
            p + "moe_capacity_factor",
            c,
            "a dense model (num_experts=0) has no experts to cap: set it to 0",
        )
        require(
            not self.moe_pad_to_capacity or c > 0,
            p + "moe_pad_to_capacity",
            self.moe_pad_to_capacity,
            "padding needs a capacity: set model.moe_capacity_factor > 0 (e.g. 1.25), or false",
        )

    def _validate_attention_extras(self) -> None:
        """The Gemma-style pieces: score scale, soft-caps, the local/global layer pattern,
        the (1 + w) norm."""
        p = "model."
        require(
            isinstance(self.attn_scale_dim, int) and self.attn_scale_dim >= 0,
            p + "attn_scale_dim",
            self.attn_scale_dim,
            "use 0 (head_dim) or a positive width such as 256",
        )
        for name in ("attn_softcap", "logit_softcap"):
            v = getattr(self, name)
            require(
                isinstance(v, int | float) and math.isfinite(v) and v >= 0,
                p + name,
                v,
                "use 0 (off) or a positive cap such as 50.0",
            )
        require(
            not self.attn_softcap or self.attention == "naive",
            p + "attn_softcap",
            self.attn_softcap,
            "soft-capping needs the S x S scores: set model.attention='naive' (SDPA has none), "
            "or 0 to turn it off",
        )
        require(
            isinstance(self.full_attention_every, int) and self.full_attention_every >= 0,
            p + "full_attention_every",
            self.full_attention_every,
            "use 0 (every layer slides) or N >= 1 (every N-th layer attends globally)",
        )
        require(
            not self.full_attention_every or self.sliding_window > 0,
            p + "full_attention_every",
            self.full_attention_every,
            "needs a window: set model.sliding_window > 0 (or 0 here)",
        )
        require(
            isinstance(self.rope_local_theta, int | float)
            and math.isfinite(self.rope_local_theta)
            and self.rope_local_theta >= 0
            and (
                not self.rope_local_theta or (self.position == "rope" and self.sliding_window > 0)
            ),
            p + "rope_local_theta",
            self.rope_local_theta,
            "use 0 (rope_theta everywhere) or a positive base for the windowed layers of a "
            "RoPE model with model.sliding_window > 0",
        )
        require(
            not self.norm_plus_one or self.norm == "rmsnorm",
            p + "norm_plus_one",
            self.norm_plus_one,
            "a (1 + w) weight is an RMSNorm's: set model.norm='rmsnorm'",
        )

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.dim // self.num_heads

    @property
    def q_dim(self) -> int:
        """Width of Q (and of the attention output wo reads): a * d_head; dim unless
        `head_dim_override` says otherwise."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): g * d_head; equals dim without GQA."""
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Multi-head Latent Attention (`kv_lora_rank` > 0)."""
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Width of one query (and key) head: MLA's nope + rope parts, else head_dim."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def value_head_dim(self) -> int:
        """Width of one value head: MLA's v_head_dim, else head_dim."""
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def rope_dim(self) -> int:
        """Width RoPE rotates per head (its cos/sin tables): MLA's rope part, else head_dim."""
        return self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def num_moe_layers(self) -> int:
        """Blocks with an MoE layer: all but the first `num_dense_layers` (0 for dense)."""
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    def expert_rows_per_token(self, tokens: float) -> float:
        """The (token, expert) rows an MoE layer's experts run per routed token when one
        forward routes `tokens` tokens (the permuted buffers' rows over the tokens): k without
        a capacity (`experts_per_token` itself: a planner figure is then unchanged to the bit);
        with `moe_capacity_factor`, E*C / tokens padded (`moe_pad_to_capacity`: C rows per
        expert, kept or padding) and min(E*C, k*tokens) / tokens unpadded: the upper bound,
        which a balanced router reaches (every expert min(N*k/E, C), the dry-run's dispatch).
        C = `expert_capacity` of the tokens (rounded down to whole tokens)."""
        k = self.experts_per_token
        if not self.moe_capacity_factor or tokens <= 0:
            return k
        n = int(tokens)
        rows = self.num_experts * expert_capacity(n, k, self.num_experts, self.moe_capacity_factor)
        return (rows if self.moe_pad_to_capacity else min(rows, k * n)) / tokens

    def layer_is_moe(self, i: int) -> bool:
        """Whether block i has an MoE layer (DeepSeek: the first blocks stay dense)."""
        return self.is_moe and i >= self.num_dense_layers

    def dense_layer_view(self) -> ModelConfig:
        """This model as if every block were one of its dense first blocks (same attention, a
        dense MLP of `dense_ffn_dim`): what the planner's per-block formulas read for them."""
        return replace(
            self,
            num_experts=0,
            ffn_dim=self.dense_ffn_dim or self.ffn_dim,
            num_dense_layers=0,
            dense_ffn_dim=0,
            num_shared_experts=0,
            router_scoring="topk_softmax",
            router_groups=1,
            router_topk_groups=1,
            router_norm_topk=False,
            router_scale=1.0,
            router_bias_rate=0.0,
            moe_capacity_factor=0.0,
            moe_pad_to_capacity=False,
        )

    @property
    def gated_mlp(self) -> bool:
        """A three-matrix MLP (gate, up, down): SwiGLU or GeGLU."""
        return self.activation in ("swiglu", "geglu")

    @property
    def attn_scale(self) -> float:
        """The factor attention scores are multiplied by: 1 / sqrt(attn_scale_dim or
        head_dim)."""
        return 1.0 / math.sqrt(self.attn_scale_dim or self.head_dim)

    def layer_window(self, layer: int) -> int:
        """Block `layer`'s sliding window (0: full causal attention)."""
        every = self.full_attention_every
        return 0 if every and (layer + 1) % every == 0 else self.sliding_window

    @property
    def family(self) -> str:
        """'llama' when the block is RMSNorm+SwiGLU+RoPE style, else 'gpt2' (HF export names)."""
        return "llama" if self.norm == "rmsnorm" else "gpt2"

    def param_counts(self) -> ParamCounts:
        return ParamCounts.of(self)

    def num_params(self) -> int:
        return self.param_counts().total

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def expert_capacity(tokens: int, top_k: int, num_experts: int, factor: float) -> int:
    """Rows an expert may take when `tokens` tokens are routed to their `top_k` of
    `num_experts` experts with capacity factor `factor` (> 0): C = ceil(tokens * k / E * c)
    (GShard, Lepikhin et al. 2020 sec. 2.2; Switch Transformer, Fedus et al. 2022 eq. 3; the
    expression of Megatron-Core's moe_utils.get_capacity, floating-point order included, so a
    factor gives the same C there and here), at most `tokens`: an expert gets each token at
    most once, so a larger C drops nothing (Megatron-Core skips dropping there too) and would
    only add padding rows. Pure Python: the model (models/moe_dispatch.py) and the planner
    read the same C.

    >>> expert_capacity(512, 2, 8, 1.0), expert_capacity(512, 2, 8, 1.25)
    (128, 160)
    >>> expert_capacity(10, 2, 2, 4.0)  # 20 > the 10 tokens
    10
    """
    return min(tokens, math.ceil((tokens * top_k / num_experts) * factor))


def _llama_ffn(dim: int, multiple_of: int = 256) -> int:
    # Llama's SwiGLU width: 2/3 of 4*dim (same FLOPs as a 4*dim GELU MLP), rounded up to 256.
    hidden = int(2 * 4 * dim / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class ParamCounts:
    """Exact parameter counts per component (what the nn.Module allocates, element for element).

    Counts: token embedding V*h; learned positions S*h; per layer attention q (h*a*d), k and v
    (h*g*d each), o (a*d*h) plus their biases (all four with `bias`, q/k/v only with
    `qkv_bias`: a*d + 2*g*d) and the q/k norms' 2*d weights (`qk_norm`), or Multi-head Latent
    Attention's projections and latent norms (`config.deepseek.mla_attention_params`); MLP
    2*h*f (GELU) or 3*h*f (SwiGLU, GeGLU) plus biases, times the number of experts for MoE,
    plus the router h*E and the shared experts 3*h*(n_s*f); two norms per layer, four with
    `post_norms` (2h with bias for LayerNorm, h for RMSNorm); a final norm; the head V*h unless
    tied. An MoE model's first `num_dense_layers` blocks hold a dense MLP of `dense_ffn_dim`
    instead (`dense_mlp`). Ignores: buffers (RoPE tables, the sigmoid router's balancing bias)
    are not parameters.
    """

    embedding: int
    position: int
    attention: int  # per layer
    mlp: int  # per layer, all experts together for MoE
    mlp_per_expert: int  # one expert's MLP (== mlp for dense models)
    router: int  # per layer (0 for dense)
    norms: int  # per layer (the two pre-norms, and the two post-norms with `post_norms`)
    final_norm: int
    head: int  # 0 when tied to the embedding
    num_layers: int
    attention_replicated: int = 0
    """Of `attention`, what tensor parallelism keeps whole on every rank (MLA's latent
    down-projections and norms)."""
    shared_mlp: int = 0
    """Per MoE layer: the shared experts (DeepSeekMoE), one SwiGLU MLP."""
    dense_layers: int = 0
    """MoE models: blocks whose MLP is dense (DeepSeek's first_k_dense_replace)."""
    dense_mlp: int = 0
    """The MLP of one of those dense blocks."""

    @classmethod
    def of(cls, m: ModelConfig) -> ParamCounts:
        h, d, a, g, f = m.dim, m.head_dim, m.num_heads, m.num_kv_heads, m.ffn_dim
        if m.is_mla:
            attn = mla_attention_params(m)
        else:
            attn = h * a * d + 2 * h * g * d + a * d * h
            if m.bias or m.qkv_bias:
                attn += a * d + 2 * g * d
            if m.bias:
                attn += h
            if m.qk_norm:
                attn += 2 * d
        n_mat = 3 if m.gated_mlp else 2

        def mlp(width: int) -> int:
            return n_mat * h * width + ((n_mat - 1) * width + h if m.bias else 0)

        expert = mlp(f)
        norm = 2 * h if (m.norm == "layernorm" and m.bias) else h
        dense = m.num_dense_layers if m.is_moe else 0
        return cls(
            embedding=m.vocab_size * h,
            position=m.max_seq_len * h if m.position == "learned" else 0,
            attention=attn,
            mlp=expert * max(1, m.num_experts),
            mlp_per_expert=expert,
            router=h * m.num_experts,
            norms=(4 if m.post_norms else 2) * norm,
            final_norm=norm,
            head=0 if m.tie_embeddings else m.vocab_size * h,
            num_layers=m.num_layers,
            attention_replicated=mla_replicated_params(m) if m.is_mla else 0,
            shared_mlp=mlp(m.num_shared_experts * f) if m.num_shared_experts else 0,
            dense_layers=dense,
            dense_mlp=mlp(m.dense_ffn_dim or f) if dense else 0,
        )

    @property
    def per_layer(self) -> int:
        """One block's parameters (an MoE block's, for MoE models)."""
        return self.attention + self.mlp + self.shared_mlp + self.router + self.norms

    @property
    def dense_per_layer(self) -> int:
        """One of an MoE model's dense first blocks (`dense_layers`)."""
        return self.attention + self.dense_mlp + self.norms

    @property
    def layers_total(self) -> int:
        """All blocks together."""
        return (self.num_layers - self.dense_layers) * self.per_layer + (
            self.dense_layers * self.dense_per_layer
        )

    @property
    def total(self) -> int:
        return self.embedding + self.position + self.layers_total + self.final_norm + self.head

    def attention_per_tp(self, tp: int) -> float:
        """One block's attention parameters on one of `tp` tensor-parallel ranks."""
        return (self.attention - self.attention_replicated) / tp + self.attention_replicated

    def active_per_layer(self, experts_per_token: int) -> int:
        """Parameters one token touches in a layer (MoE: only its top-k and shared experts)."""
        if self.router == 0:
            return self.per_layer
        return (
            self.attention
            + self.norms
            + self.router
            + self.shared_mlp
            + experts_per_token * self.mlp_per_expert
        )

    def active(self, experts_per_token: int) -> int:
        """Parameters one token's forward multiplies by: every block's active part
        (`active_per_layer`), the final norm and the head (the tied embedding counts as the
        head); not the embedding table, a lookup of one row (DeepSeek-V3's README_WEIGHTS.md
        "36.7B activated" of the main model is this count: 36.6B)."""
        moe = self.num_layers - self.dense_layers
        head = self.head or self.embedding
        return (
            moe * self.active_per_layer(experts_per_token)
            + self.dense_layers * self.dense_per_layer
            + self.final_norm
            + head
        )


# ---- presets -----------------------------------------------------------------------------
# Architectures from the publishers' configs (GPT-2: OpenAI's released checkpoints as in HF
# `gpt2*` config.json; Llama 2: Touvron et al. 2023 + HF config; Llama 3/3.1: Meta model cards
# + HF config; GPT-3: Brown et al. 2020 Table 2.1; Mixtral: Jiang et al. 2024 + HF config;
# Qwen2.5 / Qwen3 / Phi-3: the config.json of Qwen/Qwen2.5-7B, Qwen/Qwen2.5-72B, Qwen/Qwen3-8B,
# Qwen/Qwen3-32B, Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B, google/gemma-2-9b, google/gemma-2-27b
# and microsoft/Phi-3-mini-4k-instruct on the Hugging Face hub).
# Stated parameter counts checked in tests/unit/test_config.py (Qwen, Phi-3:
# tests/unit/test_model_families.py, Qwen3-MoE and Gemma 2: tests/unit/test_moe_gemma_families.py,
# against the model cards' and the Gemma 2 paper's figures).


def _gpt2(
    name: str, dim: int, layers: int, heads: int, ctx: int = 1024, vocab: int = 50257
) -> ModelConfig:
    return ModelConfig(
        name=name,
        vocab_size=vocab,
        dim=dim,
        num_layers=layers,
        num_heads=heads,
        max_seq_len=ctx,
        norm="layernorm",
        activation="gelu",
        position="learned",
        tie_embeddings=True,
        bias=True,
    )


def _llama(
    name: str,
    dim: int,
    layers: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    vocab: int,
    ctx: int,
    theta: float,
    eps: float = 1e-5,
    **moe: Any,
) -> ModelConfig:
    return ModelConfig(
        name=name,
        vocab_size=vocab,
        dim=dim,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        ffn_dim=ffn,
        max_seq_len=ctx,
        norm="rmsnorm",
        activation="swiglu",
        position="rope",
        rope_theta=theta,
        tie_embeddings=False,
        bias=False,
        norm_eps=eps,
        **moe,
    )


def _deepseek(name: str, **fields: Any) -> ModelConfig:
    """A DeepSeek-V2/V3 architecture: Llama's RMSNorm + SwiGLU + RoPE blocks with Multi-head
    Latent Attention and DeepSeekMoE (config/deepseek.py)."""
    return ModelConfig(
        name=name,
        norm="rmsnorm",
        activation="swiglu",
        position="rope",
        tie_embeddings=False,
        bias=False,
        norm_eps=1e-6,
        **fields,
    )


_QWEN2: dict[str, Any] = {"qkv_bias": True, "hf_model_type": "qwen2"}
_QWEN3: dict[str, Any] = {"qk_norm": True, "head_dim_override": 128, "hf_model_type": "qwen3"}
# Qwen3-MoE: Qwen3's attention, 128 fine-grained experts (ffn_dim = moe_intermediate_size),
# top-8 with renormalized weights, the load-balancing weight of its config.json
_QWEN3_MOE: dict[str, Any] = {
    **_QWEN3,
    "num_experts": 128,
    "experts_per_token": 8,
    "moe_aux_loss_coef": 0.001,
    "hf_model_type": "qwen3_moe",
}


def _gemma2(
    name: str, dim: int, layers: int, heads: int, kv_heads: int, head_dim: int, ffn: int, scale: int
) -> ModelConfig:
    """Gemma 2 (Gemma Team 2024, "Gemma 2: Improving Open Language Models at a Practical Size",
    Table 1; the config.json of google/gemma-2-9b / -27b): GeGLU, embeddings x sqrt(d),
    (1 + w) RMSNorms before and after each sub-layer, scores / sqrt(query_pre_attn_scalar)
    capped at 50, logits capped at 30, a 4096 window on every other layer, tied head."""
    return ModelConfig(
        name=name,
        vocab_size=256000,
        dim=dim,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim_override=head_dim,
        ffn_dim=ffn,
        max_seq_len=8192,
        norm="rmsnorm",
        activation="geglu",
        position="rope",
        rope_theta=10000.0,
        tie_embeddings=True,
        bias=False,
        norm_eps=1e-6,
        attention="naive",
        attn_scale_dim=scale,
        attn_softcap=50.0,
        logit_softcap=30.0,
        sliding_window=4096,
        full_attention_every=2,
        norm_plus_one=True,
        post_norms=True,
        scale_embeddings=True,
        hf_model_type="gemma2",
    )


MODEL_PRESETS: dict[str, Callable[[], ModelConfig]] = {
    # tiny models for tests and the embedded default run (byte vocabulary)
    "tiny": lambda: ModelConfig(
        name="tiny", vocab_size=256, dim=64, num_layers=2, num_heads=4, max_seq_len=128
    ),
    "tiny-llama": lambda: _llama("tiny-llama", 64, 2, 4, 2, 176, 256, 128, 10000.0),
    "tiny-moe": lambda: _llama(
        "tiny-moe", 64, 2, 4, 2, 128, 256, 128, 10000.0, num_experts=4, experts_per_token=2
    ),
    "gpt-mini": lambda: ModelConfig(
        name="gpt-mini", vocab_size=256, dim=128, num_layers=4, num_heads=4, max_seq_len=128
    ),
    # GPT-2 (124,439,808 / 354,823,168 / 774,030,080 / 1,557,611,200 parameters, tied head)
    "gpt2-124m": lambda: _gpt2("gpt2-124m", 768, 12, 12),
    "gpt2-350m": lambda: _gpt2("gpt2-350m", 1024, 24, 16),
    "gpt2-774m": lambda: _gpt2("gpt2-774m", 1280, 36, 20),
    "gpt2-1.5b": lambda: _gpt2("gpt2-1.5b", 1600, 48, 25),
    # GPT-3 175B: 96 layers, d=12288, 96 heads, context 2048, GPT-2 tokenizer
    "gpt3-175b": lambda: _gpt2("gpt3-175b", 12288, 96, 96, ctx=2048),
    # Llama 2 (6,738,415,616 / 13,015,864,320 / 68,976,648,192)
    "llama2-7b": lambda: _llama("llama2-7b", 4096, 32, 32, 32, 11008, 32000, 4096, 1e4),
    "llama2-13b": lambda: _llama("llama2-13b", 5120, 40, 40, 40, 13824, 32000, 4096, 1e4),
    "llama2-70b": lambda: _llama("llama2-70b", 8192, 80, 64, 8, 28672, 32000, 4096, 1e4),
    # Llama 3 / 3.1 (8,030,261,248 / 70,553,706,496 / 405,853,388,800)
    "llama3-8b": lambda: _llama("llama3-8b", 4096, 32, 32, 8, 14336, 128256, 8192, 5e5),
    "llama3-70b": lambda: _llama("llama3-70b", 8192, 80, 64, 8, 28672, 128256, 8192, 5e5),
    "llama3-405b": lambda: _llama("llama3-405b", 16384, 126, 128, 8, 53248, 128256, 8192, 5e5),
    # Mixtral 8x7B (46,702,792,704): 8 SwiGLU experts, top-2, GQA 8 KV heads
    "mixtral-8x7b": lambda: _llama(
        "mixtral-8x7b",
        4096,
        32,
        32,
        8,
        14336,
        32000,
        32768,
        1e6,
        num_experts=8,
        experts_per_token=2,
    ),
    # Qwen2.5 (7,615,616,512 / 72,706,203,648): q/k/v biases, GQA, theta 1e6, untied head
    "qwen2.5-7b": lambda: _llama(
        "qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, 131072, 1e6, 1e-6, **_QWEN2
    ),
    "qwen2.5-72b": lambda: _llama(
        "qwen2.5-72b", 8192, 80, 64, 8, 29568, 152064, 131072, 1e6, 1e-6, **_QWEN2
    ),
    # Qwen3 dense (8,190,735,360 / 32,762,123,264): per-head q/k norms, head_dim 128 at every
    # size (32B: 64 heads x 128 = 8192 wide q on a 5120 residual stream)
    "qwen3-8b": lambda: _llama(
        "qwen3-8b", 4096, 36, 32, 8, 12288, 151936, 40960, 1e6, 1e-6, **_QWEN3
    ),
    "qwen3-32b": lambda: _llama(
        "qwen3-32b", 5120, 64, 64, 8, 25600, 151936, 40960, 1e6, 1e-6, **_QWEN3
    ),
    # Qwen3-MoE (30,532,122,624 / 235,093,634,560; 3.3B / 22B activated): Qwen3's attention
    # (32 / 64 heads x 128 on a 2048 / 4096 stream), 128 experts of width 768 / 1536, top 8
    "qwen3-30b-a3b": lambda: _llama(
        "qwen3-30b-a3b", 2048, 48, 32, 4, 768, 151936, 40960, 1e6, 1e-6, **_QWEN3_MOE
    ),
    "qwen3-235b-a22b": lambda: _llama(
        "qwen3-235b-a22b", 4096, 94, 64, 4, 1536, 151936, 40960, 1e6, 1e-6, **_QWEN3_MOE
    ),
    # Gemma 2 (9,241,705,984 / 27,227,128,320): 256-wide heads on the 9B (q 4096 on a 3584
    # stream), 128-wide on the 27B with scores scaled by 1/sqrt(144)
    "gemma-2-9b": lambda: _gemma2("gemma-2-9b", 3584, 42, 16, 8, 256, 14336, 256),
    "gemma-2-27b": lambda: _gemma2("gemma-2-27b", 4608, 46, 32, 16, 128, 36864, 144),
    # Phi-3-mini (3,821,079,552): Llama's block with fused checkpoint tensors, MHA, a 2047 window
    "phi-3-mini": lambda: _llama(
        "phi-3-mini",
        3072,
        32,
        32,
        32,
        8192,
        32064,
        4096,
        1e4,
        sliding_window=2047,
        hf_model_type="phi3",
    ),
    # DeepSeek-V3 (671,026,404,352 without the multi-token-prediction module; 36,625,603,584 active:
    # config/model.py `ParamCounts.active`): MLA (q latent 1536, kv latent 512, 128 + 64-wide
    # q/k heads, 128-wide values), 3 dense blocks, then 256 routed experts of 2048 (top-8 from
    # 4 of 8 groups, sigmoid, x2.5) + 1 shared; the published run's gamma = 0.001 (sec. 4.2)
    # and sequence-wise balance weight alpha = 0.0001. Context: the 4K pre-training length
    # (YaRN extends it afterwards; not modelled)
    "deepseek-v3": lambda: _deepseek(
        "deepseek-v3",
        vocab_size=129280,
        dim=7168,
        num_layers=61,
        num_heads=128,
        ffn_dim=2048,
        max_seq_len=4096,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        num_experts=256,
        experts_per_token=8,
        num_shared_experts=1,
        num_dense_layers=3,
        dense_ffn_dim=18432,
        router_scoring="sigmoid",
        router_groups=8,
        router_topk_groups=4,
        router_norm_topk=True,
        router_scale=2.5,
        router_bias_rate=0.001,
        moe_aux_loss_coef=0.0001,
        hf_model_type="deepseek_v3",
    ),
    # DeepSeek-V2-Lite (15,706,484,224; 2,451,435,008 active): MLA without the q latent, 1
    # dense block, 64 routed experts of 1408 (top-6, softmax, no group limit) + 2 shared
    "deepseek-v2-lite": lambda: _deepseek(
        "deepseek-v2-lite",
        vocab_size=102400,
        dim=2048,
        num_layers=27,
        num_heads=16,
        ffn_dim=1408,
        max_seq_len=4096,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        num_experts=64,
        experts_per_token=6,
        num_shared_experts=2,
        num_dense_layers=1,
        dense_ffn_dim=10944,
        router_scoring="softmax",
        moe_aux_loss_coef=0.001,
        hf_model_type="deepseek_v2",
    ),
    # a small DeepSeek-V3 for tests and dry-runs (byte vocabulary): every piece, tiny widths
    "tiny-deepseek": lambda: _deepseek(
        "tiny-deepseek",
        vocab_size=256,
        dim=64,
        num_layers=3,
        num_heads=4,
        ffn_dim=32,
        max_seq_len=128,
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        num_experts=8,
        experts_per_token=2,
        num_shared_experts=1,
        num_dense_layers=1,
        dense_ffn_dim=128,
        router_scoring="sigmoid",
        router_groups=4,
        router_topk_groups=2,
        router_norm_topk=True,
        router_scale=2.5,
        router_bias_rate=0.001,
        moe_aux_loss_coef=0.0001,
        hf_model_type="deepseek_v3",
    ),
}


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """A preset by name (overrides replace fields); unknown names list the valid ones."""
    if name not in MODEL_PRESETS:
        from .strict import did_you_mean

        raise ConfigError(
            "model.name",
            name,
            f"use a preset{did_you_mean(name, MODEL_PRESETS)}"
            f" ({', '.join(MODEL_PRESETS)}), a config.json path or a hub id (org/name)",
        )
    cfg = MODEL_PRESETS[name]()
    return replace(cfg, **_rederive(cfg, overrides)) if overrides else cfg


def _rederive(cfg: ModelConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` plus, for a field the preset derived from one the user now changes, a reset
    so it is derived again: ffn_dim from dim (`--model.dim=256` on gpt-mini kept ffn_dim 512,
    the old dim's 4x), num_kv_heads from num_heads (no GQA stays no GQA). A field the preset
    set apart from that rule, or the user gave, is kept."""
    out = dict(overrides)
    if "dim" in out and "ffn_dim" not in out:
        derived = _llama_ffn(cfg.dim) if cfg.gated_mlp else 4 * cfg.dim
        if cfg.ffn_dim == derived:
            out["ffn_dim"] = 0
    if "num_heads" in out and "num_kv_heads" not in out and cfg.num_kv_heads == cfg.num_heads:
        out["num_kv_heads"] = 0
    return out


def resolve_model(name_or_path: str, **overrides: Any) -> ModelConfig:
    """A preset name, a path to a Hugging Face config.json (or its directory), or a hub id
    (`org/name`) found in the local Hugging Face cache (`config.hub`), with field overrides."""
    if not name_or_path.strip():
        raise ConfigError(
            "model.name",
            name_or_path,
            "give a model preset (e.g. tiny-llama), the path of a Hugging Face config.json or "
            "a hub id (org/name) in the local Hugging Face cache",
        )
    if name_or_path in MODEL_PRESETS:
        return model_preset(name_or_path, **overrides)
    if name_or_path.endswith(".json") or Path(name_or_path).is_dir():
        from .hf_model import model_from_hf_config  # (hf_model imports this module)

        cfg = model_from_hf_config(name_or_path)
        return replace(cfg, **overrides) if overrides else cfg
    if is_hub_id(name_or_path):  # org/name: its config.json in the local Hugging Face cache
        from .hf_model import model_from_hf_config

        cfg = model_from_hf_config(hub_snapshot(name_or_path, "model.name"))
        return replace(cfg, name=name_or_path, **overrides)
    return model_preset(name_or_path)  # raises with the list of presets


MODEL_FIELDS = tuple(f.name for f in fields(ModelConfig))
