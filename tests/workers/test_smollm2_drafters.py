"""SmolLM2's shipped drafters: found for the cached base, lossless with the real weights.

EAGLE (chain), EAGLE-2 (dynamic tree), Medusa and the hybrid's EAGLE branch draft over a
reduced vocabulary of the 8,192 most frequent tokens; greedy output must still equal plain
greedy output token for token, because the target verifies every draft over the full
vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from smollm2_prompts import chat_prompts

from workers.embedded.drafter_models import MedusaConfig, MedusaHeads, load_drafter, save_drafter
from workers.embedded.engine import BUNDLED_MODEL_DIR, Engine, SamplingParams
from workers.embedded.fetch_model import ensure_smollm2
from workers.models import SMOLLM2_MODEL_NAME, drafter_dir_for, weights_dir

NEW_TOKENS = 16
QUESTIONS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "What is the difference between a list and a tuple in Python?",
)


def test_drafters_are_found_for_the_cached_base_and_the_bundled_model(tmp_path: Path) -> None:
    assert drafter_dir_for(ensure_smollm2()) == weights_dir(SMOLLM2_MODEL_NAME)
    assert drafter_dir_for(BUNDLED_MODEL_DIR) == BUNDLED_MODEL_DIR
    assert drafter_dir_for(tmp_path / "some-other-model") is None


def test_draft_vocabulary_is_saved_exactly_and_masks_the_rest(tmp_path: Path) -> None:
    heads = MedusaHeads(MedusaConfig(hidden_size=8, num_heads=2, vocab_size=50, draft_vocab_size=5))
    assert heads.vocabulary is not None
    heads.vocabulary.draft_vocab.copy_(torch.tensor([3, 7, 11, 40, 49]))
    save_drafter(heads, "medusa", tmp_path)
    loaded = load_drafter(tmp_path, dtype=torch.float32)
    assert isinstance(loaded, MedusaHeads) and loaded.vocabulary is not None
    assert loaded.vocabulary.draft_vocab.tolist() == [3, 7, 11, 40, 49]
    logits = loaded.vocabulary(torch.randn(4, 8))  # (4, V)
    assert logits.shape == (4, 50)
    outside = torch.ones(50, dtype=torch.bool)
    outside[[3, 7, 11, 40, 49]] = False
    assert torch.isneginf(logits[:, outside]).all() and torch.isfinite(logits[:, ~outside]).all()


@pytest.fixture(scope="module")
def engine(smollm2_engine: Engine) -> Engine:
    return smollm2_engine


@pytest.fixture(scope="module")
def prompts(engine: Engine) -> list[list[int]]:
    return chat_prompts(engine, QUESTIONS)


def _greedy(engine: Engine, prompt: list[int], method: str) -> tuple[list[int], int]:
    gen = engine.start(prompt, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True), method)
    while not gen.finished:
        gen.step()
    return gen.output_ids, gen.stats.verify_steps


@pytest.fixture(scope="module")
def plain(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    return [_greedy(engine, p, "plain")[0] for p in prompts]


@pytest.mark.parametrize("method", ("eagle", "eagle2", "medusa", "hybrid"))
def test_greedy_output_equals_plain_greedy(engine: Engine, prompts: list[list[int]],
                                           plain: list[list[int]], method: str) -> None:
    assert method in engine.methods
    steps = 0
    for prompt, expected in zip(prompts, plain, strict=True):
        assert len(expected) == NEW_TOKENS
        output, verify_steps = _greedy(engine, prompt, method)
        assert output == expected, method
        steps += verify_steps
    assert steps < len(prompts) * (NEW_TOKENS - 1), f"{method} never accepted a draft token"


def test_the_shipped_eagle_chain_ends_by_its_measured_cutoff(engine: Engine, prompts: list[list[int]],
                                                             monkeypatch) -> None:
    """The shipped head carries its chain cutoff (`EagleConfig.chain_confidence`), which the
    greedy test above runs under; so chains at k 5 are often shorter than 5, and
    SPECROUTE_EAGLE_CHAIN_CONFIDENCE=0 restores chains of k tokens."""
    from workers.embedded.speculative.methods import chain_confidence, load_methods

    eagle = engine._methods["eagle"].new_drafter()  # type: ignore[attr-defined]
    head = eagle._eagle.head  # type: ignore[attr-defined]
    assert head.config.chain_confidence > 0
    assert eagle._min_confidence == head.config.chain_confidence  # type: ignore[attr-defined]
    monkeypatch.setenv("SPECROUTE_EAGLE_CHAIN_CONFIDENCE", "0")
    assert chain_confidence(head) == 0.0
    assert load_methods(ensure_smollm2(), engine.model)["eagle"].new_drafter()._min_confidence == 0.0  # type: ignore[attr-defined]
    monkeypatch.delenv("SPECROUTE_EAGLE_CHAIN_CONFIDENCE")
    gen = engine.start(prompts[1], SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True), "eagle", 5)
    while not gen.finished:
        gen.step()
    assert gen.stats.batch_draft_tokens < 5 * gen.stats.verify_steps
