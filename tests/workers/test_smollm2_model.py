"""SmolLM2 from its GGUF: the Q/K row permutation is undone correctly (proved on random
weights against llama.cpp's interleaved RoPE), the config is the model's, and greedy
decoding of a known question gives the known answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.embedded.chat_template import apply_chat_template
from workers.embedded.checkpoint import load_config
from workers.embedded.engine import Engine, SamplingParams
from workers.embedded.fetch_model import ensure_smollm2
from workers.embedded.gguf_import import permute_qk, unpermute_qk
from workers.embedded.model import Attention, ModelConfig, rope_tables, signed


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return ensure_smollm2()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_unpermute_inverts_the_converter_permutation() -> None:
    w = torch.randn(9 * 64, 16)
    assert torch.equal(unpermute_qk(permute_qk(w, 9), 9), w)
    assert not torch.equal(permute_qk(w, 9), w)
    # per head, stored row 2i is original row i and row 2i+1 is original row i + hs/2
    stored = permute_qk(w, 9)
    assert torch.equal(stored[64 + 2 * 5], w[64 + 5]) and torch.equal(stored[64 + 11], w[64 + 32 + 5])


def _interleaved_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's "normal" RoPE: rotate the pairs (x0, x1), (x2, x3), ... x (B, h, T, hs)."""
    hs = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
    angle = positions[:, None].float() * inv_freq[None]  # (T, hs/2)
    cos, sin = angle.cos(), angle.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


@torch.no_grad()
def test_gguf_rows_with_interleaved_rope_equal_unpermuted_rows_with_rotate_half() -> None:
    """Attention as llama.cpp computes it from the GGUF's rows equals model.py's Attention
    (rotate-half RoPE) on the rows `unpermute_qk` gives back."""
    torch.manual_seed(0)
    config = ModelConfig(hidden_size=96, num_attention_heads=6, num_key_value_heads=2,
                         rope_theta=100000.0, max_position_embeddings=64)
    nh, nkv, hs = 6, 2, config.head_dim
    gguf_q, gguf_k = torch.randn(nh * hs, 96), torch.randn(nkv * hs, 96)
    v_w, o_w = torch.randn(nkv * hs, 96), torch.randn(96, nh * hs)
    x = torch.randn(2, 11, 96)
    positions = torch.arange(5, 16)  # not starting at 0: RoPE angles matter

    q = (x @ gguf_q.T).view(2, 11, nh, hs).transpose(1, 2)
    k = (x @ gguf_k.T).view(2, 11, nkv, hs).transpose(1, 2)
    v = (x @ v_w.T).view(2, 11, nkv, hs).transpose(1, 2)
    q, k = _interleaved_rope(q, positions, 100000.0), _interleaved_rope(k, positions, 100000.0)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = y.transpose(1, 2).reshape(2, 11, nh * hs) @ o_w.T

    attn = Attention(config)
    attn.q_proj.weight.copy_(unpermute_qk(gguf_q, nh))
    attn.k_proj.weight.copy_(unpermute_qk(gguf_k, nkv))
    attn.v_proj.weight.copy_(v_w)
    attn.o_proj.weight.copy_(o_w)
    cos, sin = rope_tables(config)
    sin = signed(sin)  # the table Attention reads (apply_rope)
    ours = attn(x, cos[positions][None, None], sin[positions][None, None], None, None, 0)
    torch.testing.assert_close(ours, expected, atol=1e-3, rtol=1e-4)

    attn.q_proj.weight.copy_(gguf_q)  # the rows as stored: rotate-half gets it wrong
    attn.k_proj.weight.copy_(gguf_k)
    wrong = attn(x, cos[positions][None, None], sin[positions][None, None], None, None, 0)
    assert (wrong - expected).abs().max() > 1.0


def test_config_is_smollm2(smollm2_dir: Path) -> None:
    c = load_config(smollm2_dir)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
            c.intermediate_size, c.vocab_size, c.head_dim) == (30, 576, 9, 3, 1536, 49152, 64)
    assert c.rope_theta == 100000.0 and c.rms_norm_eps == pytest.approx(1e-5)
    assert c.tie_word_embeddings and (c.bos_token_id, c.eos_token_id) == (1, 2)
    assert c.max_position_embeddings == 8192  # the trained context, served whole


def test_greedy_answer_is_fluent_and_correct(smollm2_dir: Path) -> None:
    engine = Engine(smollm2_dir, dtype=torch.float32)
    template = (smollm2_dir / "chat_template.jinja").read_text()
    text = apply_chat_template(template, [{"role": "user", "content": "What is the capital of France?"}])
    gen = engine.start(engine.tokenizer.encode(text), SamplingParams(max_new_tokens=24))
    pieces = []
    while not gen.finished:
        pieces.append(gen.step().text)
    answer = "".join(pieces)
    assert "Paris" in answer, answer
    assert gen.finish_reason == "stop" and gen.output_ids[-1] == 2  # <|im_end|> ends the turn
