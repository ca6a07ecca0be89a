"""Seeded random Llama models small enough for unit tests of the engine and its drafters."""

from __future__ import annotations

from pathlib import Path

import torch

from workers.embedded.model import LlamaForCausalLM, ModelConfig, init_weights


def near_bigram_llama(vocab_size: int, max_positions: int = 192,
                      residual_scale: float = 0.3) -> LlamaForCausalLM:
    """A random 2-layer model (float32, seed 0) whose residual blocks are scaled down: a
    small `residual_scale` makes its next token nearly a function of the current one, so
    greedy output soon cycles (drafts get accepted) and drafters can learn it quickly."""
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    init_weights(model, std=0.3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(residual_scale)
    return model.eval()


def tiny_model_dir(out: Path, texts: list[str], vocab_size: int, context: int) -> Path:
    """A servable model folder: a BPE tokenizer trained on `texts` plus a random (seed 0)
    2-layer Llama with the default init, saved in the Hugging Face layout."""
    from workers.embedded.model import save_model
    from workers.embedded.training.bpe import train_tokenizer

    tok = train_tokenizer(texts, vocab_size=vocab_size)
    tok.save(str(out / "tokenizer.json"))
    config = ModelConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=context)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    init_weights(model)
    save_model(model, out)
    return out
