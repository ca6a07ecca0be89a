"""4-bit layers (`layers.int4_codes`): a checkpoint whose linears sit on a Q4_1 grid (the
served SmolLM2 GGUF) runs its decode and verify products on the codes themselves. The
codes reproduce the weights exactly, the products match float32 within bf16 rounding,
other weights (the LM head) are left alone, and speculative greedy output still equals plain greedy."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import near_bigram_llama

from workers.embedded.layers import INT4_GROUP, InferenceWeight, int4_codes, int4_linear
from workers.embedded.model import LlamaForCausalLM

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def q4_1(weight: torch.Tensor) -> torch.Tensor:
    """What llama.cpp's quantize_row_q4_1 then dequantization make of a weight: per block
    of 32, d = (max - min) / 15 and m = min in fp16, w = d * round((w - m) / d) + m."""
    n, c = weight.shape
    blocks = weight.reshape(n, c // 32, 32)
    low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    d = ((high - low) / 15).half().float()
    m = low.half().float()
    codes = ((blocks - m) / torch.where(d > 0, d, 1)).round().clamp(0, 15)
    return (codes * d + m).reshape(n, c)


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


def four_bit_model() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    reference = near_bigram_llama(300, 192, 0.3)
    with torch.no_grad():
        for layer in reference.model.layers:
            for linear in (*[getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")],
                           *[getattr(layer.mlp, n) for n in ("gate_proj", "up_proj", "down_proj")]):
                linear.weight.copy_(q4_1(linear.weight))
    return reference, copy.deepcopy(reference).fuse()


def test_codes_reproduce_a_q4_1_weight_and_refuse_others() -> None:
    torch.manual_seed(0)
    weight = q4_1(torch.randn(96, 4 * INT4_GROUP))
    codes = int4_codes(weight)
    assert codes is not None
    x = torch.randn(3, 4 * INT4_GROUP)
    expected = x @ weight.T
    assert relative_error(int4_linear(x, codes), expected) < 0.02  # bf16 scales and input
    assert int4_codes(torch.randn(96, 4 * INT4_GROUP)) is None  # not on a grid: no copy
    assert int4_codes(torch.randn(96, INT4_GROUP + 8)) is None  # rows not whole groups


def test_a_four_bit_weight_serves_every_row_count_through_its_codes() -> None:
    """One kind of product for any number of rows: a row's output does not depend on the
    rows beside it (decode alone, verify among drafts, batched with a prefill)."""
    torch.manual_seed(0)
    weight = q4_1(torch.randn(64, 2 * INT4_GROUP))
    copies = InferenceWeight(weight)
    assert copies.int4 is not None and copies.packed is None  # no float32 copy kept
    row = torch.randn(1, 2 * INT4_GROUP)
    alone = copies(row)
    for rows in (4, 64):
        x = torch.cat([row, torch.randn(rows - 1, 2 * INT4_GROUP)])
        assert copies.serves(rows)
        assert torch.equal(copies(x)[:1], alone)
        assert relative_error(copies(x), x @ weight.T) < 0.02


def test_four_bit_logits_match_float32_and_the_head_stays_float32() -> None:
    reference, fused = four_bit_model()
    assert fused.four_bit and fused.lm_inference is not None
    assert fused.lm_inference.int4 is None  # the head is not 4-bit: float32 logits
    tokens = torch.tensor([list(range(5, 25))])
    with torch.inference_mode():
        for rows in (1, 4):  # a decode step and a 4-token verify after a prefill
            ours, theirs = reference.new_cache(max_length=64), fused.new_cache(max_length=64)
            reference(tokens, cache=ours)  # prefill
            fused(tokens, cache=theirs)
            ours.commit()
            theirs.commit()
            step = torch.tensor([list(range(30, 30 + rows))])
            a, b = reference(step, cache=ours).logits, fused(step, cache=theirs).logits
            assert relative_error(b, a) < 0.05  # bf16 through two layers and the head
            assert (b.argmax(-1) == a.argmax(-1)).float().mean() >= 0.75


def test_packing_off_drops_only_the_heads_float32_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPECROUTE_PACKED_WEIGHTS=0 on a 4-bit model: the layers keep their codes, the head
    has no packed copy (113 MB on SmolLM2) and every head product reads the parameters."""
    monkeypatch.setenv("SPECROUTE_PACKED_WEIGHTS", "0")
    reference, fused = four_bit_model()
    assert fused.four_bit and fused.lm_inference is not None
    assert fused.lm_inference.packed is None and not fused.lm_inference.serves(4)
    hidden = torch.randn(4, reference.config.hidden_size)
    with torch.inference_mode():
        assert torch.equal(fused.logits(hidden), reference.lm_head(hidden))
