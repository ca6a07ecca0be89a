"""Seeded random Llama models small enough for unit tests of the engine and its drafters."""

from __future__ import annotations

from pathlib import Path

import torch

from workers.embedded.checkpoint import init_weights
from workers.embedded.drafter_models import EagleConfig, EagleHead
from workers.embedded.model import LlamaForCausalLM, ModelConfig


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
    from bench.training.drafters.bpe import train_tokenizer
    from workers.embedded.checkpoint import save_model

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


def tiny_eagle_config() -> EagleConfig:
    """An EAGLE head the size of `near_bigram_llama`'s layers."""
    return EagleConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=192)


def half_agreeing_drafters_dir(folder: Path, vocab_size: int) -> Path:
    """A model folder: `near_bigram_llama` (float32), a BPE tokenizer, and drafters that
    half agree with it: random Medusa heads, a random EAGLE head with small outputs (a flat
    q that overlaps p), a noisy copy of the target as the draft model (q near p): drafts
    are accepted sometimes, rejected often."""
    from bench.training.drafters.bpe import train_tokenizer
    from workers.embedded.checkpoint import save_model
    from workers.embedded.drafter_models import MedusaConfig, MedusaHeads, save_drafter

    save_model(near_bigram_llama(vocab_size), folder, dtype=torch.float32)
    texts = [f"the quick brown fox jumps over the lazy dog {i} times" for i in range(200)]
    train_tokenizer(texts, vocab_size).save(str(folder / "tokenizer.json"))
    torch.manual_seed(1)
    medusa = MedusaHeads(MedusaConfig(hidden_size=64, num_heads=3))
    for block in medusa.modules():
        if isinstance(block, torch.nn.Linear):
            torch.nn.init.normal_(block.weight, std=0.3)
    save_drafter(medusa, "medusa", folder / "medusa")
    eagle = EagleHead(tiny_eagle_config())
    init_weights(eagle.layer, std=0.05)
    save_drafter(eagle, "eagle", folder / "eagle")
    draft = near_bigram_llama(vocab_size)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    save_model(draft, folder / "draft", dtype=torch.float32)
    return folder
