"""Text sampling from a trained model (plain re-forward per token; small models, short samples)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

from scaletrain.data.tokenizer import Tokenizer
from scaletrain.dtensor import to_full

if TYPE_CHECKING:
    from .build import Run

__all__ = ["generate", "layout_logits_fn", "prompt_ids"]


LogitsFn = Callable[[torch.Tensor], torch.Tensor]
"""(1, T) token ids -> (1, T, V) logits of every position (full, not sharded)."""


def _plain_logits(model: torch.nn.Module, pad_multiple: int) -> LogitsFn:
    def fn(x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        x = F.pad(x, (0, -t % pad_multiple))  # TP/SP splits the sequence: a whole multiple
        logits = model(x)
        logits = to_full(logits)
        return logits[:, :t]

    return fn


def prompt_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """The ids of `text`, or, where the tokenizer cannot encode all of it, of the characters it
    can: a char-level vocabulary holds only its own corpus's characters (an all-lowercase
    corpus has no 'T'), and a finished run must not fail at its sample. Empty when none is
    encodable (`generate` then starts from id 0)."""
    try:
        return tokenizer.encode(text)
    except ValueError:
        out: list[int] = []
        for ch in text:
            try:
                out += tokenizer.encode(ch)
            except ValueError:
                continue
        return out


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt: list[int],
    *,
    num_tokens: int,
    context: int,
    temperature: float = 0.8,
    top_k: int = 40,
    seed: int = 0,
    device: torch.device | str = "cpu",
    pad_multiple: int = 1,
    logits_fn: LogitsFn | None = None,
    vocab: int | None = None,
) -> list[int]:
    """Autoregressively extend `prompt` by `num_tokens` ids (top-k, temperature sampling).

    `vocab`: sample only ids below it, the ones the tokenizer can decode (a model's head may
    have more rows: padded for tensor parallelism or to a round size, as nanoGPT's 65
    characters over 128 rows; an undertrained model gives those rows probability).

    Every rank must call this together when the model is sharded (FSDP/TP collectives run in
    forward); the seeded generator keeps the ranks' choices identical. `logits_fn` replaces
    the plain forward where the layout needs another (`layout_logits_fn`: context or pipeline
    parallelism).
    """
    fn = logits_fn or _plain_logits(model, pad_multiple)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = list(prompt) or [0]
    was_training = model.training
    model.eval()
    for _ in range(num_tokens):
        window = ids[-context:]
        x = torch.tensor([window], dtype=torch.long, device=device)
        logits = fn(x)[0, len(window) - 1, :vocab].float().cpu() / max(temperature, 1e-5)
        if top_k:
            kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        ids.append(int(torch.multinomial(probs, 1, generator=gen).item()))
    model.train(was_training)
    return ids[len(prompt) :] if prompt else ids[1:]


def layout_logits_fn(run: Run) -> LogitsFn | None:
    """The sampling forward of a context- or pipeline-parallel run (None: the plain one).

    Both run the training shapes: the window is right-padded to `batch.seq_len` (a causal
    model's logits at a position do not see the padding after it). Context parallel: each rank
    forwards its load-balanced chunks at their global positions and the logits are gathered
    over the cp group (`cp_unshard`). Pipeline: the window fills every micro-batch of one
    forward-only schedule run (the stages' buffers are sized for them) and the last stage's
    logits of one copy are broadcast to the pipeline ranks.
    """
    seq_len = run.job.batch.seq_len
    if run.pipeline is not None:
        pipe, batch = run.pipeline, run.job.batch.micro_batch * run.grad_accum

        def pp_fn(x: torch.Tensor) -> torch.Tensor:
            t = x.shape[1]
            full = F.pad(x, (0, seq_len - t)).expand(batch, seq_len).contiguous()
            return pipe.eval_logits(full)[:, :t]

        return pp_fn
    if run.dims.cp > 1:
        from scaletrain.parallel.context_parallel import cp_unshard

        from .step import cp_model_inputs, document_sep_id

        size = run.dims.cp
        group = run.dims.submesh("cp").get_group()

        def cp_fn(x: torch.Tensor) -> torch.Tensor:
            t = x.shape[1]
            full = F.pad(x, (0, seq_len - t))
            shard, model_kw = cp_model_inputs(full, run.dims.cp_rank, size, document_sep_id(run))
            logits = run.model(shard, **model_kw)
            logits = to_full(logits)
            shards = [torch.empty_like(logits) for _ in range(size)]
            dist.all_gather(shards, logits.contiguous(), group=group)
            return cp_unshard(shards)[:, :t]

        return cp_fn
    return None
