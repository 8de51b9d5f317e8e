"""Tiny Hugging Face models for tests: built with `transformers`, trained a few steps so their
weights are not the initial ones, saved with `save_pretrained` (safetensors, optionally
sharded). No hub, no network."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 260  # >= the byte tokenizer's 256 ids


def _config(kind: str):
    import transformers as tf

    common = {"vocab_size": VOCAB}
    if kind == "gpt2":
        return tf.GPT2Config(
            n_positions=64,
            n_embd=32,
            n_layer=2,
            n_head=4,
            activation_function="gelu_new",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=True,
            bos_token_id=0,
            eos_token_id=0,
            **common,
        )
    llama = {
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rope_theta": 500.0,
        "tie_word_embeddings": False,
        **common,
    }
    if kind == "llama":
        return tf.LlamaConfig(**llama)
    if kind == "mixtral":
        return tf.MixtralConfig(
            num_local_experts=4,
            num_experts_per_tok=2,
            router_jitter_noise=0.0,
            **{**llama, "intermediate_size": 40},
        )
    if kind == "qwen2":  # q/k/v biases; a tied head as the small Qwen2.5 sizes
        return tf.Qwen2Config(**{**llama, "tie_word_embeddings": True})
    if kind == "qwen3":  # q/k norms; head_dim 16 != 32 / 4
        return tf.Qwen3Config(head_dim=16, **llama)
    if kind == "phi3":  # fused qkv_proj / gate_up_proj; a window shorter than the sequence
        return tf.Phi3Config(
            sliding_window=16, bos_token_id=1, eos_token_id=2, pad_token_id=2, **llama
        )
    if kind == "deepseek_v3":  # MLA, a dense first block, group-limited sigmoid routing
        return tf.DeepseekV3Config(
            hidden_size=32,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=8,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            n_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            num_nextn_predict_layers=0,
            max_position_embeddings=64,
            tie_word_embeddings=False,
            **common,
        )
    if kind == "qwen3_moe":  # 8 experts of width 24, top 3, renormalized; q/k norms
        return tf.Qwen3MoeConfig(
            head_dim=16,
            moe_intermediate_size=24,
            num_experts=8,
            num_experts_per_tok=3,
            norm_topk_prob=True,
            **llama,
        )
    if kind == "gemma2":  # local (window 16 < seq_len 32) / global layers, soft-caps, 1/sqrt(12)
        return tf.Gemma2Config(
            head_dim=16,
            query_pre_attn_scalar=12,
            sliding_window=16,
            attn_logit_softcapping=20.0,
            final_logit_softcapping=15.0,
            **{**llama, "tie_word_embeddings": True},
        )
    if kind == "gemma3_text":  # + (1 + w) q/k norms, the local layer's own RoPE base
        rope = {"rope_type": "default"}
        return tf.Gemma3TextConfig(
            head_dim=16,
            query_pre_attn_scalar=12,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "full_attention": {**rope, "rope_theta": 10000.0},
                "sliding_attention": {**rope, "rope_theta": 100.0},
            },
            **{
                **{k: v for k, v in llama.items() if k != "rope_theta"},
                "tie_word_embeddings": True,
            },
        )
    raise ValueError(kind)


def make_hf_model(
    kind: str, out_dir: Path, *, max_shard_size: str | None = None, train_steps: int = 3
) -> Path:
    """Build, train `train_steps` AdamW steps on random tokens, save to out_dir."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(
        _config(kind), dtype=torch.float32, attn_implementation="eager"
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(train_steps):
        tokens = torch.randint(0, VOCAB, (4, 24), generator=gen)
        model(tokens, labels=tokens).loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():  # DeepSeek's balancing bias (a buffer training leaves at 0)
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.05 * torch.randn(buf.shape, generator=gen))
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, safe_serialization=True, **kw)
    return out_dir


def hf_loss(model_dir: Path, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """transformers' mean next-token cross-entropy over equal-size (inputs, targets) batches,
    in float64 (the reference the fp32 run is held to)."""
    import transformers as tf

    # eager experts: the grouped-mm kernel has no float64
    model = tf.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    losses = []
    with torch.no_grad():
        for inputs, targets in batches:
            logits = model(inputs).logits
            losses.append(
                torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()
            )
    return sum(losses) / len(losses)


def first_step_batches(job) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The micro-batches the first optimizer step of `job` reads (whole global batch: the
    stream is the same whatever the layout)."""
    from scaletrain.data import build_data

    accum = job.batch.global_batch // job.batch.micro_batch
    with build_data(
        job.data,
        seq_len=job.batch.seq_len,
        micro_batch=job.batch.micro_batch,
        grad_accum=accum,
        seed=job.data.seed,
    ) as data:
        it = data.train_batches()
        return [next(it) for _ in range(accum)]


def make_tokenizer_dir(
    out_dir: Path,
    texts: list[str],
    *,
    vocab_size: int = 200,
    eos: str = "<|endoftext|>",
    add_bos: bool = False,
) -> Path:
    """A byte-level BPE `tokenizer.json` trained by `tokenizers` on `texts`, with a
    transformers-style `tokenizer_config.json` naming its specials (eos as an object, the
    spelling transformers also writes)."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", eos],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": {"content": eos}, "add_bos_token": add_bos})
    )
    return out_dir


def hf_args(tmp_path, model_dir, run, *extra, steps: int = 3) -> list[str]:
    """`scaletrain train` overrides for a short fp32 run initialized from `model_dir`."""
    return [
        f"--checkpoint.init_from={model_dir}",
        "--batch.seq_len=32",
        "--batch.global_batch=4",
        "--batch.micro_batch=2",
        f"--train.steps={steps}",
        "--train.eval_every=1000",
        "--train.sample_tokens=0",
        "--train.progress=false",
        "--train.tensorboard=false",
        "--data.num_tokens=60000",
        f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.run_dir={tmp_path / run}",
        "--optim.warmup_steps=0",
        "--guard.enabled=false",
        *extra,
    ]


def float64_model_from_hf(cfg, model_dir: Path) -> torch.nn.Module:
    """Our model of `cfg` in float64 with the Hugging Face weights in `model_dir` loaded by
    checkpoint.init_from's reader, in eval mode (the logits-parity tests' side)."""
    from scaletrain.checkpoint.hf_load import load_hf_weights
    from scaletrain.models import build_model

    torch.set_default_dtype(torch.float64)
    try:
        model = build_model(cfg, device="cpu", seed=3)
    finally:
        torch.set_default_dtype(torch.float32)
    load_hf_weights(model, cfg, model_dir)
    return model.eval()
