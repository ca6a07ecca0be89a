"""Lossless decoding on SmolLM2 itself: the drafter-free methods (n-gram prompt lookup,
lookahead) give plain greedy output token for token, for several k."""

from __future__ import annotations

import pytest
from smollm2_prompts import chat_prompts

from workers.embedded.engine import Engine, SamplingParams

NEW_TOKENS = 16
QUESTIONS = (
    "Write a Python function that returns the square of a number.",
    'Return a JSON object with the fields "city" and "country" for Paris.',
    "Repeat after me: the cat sat on the mat, the cat sat on the mat.",
)


@pytest.fixture(scope="module")
def engine(smollm2_engine: Engine) -> Engine:
    return smollm2_engine


@pytest.fixture(scope="module")
def prompts(engine: Engine) -> list[list[int]]:
    return chat_prompts(engine, QUESTIONS)


def _greedy(engine: Engine, prompt: list[int], method: str = "plain", k: int | None = None) -> list[int]:
    gen = engine.start(prompt, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True), method, k)
    while not gen.finished:
        gen.step()
    return gen.output_ids


@pytest.fixture(scope="module")
def plain(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    return [_greedy(engine, p) for p in prompts]


@pytest.mark.parametrize("method", ("ngram", "lookahead"))
@pytest.mark.parametrize("k", (None, 1, 4))
def test_greedy_output_equals_plain_greedy(engine: Engine, prompts: list[list[int]],
                                           plain: list[list[int]], method: str, k: int | None) -> None:
    for prompt, expected in zip(prompts, plain, strict=True):
        assert len(expected) == NEW_TOKENS
        assert _greedy(engine, prompt, method, k) == expected, (method, k)
