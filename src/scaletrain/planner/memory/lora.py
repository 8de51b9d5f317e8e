"""LoRA and QLoRA in the memory model (torch-free): what a frozen base with trainable adapters
(`[lora]`, `models.lora`, `models.quantized`) changes in one rank's bytes.

Counts, per block and per tensor-parallel rank (the seven projections wq, wk, wv, wo, w1, w2, w3
of a dense Llama block, `config.lora.projection_shapes`, split as the trainer splits them under
tp, `config.lora.tp_shapes`: a column-parallel W's rows / tp with B, a row-parallel W's (wo, w2)
columns / tp with A, the other adapter half whole on every rank, `parallel.tensor_parallel_lora`):
- the adapters: rank x (in + out) trainable parameters per adapted projection (Hu et al. 2021),
  rank x (out/tp + in) beside a column-parallel W and rank x (out + in/tp) beside a
  row-parallel one; fp32 like every trainable parameter: the only gradients and optimizer
  states;
- the frozen projections at rest, in `lora.base_dtype`'s bytes per value
  (`stored_bytes_per_value`): 'auto' 4 (fp32, the trainer's parameter dtype), 'bf16' 2, 'int8'
  1 + 4/in (int8 codes and one fp32 scale per row: torchao's per-row weight-only format),
  'nf4' 0.5 + 1/64 + 4/(64 x 256) + (4 + 16 x 4)/n (QLoRA, Dettmers et al. 2023, sec. 3: 4-bit
  NormalFloat codes; one absmax per block of 64 values, double-quantized to 8 bits, 8/64 =
  0.125 bits per value; one fp32 factor per 256 absmaxes, 32/(64 x 256) bits per value (the
  paper's 0.127 bits of constants in all); torchao's NF4Tensor keeps the mean of the absmaxes
  and the 16 code values, fp32, once per tensor of n values);
- the same projections as FSDP2 all-gathers them (`gathered_bytes_per_value`): the compute
  dtype for 'auto' and 'bf16' (MixedPrecisionPolicy casts fp32 before the gather), int8 codes
  with their scales in the compute dtype, NF4's codes, int8 absmaxes and fp32 factors
  (NF4Tensor.fsdp_pre_all_gather; its mean and code book are local metadata);
- the embedding, the norms and the head stay fp32 parameters, frozen.

What the frozen base does not hold (measured with saved-tensor hooks on tiny-llama, each block,
autocast and bf16 streams: `lora_layer_activation_bytes`): no gradient of any frozen weight, so
a frozen linear saves no input (only its adapter's A saves it, and under autocast each A casts
its own copy), the norms' weights save no normalized output, the first block's first norm
saves nothing (its input, the frozen embedding's output, needs no gradient), the MLP's last
input (w2's) is saved only when w2 has an adapter; each adapter's B saves A's (tokens x rank)
output. A quantized base is dequantized into a temporary per projection in forward and in
backward (`dequantize_work_bytes`), and keeps no 16-bit copy between them.

Under tp (`lora_layer_activation_bytes`): what reads the block's replicated input (each A of
q, k, v, w1, w3) saves it whole on every rank (all-gathered under sp); every A output is
rank-wide on every rank (a column-parallel A is replicated; a row-parallel A's output is a
partial sum of the same width); the attention core and the MLP's hidden activations are the
rank's heads / columns (/ tp); the norms' inputs are the residual stream's sequence slice
under sp (/ tp), whole without.

bitsandbytes' 4-bit layers (`PlanInput.lora_quantizer` 'bitsandbytes' / 'bitsandbytes-dq':
LitGPT's QLoRA, Lightning Fabric's BitsandbytesPrecision) store and run the base otherwise
(`bnb_stored_bytes_per_value`, `bnb_saved_input_bytes`, `bnb_dequantize_work_bytes`):
- at rest: bitsandbytes' own NF4 layout, an fp32 absmax per 64 values without double
  quantization (Fabric's 'nf4'), 0.5625 B per value;
- bitsandbytes 0.42.0 (0.41.0 alike) bitsandbytes/autograd/_functions.py MatMul4Bit.forward
  keeps its input for backward (`ctx.tensors = (A, B)` whenever an input needs a gradient),
  although its
  backward reads only the quantized weight (grad_A = grad_output @ dequantize_4bit(B)^T; no
  weight gradient); so every quantized projection's input is held until its backward: per
  block the attention input, the attention output as the output projection reads it, the MLP
  input and the MLP product (w2's input), e x tokens x (3h + f). Counted in full on top of
  `lora_layer_activation_bytes`: LitGPT's adapters read `lora_dropout(x)` (litgpt/lora.py
  LoRALinear.forward, LoRAQKVLinear.forward; lora_dropout 0.05 in every config_hub/finetune
  yaml), a tensor of their own, so the adapters share none of these inputs;
- the dequantization: `F.dequantize_4bit(B, quant_state)` returns the weight in the dtype it
  was quantized from, fp16 (lightning/fabric/plugins/precision/bitsandbytes.py
  _Linear4bit.quantize casts it with `.to(dtype=torch.half)` before `quantize_4bit`), then
  `.to(A.dtype)` copies it to the compute dtype: 2 + wc bytes per value (2 in fp16), in
  forward and again in backward, one projection at a time; the largest quantized projection
  includes an untied LM head (Fabric's `module_init_context` replaces every torch.nn.Linear built
  under `init_module`, litgpt's `lm_head` included), whose backward runs first, with every
  block's saved set alive.

Adapter dropout (`lora_dropout_bytes`, `PlanInput.lora_dropout` p > 0): each adapter reads
dropout(x), not x. Counted per dropout module, each adapted Linear having its own (PEFT
src/peft/tuners/lora/layer.py LoraLayer.update_layer, huggingface/peft 00336949: an
nn.Dropout per adapter when lora_dropout > 0, else nn.Identity; torchtune
torchtune/modules/peft/lora.py LoRALinear.__init__ / forward, pytorch/torchtune 031d89b8:
`lora_a(self.dropout(x))`; LitGPT litgpt/lora.py LoRALinear.forward, Lightning-AI/litgpt
01e39f50: `self.lora_dropout(x) @ lora_A^T`, whose LoRAQKVLinear has one dropout and one A for
the fused q/k/v: `PlanInput.lora_fused_qkv`): A's matmul saves the dropped copy (e bytes per
value, a tensor of its own, so adapters on one input share nothing) and dropout keeps its
mask (torch tools/autograd/derivatives.yaml native_dropout: the backward reads only result1,
the mask; a bool tensor, 1 byte per value).

Ignores: the int8 scales' and NF4
metadata's share of FSDP2's padding; under 'bitsandbytes', the head's input kept by its
MatMul4Bit (e x tokens x h, once), the head's and the embedding's storage (planned as the
recipe stores them), and what an adapter with dropout 0 would share with MatMul4Bit's input.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import ModelConfig, compute_bytes, offload_states
from scaletrain.config.lora import NF4_BLOCK, nf4_scaler_block, tp_shapes

from ..types import PlanInput
from .activations import attention_saved_bytes
from .head import MicroBatchShape
from .states import UNITS_IN_FLIGHT, StageParams, optimizer_bytes

__all__ = [
    "LoraTerms",
    "lora_terms",
    "stored_bytes_per_value",
    "gathered_bytes_per_value",
    "dequantize_work_bytes",
    "compiled_dequantize_bytes",
    "lora_layer_activation_bytes",
    "lora_dropout_bytes",
    "first_block_saving",
    "LORA_QUANTIZERS",
    "bnb_saved_input_bytes",
    "bnb_dequantize_work_bytes",
    "bnb_stored_bytes_per_value",
]

LORA_QUANTIZERS = ("native", "bitsandbytes", "bitsandbytes-dq")
"""Whose quantized linear runs an 'nf4' base (`PlanInput.lora_quantizer`): 'native', the
trainer's (`models.quantized`) and torchao's NF4Tensor as counted above; 'bitsandbytes' and
'bitsandbytes-dq', bitsandbytes' Linear4bit / MatMul4Bit as Fabric's BitsandbytesPrecision
'nf4' and 'nf4-dq' build it (module docstring; `bnb_stored_bytes_per_value`)."""


def bnb_stored_bytes_per_value(rows: int, cols: int, double_quant: bool) -> float:
    """Bytes per value of a (rows x cols) weight in bitsandbytes' NF4 (blocksize 64,
    Params4bit's default): 4-bit codes, 0.5 B, and one absmax per 64 values, fp32 without
    double quantization (Fabric's _NF4Linear: compress_statistics=False), else an int8 absmax
    per 64 plus an fp32 factor per 256 absmaxes and the fp32 mean subtracted from them
    (_NF4DQLinear: compress_statistics=True). Source: bitsandbytes 0.42.0
    bitsandbytes/functional.py quantize_4bit (absmax float32 per block; `quantize_blockwise(
    absmax, blocksize=256)` with `offset = absmax.mean()` when compress_statistics)."""
    n = float(rows) * cols
    blocks = n / NF4_BLOCK
    if not double_quant:
        return 0.5 + PARAM_BYTES * blocks / n
    return 0.5 + (blocks + PARAM_BYTES * blocks / 256 + PARAM_BYTES) / n


PARAM_BYTES = 4.0
"""The trainer's parameters are fp32 (adapters, embedding, norms, head, an 'auto' base)."""

_NF4_TENSOR_CONSTANTS = 4.0 + 16 * 4.0
"""Per NF4 tensor: the fp32 mean of its block absmaxes and its 16 fp32 code values."""


def stored_bytes_per_value(base_dtype: str, rows: int, cols: int) -> float:
    """Bytes per value of a frozen (rows x cols) projection stored as `base_dtype` (module
    docstring)."""
    n = rows * cols
    if base_dtype == "auto":
        return PARAM_BYTES
    if base_dtype == "bf16":
        return 2.0
    if base_dtype == "int8":
        return 1.0 + PARAM_BYTES / cols  # codes + one fp32 scale per row
    if base_dtype == "nf4":
        blocks = n / NF4_BLOCK
        groups = blocks / nf4_scaler_block(n)
        return 0.5 + (blocks + PARAM_BYTES * groups + _NF4_TENSOR_CONSTANTS) / n
    raise ValueError(f"base_dtype={base_dtype!r}")


def gathered_bytes_per_value(base_dtype: str, rows: int, cols: int, precision: str) -> float:
    """Bytes per value of a frozen projection as FSDP2 all-gathers it (module docstring)."""
    wc = compute_bytes(precision)
    n = rows * cols
    if base_dtype in ("auto", "bf16"):
        return float(wc) if base_dtype == "auto" else 2.0
    if base_dtype == "int8":
        return 1.0 + wc / cols
    blocks = n / NF4_BLOCK
    return 0.5 + (blocks + PARAM_BYTES * blocks / nf4_scaler_block(n)) / n


def dequantize_work_bytes(
    base_dtype: str, rows: int, cols: int, precision: str, nf4_dtype_bytes: float = PARAM_BYTES
) -> float:
    """The temporaries of dequantizing one frozen (rows x cols) projection for its matmul.

    'nf4': torchao's `NF4Tensor.get_original_weight` (eager): the two halves' codes as int64
    (8 B per value), their code values, the scaled values and the stacked result in the
    tensor's dtype (3 x `nf4_dtype_bytes`: fp32, 4, for the trainer's NF4 tensors, quantized
    from fp32 parameters; 2 for one quantized from a bf16 weight, torchtune's), alive together
    until it returns; then the cast to the compute dtype (none in fp32). 'int8': the codes cast
    to the compute dtype and the product with the scales (2 x wc). 'bf16': its cast to the
    compute dtype (none in bf16). 'auto': nothing (the weight is used as it is, or cast by
    autocast: the in-flight casts). Source: the code named; held against the dry-run in
    benchmarks/results/planner_accuracy.md."""
    n = float(rows) * cols
    wc = compute_bytes(precision)
    if base_dtype == "nf4":
        return (8.0 + 3 * nf4_dtype_bytes) * n
    if base_dtype == "int8":
        return 2.0 * wc * n
    if base_dtype == "bf16":
        return 0.0 if wc == 2 else wc * n
    return 0.0


def compiled_dequantize_bytes(base_dtype: str, rows: int, cols: int, precision: str) -> float:
    """The temporaries of dequantizing one frozen (rows x cols) projection inside a block that
    torch.compile compiled: the weight in the compute dtype, wc per value, for 'nf4' and
    'int8' (and 'bf16' cast to a wider compute dtype); nothing for a base already in it.

    Counts: Inductor lowers the dequantization's ops (the shifts and masks of the packed codes,
    their int64 casts, the code-book lookup, the products with the scales, the stack and the
    cast: torchao/dtypes/nf4tensor.py NF4Tensor.get_original_weight, pytorch/ao 0598012;
    NF4Tensor is traced by torch.compile from torch 2.3, test/dtypes/test_nf4.py
    test_smoketest_linear_compile) into one fused kernel that writes only its output, which the
    matmul (an extern cuBLAS call) reads; and the backward does not keep that output from the
    forward: AOTAutograd's min-cut partitioner (torch/_functorch/partitioners.py
    min_cut_rematerialization_partition, pytorch/pytorch 00c07b93: pointwise ops, _to_copy,
    index and gather are recomputable; a graph input such as the NF4 codes is saved at its own
    size) saves the packed codes and recomputes the dequantization in the backward graph.
    Ignores: Inductor holding two projections' weights at once (w1 and w3 read the same
    input; the scheduler may run both dequantizations before either matmul)."""
    wc = compute_bytes(precision)
    if base_dtype in ("nf4", "int8") or (base_dtype == "bf16" and wc != 2):
        return float(wc) * rows * cols
    return 0.0


def bnb_saved_input_bytes(model: ModelConfig, tokens: float, precision: str) -> float:
    """What bitsandbytes' MatMul4Bit keeps per block beyond the adapters' saved set: the
    inputs of the block's four quantized matmuls (the fused q/k/v and the MLP's w1 / w3 share
    one input each), e x tokens x (3h + f), e the compute dtype's bytes. Source:
    bitsandbytes 0.42.0 bitsandbytes/autograd/_functions.py MatMul4Bit.forward
    (`ctx.tensors = (A, B)`); module docstring for what it ignores. One device: LitGPT refuses
    a quantized base on more than one (litgpt/finetune/lora.py setup)."""
    e = compute_bytes(precision)
    return e * tokens * (3.0 * model.dim + model.ffn_dim)


def bnb_dequantize_work_bytes(model: ModelConfig, precision: str) -> float:
    """bitsandbytes' dequantization temporaries for the largest quantized projection, the
    seven block projections and an untied LM head (vocab x h): its fp16 dequantized copy and that
    copy cast to the compute dtype, (2 + wc) bytes per value, wc = 0 in fp16 (no cast). Source:
    bitsandbytes 0.42.0 MatMul4Bit.forward / .backward (`F.dequantize_4bit(B, state).to(...)`)
    and Fabric's _Linear4bit.quantize (quantizes an fp16 copy); module docstring."""
    wc = compute_bytes(precision)
    cast = 0.0 if precision == "fp16" else float(wc)
    head = [] if model.tie_embeddings else [float(model.vocab_size) * model.dim]
    largest = max(
        [float(r) * c for r, c in (sh.weight for sh in tp_shapes(model, 1, 1).values())] + head
    )
    return (2.0 + cast) * largest


@dataclass(frozen=True, slots=True)
class LoraTerms:
    """A LoRA plan's per-block sizes on one tensor-parallel rank (`lora_terms`)."""

    adapters: float
    """Trainable (adapter) parameters per block on this rank."""
    frozen: float
    """Values of the block's seven frozen projections on this rank."""
    stored: float
    """Bytes of the block's frozen projections at rest on this rank (before ZeRO sharding)."""
    gathered: float
    """Bytes of the block's frozen projections on this rank as FSDP2 all-gathers them."""
    dequantize: float
    """The largest projection's dequantization temporaries (`dequantize_work_bytes`)."""
    base_dtype: str
    targets: tuple[str, ...]
    rank: int
    tp: int = 1
    """The tensor-parallel degree the sizes are split by."""


def lora_terms(
    model: ModelConfig,
    rank: int,
    targets: tuple[str, ...],
    base_dtype: str,
    precision: str,
    tp: int = 1,
) -> LoraTerms:
    """Per-block sizes of LoRA rank `rank` on `targets` with the base stored as `base_dtype`,
    on one of `tp` tensor-parallel ranks: each projection's local W, A and B
    (`config.lora.tp_shapes`, the trainer's `parallel.tensor_parallel_lora` placement), its
    bytes per value from its local shape (a quantized base is not split by tp:
    `config.lora.lora_problems`)."""
    adapters = stored = gathered = frozen = work = 0.0
    for name, sh in tp_shapes(model, rank, tp).items():
        rows, cols = sh.weight
        if name in targets:
            adapters += sh.lora_a[0] * sh.lora_a[1] + sh.lora_b[0] * sh.lora_b[1]
        frozen += rows * cols
        stored += rows * cols * stored_bytes_per_value(base_dtype, rows, cols)
        gathered += rows * cols * gathered_bytes_per_value(base_dtype, rows, cols, precision)
        work = max(work, dequantize_work_bytes(base_dtype, rows, cols, precision))
    return LoraTerms(
        adapters=adapters,
        frozen=frozen,
        stored=stored,
        gathered=gathered,
        dequantize=work,
        base_dtype=base_dtype,
        targets=targets,
        rank=rank,
        tp=tp,
    )


def lora_layer_activation_bytes(
    model: ModelConfig,
    lora: LoraTerms,
    mb: MicroBatchShape,
    *,
    r: int,
    autocast: bool,
    dropout: float = 0.0,
    fused_qkv: bool = False,
) -> float:
    """Bytes one block with a frozen base and adapters keeps for backward (ac none) on one
    rank, per micro-batch `mb` of s_l x b tokens (s_l = seq_len / cp); e = activation bytes
    (`mb.precision`'s compute dtype), r = residual-stream bytes (4 under autocast), t = mb.tp
    (= lora.tp). Per saved tensor (module docstring):
    - the two RMSNorms: their input and fp32 rstd, (r*h + 4) each (their frozen weight saves
      no normalized output), / t under sp (the residual stream's sequence slice);
    - q/k/v's input, once per adapted q, k or v under autocast (each A casts its own copy),
      once for all of them otherwise; likewise the MLP input for adapted w1 / w3: e*s_l*b*h
      each, whole on every tp rank (A reads the replicated, under sp all-gathered, input);
      w2's input (the SwiGLU product, this rank's f/t columns) only with an adapter on w2;
    - the attention core's q, k, v, output and log-sum-exp on this rank's heads, as without
      LoRA (SDPA saves them; wo's adapter reads the output it saved);
    - SwiGLU's gate, silu(gate) and up, 3 x e*s_l*b*f/t (2 for GELU: fc1's output and GELU's);
    - each adapter's A output, saved by B: e*s_l*b*rank, whole on every tp rank (a
      column-parallel A is replicated; a row-parallel A's output is a partial sum, rank wide);
    - under autocast with an 'auto' (fp32) base, the frozen projections' 16-bit casts,
      e x `lora.frozen`: each matmul saves its cast weight for its input's gradient, and
      autocast caches the casts of leaves that need a gradient only (torch's autocast
      cache), so every forward, i.e. every micro-batch in flight, holds its own (a
      pipeline's schedule runs all of its micro-batches under one autocast context: a
      trainable weight's cast is made once, a frozen one's per micro-batch).
    Source: the trainer's `models.lora.LoRALinear.forward` under
    `parallel.tensor_parallel_lora`'s placements, held against the dry-run's per-block
    growth (tp2 and tp2+sp rows of benchmarks/results/planner_accuracy.md).
    - with adapter dropout `dropout` > 0, `lora_dropout_bytes` (`fused_qkv`: one dropout
      for q/k/v, LitGPT's LoRAQKVLinear).
    Ignores: naive attention's S x S set."""
    h, f, t = model.dim, model.ffn_dim, mb.tp
    assert t == lora.tp, (t, lora.tp)
    e, tokens = compute_bytes(mb.precision), mb.tokens
    targets = set(lora.targets)
    norms = 2 * (r * h + 4.0) * tokens / (t if mb.sp else 1)
    n_qkv = len(targets & {"wq", "wk", "wv"})
    n_in = len(targets & {"w1", "w3"})
    qkv = (n_qkv if autocast else min(1, n_qkv)) * e * tokens * h
    mlp_in = (n_in if autocast else min(1, n_in)) * e * tokens * h
    attn = attention_saved_bytes(model, mb.seq_len, mb.micro_batch, t, mb.cp, e, False, False)
    n_f = 3 if model.activation == "swiglu" else 2
    mlp = (n_f + (1 if "w2" in targets else 0)) * e * tokens * f / t
    adapters = len(targets) * e * tokens * lora.rank
    casts = e * lora.frozen if autocast and lora.base_dtype == "auto" else 0.0
    drop = lora_dropout_bytes(model, lora, mb, autocast=autocast, p=dropout, fused_qkv=fused_qkv)
    return norms + qkv + mlp_in + attn + mlp + adapters + casts + drop


def lora_dropout_bytes(
    model: ModelConfig,
    lora: LoraTerms,
    mb: MicroBatchShape,
    *,
    autocast: bool,
    p: float,
    fused_qkv: bool = False,
) -> float:
    """What adapter dropout with probability `p` adds to one block's saved set (ac none) on one
    rank, beyond `lora_layer_activation_bytes`'s count without it; 0 when p == 0 (the
    adapters read x itself). Per dropout module (module docstring): its dropped copy, saved by
    its A, e per value, and its bool mask, 1 per value, on the input it reads:
    - q/k/v: k modules on the block's input (whole on every tp rank), k = the adapted ones
      among wq, wk, wv, or 1 with `fused_qkv` (LitGPT's LoRAQKVLinear); less what is counted
      without dropout (one shared input, or one autocast copy per adapted projection);
    - w1/w3 alike on the MLP input (no fused form in the frameworks cited);
    - wo: the attention output (this rank's heads, h/t): a dropped copy and a mask on top of
      what SDPA saves;
    - w2: the SwiGLU product (f/t) is then saved only as its dropped copy (already counted with
      w2's adapter: `lora_layer_activation_bytes`), so the mask alone.
    Ignores: dropout's p itself (a mask is kept whatever p > 0 is); the fp32 dropped copy under
    autocast before each A casts it (released once cast: the cast saves nothing); that a fused
    A under autocast casts its input once where `lora_layer_activation_bytes` counts a cast
    per adapted q, k, v (dropout or not: not this term's to correct)."""
    if p <= 0.0:
        return 0.0
    h, f, t = model.dim, model.ffn_dim, mb.tp
    e, tokens = compute_bytes(mb.precision), mb.tokens
    targets = set(lora.targets)
    mask = 1.0

    def group(n: int, fused: bool) -> float:
        # the dropout modules on an input of h per token that n adapted projections read: n,
        # or one for a fused A, whose copies `lora_layer_activation_bytes` counts as
        # one shared input, or one autocast cast per projection (a fused A: one cast)
        if not n:
            return 0.0
        k = 1 if fused else n
        counted = (k if autocast else 1) * e
        return (k * (e + mask) - counted) * tokens * h

    n_qkv = len(targets & {"wq", "wk", "wv"})
    n_in = len(targets & {"w1", "w3"})
    extra = group(n_qkv, fused_qkv) + group(n_in, False)
    if "wo" in targets:
        extra += (e + mask) * tokens * h / t
    if "w2" in targets:
        extra += mask * tokens * f / t
    return extra


def first_block_saving(model: ModelConfig, *, tokens: float, r: int, sp_tp: int = 1) -> float:
    """What the first block saves less than the others: its first norm's input and rstd, which
    need no gradient (the frozen embedding's output); sp_tp: tp under sequence parallelism
    (the norm's input is the rank's sequence slice), else 1."""
    return (r * model.dim + 4.0) * tokens / sp_tp


@dataclass(frozen=True, slots=True)
class LoraStage:
    """A pipeline stage's LoRA split of its parameters (`lora_stage`)."""

    adapters: float
    """Trainable parameters on the stage (the adapters)."""
    block_unit_bytes: float
    """One block's FSDP2 unit as gathered: frozen projections in their gathered form, norms
    and adapters in the compute dtype."""
    block_adapters: float
    """One block's adapters (its unit's only gradients)."""
    states: dict[str, float]
    """`states.model_state_bytes`'s keys for this stage under LoRA."""


def lora_stage(
    lora: LoraTerms, plan: PlanInput, sp: StageParams, *, layers: int, zero_shards: int
) -> LoraStage:
    """The model states of a stage holding `layers` blocks of `sp.block` parameters and
    `sp.dense` parameters in all (adapters not included), under LoRA. All per tensor-parallel
    rank: `sp` (`rank_terms.stage_params`) and `lora` (`lora_terms` at the layout's tp) count
    the rank's shards alike, so what is not a frozen projection (embedding and head / tp,
    norms whole) is `sp.dense` less the rank's frozen projections.

    At rest: the frozen projections at `lora.stored` bytes per block, every other frozen
    parameter (embedding, norms, head) and the adapters fp32; sharded by FSDP2 over
    `zero_shards` at ZeRO-2/3 (parameters are sharded at rest from ZeRO-2 on: `states`).
    Gradients: fp32, the adapters only (ZeRO-2/3 sharded); optimizer states
    `states.optimizer_bytes` per adapter (ZeRO >= 1 sharded). In flight: ZeRO-3 gathers
    `states.UNITS_IN_FLIGHT` units (`block_unit_bytes`, or the root unit in the compute dtype when
    larger) and holds one unit's unsharded adapter gradients; ZeRO-2 (and ZeRO-3 on a
    split-backward pipeline, `StageParams.keep_gathered`) keeps every unit gathered; DDP /
    ZeRO-1 under autocast keeps a 16-bit cast of the adapters (autocast's cache: one per
    step). An 'auto' base's frozen projections are cast too, but per forward
    (no cache for a weight that needs no gradient): counted with the block's activations
    (`lora_layer_activation_bytes`); a quantized base's dequantized weight is a temporary.
    Offload: 'optimizer' moves the optimizer states, 'params' (ZeRO-3) the sharded
    parameters, gradients and states."""
    dense, block, zero = sp.dense, sp.block, plan.layout.zero
    wc = compute_bytes(plan.precision)
    state_bytes = optimizer_bytes(plan.optimizer, plan.beta1)
    offload = offload_states(plan.offload)
    adapters = layers * lora.adapters
    frozen = layers * lora.frozen
    other = dense - frozen  # embedding, norms, head: fp32, frozen
    rest = PARAM_BYTES * other + layers * lora.stored + PARAM_BYTES * adapters
    d = max(1, zero_shards) if zero >= 2 else 1
    params, grads = rest / d, PARAM_BYTES * adapters / d
    optim = state_bytes * adapters / (max(1, zero_shards) if zero >= 1 else 1)
    norms = block - lora.frozen  # a block's norm weights (and biases)
    unit = lora.gathered + wc * (norms + lora.adapters)
    root = wc * (dense - layers * block)
    in_params = in_grads = 0.0
    if zero >= 3 and not sp.keep_gathered:
        in_params = UNITS_IN_FLIGHT * max(unit, root)
        in_grads = wc * lora.adapters
    elif zero >= 2:  # (ZeRO-3 too on a split-backward pipeline: `StageParams.keep_gathered`)
        in_params = layers * unit + root
    elif wc < PARAM_BYTES:
        in_params = wc * adapters
    offloaded = 0.0
    if offload == "optimizer":
        offloaded, optim = optim, 0.0
    elif offload == "params" and zero >= 3:
        offloaded, params, grads, optim = params + grads + optim, 0.0, 0.0, 0.0
    elif offload == "params":
        offloaded, optim = optim, 0.0
    states = {
        "params": params + in_params,
        "grads": grads + in_grads,
        "optimizer": optim,
        "params.in_flight": in_params,
        "grads.in_flight": in_grads,
        "offloaded": offloaded,
    }
    return LoraStage(
        adapters=adapters, block_unit_bytes=unit, block_adapters=lora.adapters, states=states
    )
