"""Initialize a built (meta -> parallelized -> materialized) model from a Hugging Face directory.

`checkpoint.init_from = DIR` names a directory with `config.json` and `*.safetensors` (one file,
or shards listed by `model.safetensors.index.json`), or a hub id (`org/name`) whose snapshot is
in the local Hugging Face cache (`config.hub`; never downloaded). Each rank reads only the part
of each tensor it owns: a DTensor parameter (FSDP2 shard, tensor-parallel shard, expert-parallel
shard) asks `safe_open(...).get_slice(name)[box]` for exactly its local box, computed from its
placements (`compute_local_shape_and_global_offset`), so no rank ever holds a full weight it
does not own. Layouts whose local piece is not one box (FSDP over TP on the same dim:
`_StridedShard`) read the full tensor and keep their shard (correct, not memory-lean).

Names and layouts follow `checkpoint.hf` (GPT-2's Conv1D weights are stored transposed and its
q|k|v fused in `c_attn`; Phi-3's q|k|v fused in `qkv_proj` and gate|up in `gate_up_proj`,
each rank reading its rows of them; Mixtral and Qwen3-MoE experts either one Linear per expert
or transformers 5's fused `mlp.experts.gate_up_proj`; Gemma 2's four norms per block;
DeepSeek's tensors by `hf_deepseek`'s row maps, each rank reading the rows its box covers, and
the router's balancing bias, a buffer). Values are cast to the parameter's dtype.

A resume from scaletrain's own checkpoint wins: `load_initial_weights` does nothing when the
run will restore one (`checkpoint.resume` = auto with a good checkpoint in the run directory, or
an explicit path), so a restarted fine-tuning job continues instead of starting over.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from scaletrain.config import ConfigError, ModelConfig
from scaletrain.config.hf_model import hf_model_type
from scaletrain.config.user_files import read_user_file
from scaletrain.models import clean_fqn
from scaletrain.models.init import store_full_weight
from scaletrain.models.lora import is_adapter
from scaletrain.models.quantized import FrozenLinear

__all__ = ["load_initial_weights", "load_hf_weights", "SafetensorsDir"]

_FIELD = "checkpoint.init_from"
_INDEX_WHAT = "a model.safetensors.index.json"


class SafetensorsDir:
    """Lazy, name-addressed access to the tensors of a (possibly sharded) safetensors dir."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        index = self.directory / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(read_user_file(index, _FIELD, what=_INDEX_WHAT))[
                    "weight_map"
                ]
            except (json.JSONDecodeError, KeyError) as e:
                raise ConfigError(_FIELD, str(index), f"give a valid index file ({e})") from e
            self._file_of = {k: self.directory / v for k, v in weight_map.items()}
        else:
            files = sorted(self.directory.glob("*.safetensors"))
            if not files:
                raise ConfigError(
                    _FIELD,
                    str(self.directory),
                    "no *.safetensors files there (pickled .bin weights are never "
                    "read: convert them with transformers' save_pretrained)",
                )
            self._file_of = {}
            for f in files:
                with safe_open(str(f), framework="pt") as h:
                    self._file_of.update({k: f for k in h.keys()})  # noqa: SIM118
        self._handles: dict[Path, Any] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def _slice(self, name: str) -> Any:
        path = self._file_of[name]
        if path not in self._handles:
            if not path.is_file():
                raise ConfigError(_FIELD, str(path), f"the shard holding {name} is missing")
            self._handles[path] = safe_open(str(path), framework="pt")
        return self._handles[path].get_slice(name)

    def where(self, name: str) -> str:
        return f"{self._file_of[name].name}:{name}"

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def read(self, name: str, box: tuple[slice, ...]) -> torch.Tensor:
        return self._slice(name)[box]


@dataclass(frozen=True)
class _Box:
    """The part of a full tensor one rank holds: offset and size per dim."""

    offset: tuple[int, ...]
    size: tuple[int, ...]

    def slices(self, shift: tuple[int, ...] = ()) -> tuple[slice, ...]:
        shift = shift or (0,) * len(self.offset)
        return tuple(
            slice(s + o, s + o + n) for s, o, n in zip(shift, self.offset, self.size, strict=True)
        )

    def transposed(self) -> _Box:
        return _Box(self.offset[::-1], self.size[::-1])


@dataclass(frozen=True)
class _Source:
    """Where one of our parameters comes from in the HF file, and how to cut it out.

    `read(files, box)` returns the box of our (full) parameter; `hf_shape` is the full shape the
    HF tensor must have for this model config (checked before anything is read).
    """

    names: tuple[str, ...]
    hf_shape: tuple[int, ...]
    read: Callable[[SafetensorsDir, _Box], torch.Tensor]


def _direct(
    name: str,
    shape: tuple[int, ...],
    shift: tuple[int, ...] = (),
    hf_shape: tuple[int, ...] | None = None,
) -> _Source:
    return _Source((name,), hf_shape or shape, lambda f, b: f.read(name, b.slices(shift)))


def _transposed(
    name: str, shape: tuple[int, ...], col_shift: int = 0, hf_shape: tuple[int, ...] | None = None
) -> _Source:
    """GPT-2 Conv1D: stored (in, out), ours (out, in); `col_shift` picks q, k or v of c_attn."""
    return _Source(
        (name,),
        hf_shape or shape[::-1],
        lambda f, b: f.read(name, b.transposed().slices((0, col_shift))).t(),
    )


def _stacked(names: list[str], shape: tuple[int, ...]) -> _Source:
    """One HF tensor per expert, ours stacked on dim 0 (read only the experts this rank owns)."""

    def read(f: SafetensorsDir, b: _Box) -> torch.Tensor:
        inner = _Box(b.offset[1:], b.size[1:])
        return torch.stack(
            [f.read(names[e], inner.slices()) for e in range(b.offset[0], b.offset[0] + b.size[0])]
        )

    return _Source(tuple(names), shape[1:], read)


def _pick(files: SafetensorsDir, *names: str) -> str:
    """The first of `names` present in the files (HF spellings differ between versions)."""
    for n in names:
        if n in files:
            return n
    raise ConfigError(
        _FIELD,
        str(files.directory),
        f"tensor {names[0]} is missing from the safetensors files: the directory "
        "does not hold weights of this architecture",
    )


def _gathered(name: str, rows: torch.Tensor, shape: tuple[int, ...], hf_rows: int) -> _Source:
    """Our rows i are the checkpoint's rows `rows[i]` (DeepSeek: a permutation, or a block of
    a fused tensor): a box reads the span of the rows it needs, then picks them."""

    def read(f: SafetensorsDir, b: _Box) -> torch.Tensor:
        want = rows[b.offset[0] : b.offset[0] + b.size[0]]
        if want.numel() == 0:
            return torch.empty(b.size)
        lo, hi = int(want.min()), int(want.max()) + 1
        span = _Box((lo, *b.offset[1:]), (hi - lo, *b.size[1:]))
        return f.read(name, span.slices())[want - lo]

    return _Source((name,), (hf_rows, *shape[1:]), read)


def _deepseek_source(
    fqn: str, shape: tuple[int, ...], cfg: ModelConfig, files: SafetensorsDir, interleaved: bool
) -> _Source:
    from .hf_deepseek import SHARED, block_maps

    m = re.fullmatch(r"layers\.(\d+)\.(.+)", fqn)
    if m is None:
        raise ConfigError(_FIELD, fqn, "no Hugging Face source for this parameter")
    i, rest, pre = int(m[1]), m[2], f"model.layers.{m[1]}."
    for rm in block_maps(cfg, i, interleaved):
        if rest == rm.ours:
            return _gathered(_pick(files, pre + rm.hf), rm.rows, shape, rm.hf_rows)
    w = re.fullmatch(r"moe\.(shared_experts|experts)\.(w[123])", rest)
    if w is None:
        raise ConfigError(_FIELD, fqn, "no Hugging Face source for this parameter")
    name = dict(SHARED)[w[2]]
    if w[1] == "shared_experts":  # ours (1, fs, .), theirs (fs, .)
        src = _pick(files, f"{pre}mlp.shared_experts.{name}.weight")

        def read(f: SafetensorsDir, b: _Box) -> torch.Tensor:
            return f.read(src, _Box(b.offset[1:], b.size[1:]).slices()).unsqueeze(0)

        return _Source((src,), shape[1:], read)
    fused = pre + "mlp.experts.gate_up_proj"
    if fused in files:  # transformers 5: (E, 2f, h) gate rows then up rows; down (E, h, f)
        E, f = cfg.num_experts, cfg.ffn_dim
        if w[2] == "w2":
            return _direct(pre + "mlp.experts.down_proj", shape)
        return _direct(
            fused, shape, shift=(0, 0 if w[2] == "w1" else f, 0), hf_shape=(E, 2 * f, cfg.dim)
        )
    names = [_pick(files, f"{pre}mlp.experts.{e}.{name}.weight") for e in range(cfg.num_experts)]
    return _stacked(names, shape)


def _llama_source(
    fqn: str, shape: tuple[int, ...], cfg: ModelConfig, files: SafetensorsDir
) -> _Source:
    from .hf import _fused_map, _layer_map
    from .hf_families import expert_names

    if fqn == "tok_embeddings.weight":
        return _direct("model.embed_tokens.weight", shape)
    if fqn == "norm.weight":
        return _direct("model.norm.weight", shape)
    if fqn == "output.weight":
        return _direct(_pick(files, "lm_head.weight", "model.embed_tokens.weight"), shape)
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", fqn)
    if m is None:
        raise ConfigError(_FIELD, fqn, "no Hugging Face source for this parameter")
    rest, pre = m[2], f"model.layers.{m[1]}."
    for ours, hf in _layer_map(cfg):
        if rest == ours:
            if hf.startswith("block_sparse_moe.gate"):
                return _direct(_pick(files, pre + hf, pre + "mlp.gate.weight"), shape)
            return _direct(_pick(files, pre + hf), shape)
    for ours, hf, first, _ in _fused_map(cfg):  # Phi-3: rows of qkv_proj / gate_up_proj
        if rest == ours:
            rows = sum(n for _, name, _, n in _fused_map(cfg) if name == hf)
            return _direct(
                _pick(files, pre + hf), shape, shift=(first, 0), hf_shape=(rows, shape[1])
            )
    w = re.fullmatch(r"moe\.experts\.(w[123])", rest)
    if w is None:
        raise ConfigError(_FIELD, fqn, "no Hugging Face source for this parameter")
    fused = pre + "mlp.experts.gate_up_proj"
    if fused in files:  # transformers 5: (E, 2f, h) gate rows then up rows; down (E, h, f)
        E, f = cfg.num_experts, cfg.ffn_dim
        if w[1] == "w2":
            return _direct(pre + "mlp.experts.down_proj", shape)
        return _direct(
            fused, shape, shift=(0, 0 if w[1] == "w1" else f, 0), hf_shape=(E, 2 * f, cfg.dim)
        )
    kind = hf_model_type(cfg)  # Mixtral's or Qwen3-MoE's names of one Linear per expert
    return _stacked(
        [_pick(files, pre + expert_names(kind, e)[w[1]]) for e in range(cfg.num_experts)],
        shape,
    )


def _gpt2_source(
    fqn: str, shape: tuple[int, ...], cfg: ModelConfig, files: SafetensorsDir
) -> _Source:
    def name(n: str) -> str:  # saved with or without the `transformer.` prefix
        return _pick(files, "transformer." + n, n)

    top = {
        "tok_embeddings.weight": "wte.weight",
        "pos_embeddings.weight": "wpe.weight",
        "norm.weight": "ln_f.weight",
        "norm.bias": "ln_f.bias",
    }
    if fqn in top:
        return _direct(name(top[fqn]), shape)
    if fqn == "output.weight":
        head = "lm_head.weight" if "lm_head.weight" in files else name("wte.weight")
        return _direct(head, shape)
    m = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", fqn)
    if m is None:
        raise ConfigError(_FIELD, fqn, "no Hugging Face source for this parameter")
    h, mod, leaf = f"h.{m[1]}.", m[2], m[3]
    norms = {"attention_norm": "ln_1", "ffn_norm": "ln_2"}
    if mod in norms:
        return _direct(name(f"{h}{norms[mod]}.{leaf}"), shape)
    qkv = {"attention.wq": 0, "attention.wk": 1, "attention.wv": 2}
    if mod in qkv:
        shift, fused = qkv[mod] * cfg.dim, name(f"{h}attn.c_attn.{leaf}")
        if leaf == "bias":
            return _direct(fused, shape, shift=(shift,), hf_shape=(3 * cfg.dim,))
        return _transposed(fused, shape, col_shift=shift, hf_shape=(cfg.dim, 3 * cfg.dim))
    conv = {
        "attention.wo": "attn.c_proj",
        "feed_forward.w1": "mlp.c_fc",
        "feed_forward.w2": "mlp.c_proj",
    }
    if mod not in conv:
        raise ConfigError(_FIELD, fqn, "no Hugging Face source for this parameter")
    src = name(f"{h}{conv[mod]}.{leaf}")
    return _direct(src, shape) if leaf == "bias" else _transposed(src, shape)


def _local_box(param: torch.Tensor) -> _Box | None:
    """This rank's box of `param`'s full value, or None when it is not one box."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    shape = tuple(param.shape)
    if not isinstance(param, DTensor):
        return _Box((0,) * len(shape), shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if any(type(p) not in (Shard, Replicate) for p in param.placements):
        return None  # e.g. _StridedShard (FSDP over TP on one dim): not a contiguous box
    local, offset = compute_local_shape_and_global_offset(
        param.shape, param.device_mesh, param.placements
    )
    if tuple(local) != tuple(param.to_local().shape):
        return None
    return _Box(tuple(offset), tuple(local))


def _check_shape(src: _Source, files: SafetensorsDir) -> None:
    for n in src.names:
        got = files.shape(n)
        if got != src.hf_shape:
            raise ConfigError(
                _FIELD,
                files.where(n),
                f"has shape {list(got)} but the model config needs "
                f"{list(src.hf_shape)}: the weights do not belong to this "
                "config.json (or a model.* override changed a size)",
            )


@torch.no_grad()
def _fill(param: torch.Tensor, src: _Source, files: SafetensorsDir) -> None:
    box = _local_box(param)
    full_box = _Box((0,) * param.dim(), tuple(param.shape))
    value = src.read(files, box if box is not None else full_box)
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(param, DTensor):
        param.copy_(value.to(device=param.device, dtype=param.dtype))
        return
    local = param.to_local()
    if box is None:  # read the whole tensor and keep this rank's shard
        value = distribute_tensor(
            value.to(device=local.device, dtype=local.dtype),
            param.device_mesh,
            param.placements,
            src_data_rank=None,
        ).to_local()
    local.copy_(value.to(device=local.device, dtype=local.dtype))


def load_hf_weights(model: nn.Module, cfg: ModelConfig, directory: str | Path) -> int:
    """Overwrite every parameter of `model` (any layout; a pipeline rank's `stage<i>` modules
    included) with its part of the HF weights in `directory`; returns the number of parameters
    filled. Shapes are checked against the config before anything is copied. A frozen
    projection stored quantized (`lora.base_dtype`) reads its whole HF weight, quantizes it
    and keeps its rows (`models.init.store_full_weight`): the same stored values on any
    number of shards. LoRA's adapters are not in an HF model: they keep their initialization."""
    from scaletrain.config.hub import local_path

    files = SafetensorsDir(local_path(str(directory), _FIELD))  # (a hub id: its cached snapshot)
    source = _llama_source if cfg.family == "llama" else _gpt2_source
    if cfg.is_mla:  # DeepSeek: its own blocks, the rest as Llama's
        from .hf import _rope_interleaved

        interleaved = _rope_interleaved(Path(directory))

        def source(fqn, shape, cfg, files):  # type: ignore[no-redef]
            if fqn.startswith("layers."):
                return _deepseek_source(fqn, shape, cfg, files, interleaved)
            return _llama_source(fqn, shape, cfg, files)

    stored = {
        name: m for name, m in model.named_modules() if isinstance(m, FrozenLinear) and m.quantized
    }
    plan: list[tuple[torch.Tensor | FrozenLinear, _Source]] = []
    # the DeepSeek router's balancing bias is a buffer with a checkpoint source
    bias = [(n, b) for n, b in model.named_buffers() if n.endswith("moe.expert_bias")]
    for raw, param in [*model.named_parameters(), *bias]:
        if is_adapter(raw):
            continue  # LoRA's adapters keep their initialization (B = 0: the base model)
        owner, _, leaf = raw.rpartition(".")
        target: torch.Tensor | FrozenLinear = param
        if owner in stored:
            if leaf not in stored[owner].storage_names():
                pass  # the projection's bias: a plain parameter
            elif leaf == "weight":
                target = stored[owner]
            else:
                continue  # int8's scale: computed from the weight
        fqn = re.sub(r"^stage\d+\.", "", clean_fqn(raw))
        src = source(fqn, tuple(param.shape), cfg, files)
        _check_shape(src, files)
        plan.append((target, src))
    for target, src in plan:
        if isinstance(target, FrozenLinear):
            full = _Box((0, 0), (target.out_features, target.in_features))
            store_full_weight(target, src.read(files, full))
        else:
            _fill(target, src, files)
    return len(plan)


def load_initial_weights(run: Any) -> None:
    """`checkpoint.init_from` into the built run's model, unless a resume will restore it.

    Called once, right after `build_run`; a no-op without `init_from`.
    """
    ck = run.job.checkpoint
    if not ck.init_from:
        return
    if ck.resume != "never":
        from .dcp import latest_good

        if ck.resume != "auto" or latest_good(run.ckpt_dir, log=lambda _m: None) is not None:
            return  # scaletrain's own checkpoint wins over the initial weights
    n = load_hf_weights(run.model, run.job.model, ck.init_from)
    if run.is_main:
        print(f"init_from: {n} parameter tensors read from {ck.init_from}")
