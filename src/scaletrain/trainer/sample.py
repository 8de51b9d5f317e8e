"""Text sampling from a trained model (plain re-forward per token; small models, short samples)."""

from __future__ import annotations

import torch

__all__ = ["generate"]


@torch.no_grad()
def generate(model: torch.nn.Module, prompt: list[int], *, num_tokens: int, context: int,
             temperature: float = 0.8, top_k: int = 40, seed: int = 0,
             device: torch.device | str = "cpu", pad_multiple: int = 1) -> list[int]:
    """Autoregressively extend `prompt` by `num_tokens` ids (top-k, temperature sampling).

    Every rank must call this together when the model is sharded (FSDP/TP collectives run in
    forward); the seeded generator keeps the ranks' choices identical.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = list(prompt) or [0]
    was_training = model.training
    model.eval()
    for _ in range(num_tokens):
        window = ids[-context:]
        last = len(window) - 1
        window = window + [0] * (-len(window) % pad_multiple)
        x = torch.tensor([window], dtype=torch.long, device=device)
        logits = model(x)
        logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
        logits = logits[0, last].float().cpu() / max(temperature, 1e-5)
        if top_k:
            kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        ids.append(int(torch.multinomial(probs, 1, generator=gen).item()))
    model.train(was_training)
    return ids[len(prompt):] if prompt else ids[1:]
