"""The inference layout of the model (oneDNN-packed copies of the fused q/k/v, gate/up and
other weights for multi-row products; the three-op RoPE; GQA attention without copies)
computes what the plain layout computes: the logits of a fused model equal those of an
unfused copy within float rounding, in decode, a tree verify and a ragged batch; training
still reaches every parameter."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import near_bigram_llama

from workers.embedded.layers import apply_rope, rope_tables, signed
from workers.embedded.model import LlamaForCausalLM, ModelConfig, SequenceInput

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}


def _pair() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    reference = near_bigram_llama(300, 192, 1.0).eval()
    fused = copy.deepcopy(reference).fuse()
    return reference, fused


def _logits(model: LlamaForCausalLM, items: list[tuple[list[int], int, torch.Tensor | None]],
            prompt: list[int]) -> list[torch.Tensor]:
    """Prefill `prompt` in one cache per item, then run each item's tokens (with its
    positions offset and tree mask) as one ragged batch; returns every item's logits."""
    caches = []
    with torch.inference_mode():
        for _ in items:
            cache = model.new_cache(max_length=128)
            model.forward_batch([SequenceInput(torch.tensor(prompt), cache)])
            cache.commit()
            caches.append(cache)
        inputs = [
            SequenceInput(torch.tensor(tokens), cache,
                          positions=None if mask is None else torch.arange(len(tokens)) + start,
                          tree_mask=mask)
            for (tokens, start, mask), cache in zip(items, caches, strict=True)
        ]
        return [out.logits for out in model.forward_batch(inputs)]


def test_fused_logits_equal_the_unfused_model() -> None:
    reference, fused = _pair()
    assert fused.model.layers[0].self_attn.inference is not None
    assert reference.model.layers[0].self_attn.inference is None
    assert not fused.four_bit  # a float32 model's weights are not on a 4-bit grid
    prompt = list(range(5, 45))
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    items = [([7], 40, None),  # a decode step
             ([7, 8, 9, 10], 40, tree),  # a draft tree: root, two siblings, a grandchild
             ([3, 4, 5], 40, None)]  # a chain
    for single in ([items[0]], [items[1]], items):
        for ours, theirs in zip(_logits(fused, single, prompt), _logits(reference, single, prompt),
                                strict=True):
            torch.testing.assert_close(ours, theirs, **TOLERANCE)
            assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_fuse_leaves_the_parameters_alone() -> None:
    """The packed copies are extra: parameters (the checkpoint's tensors) and the state
    dict are unchanged, so one-row forwards and training read what they read before."""
    reference, fused = _pair()
    assert fused.model.layers[1].self_attn.inference is not None
    assert fused.model.layers[1].mlp.inference is not None and fused.lm_inference is not None
    assert set(fused.state_dict()) == set(reference.state_dict())
    for name, tensor in reference.state_dict().items():
        assert torch.equal(fused.state_dict()[name], tensor), name


def test_training_uses_the_parameters_not_the_fused_copy() -> None:
    _, fused = _pair()
    tokens = torch.tensor([[5, 6, 7, 8]])
    fused.train()
    fused.forward(tokens).logits.sum().backward()
    layer = fused.model.layers[0]
    for p in (layer.self_attn.q_proj.weight, layer.self_attn.v_proj.weight,
              layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_rope_matches_rotate_half() -> None:
    """The roll-with-signed-sine RoPE equals the Hugging Face rotate-half formula."""
    config = ModelConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    cos, sin = rope_tables(config)
    positions = torch.tensor([0, 3, 17, 200])
    x = torch.randn(2, 4, 4, 16)  # (B, T, h, hs)
    c, s = cos[positions][None, :, None], sin[positions][None, :, None]
    half = x.shape[-1] // 2
    expected = x * c + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * s
    torch.testing.assert_close(apply_rope(x, c, signed(s)), expected)


def test_packing_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPECROUTE_PACKED_WEIGHTS=0: no private copies, the plain layout's results."""
    monkeypatch.setenv("SPECROUTE_PACKED_WEIGHTS", "0")
    reference, fused = _pair()
    assert fused.lm_inference is not None and fused.lm_inference.packed is None
    assert not fused.lm_inference.serves(3)
    items = [([7, 8, 9], 40, None)]
    torch.testing.assert_close(_logits(fused, items, list(range(5, 45)))[0],
                               _logits(reference, items, list(range(5, 45)))[0], atol=0, rtol=0)
