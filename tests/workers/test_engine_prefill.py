"""Chunked prefill: a long prompt is prefilled over several engine steps, each shared with
the other requests' decode steps; the output is the same as a one-forward prefill."""

from __future__ import annotations

import pytest
from smollm2_prompts import chat_prompts

from workers.embedded.engine import Engine, Generation, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TEXT = "def add(a, b):\n    return a + b\n\nThe quick brown fox jumps over the lazy dog. "
LONG = 700  # prompt tokens, of the bundled model's 1024


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine()  # the bundled tiny model (context 1024), every drafter


def _greedy(engine: Engine, prompt: list[int], method: str, chunk: int) -> list[int]:
    engine.prefill_chunk = chunk
    try:
        gen = engine.start(prompt, SamplingParams(max_new_tokens=12, ignore_eos=True), method)
        while not gen.finished:
            gen.step()
    finally:
        engine.prefill_chunk = 512
    return gen.output_ids


@pytest.mark.parametrize("method", ["plain", "medusa", "eagle2", "draft"])
def test_chunked_prefill_gives_the_same_tokens(engine: Engine, method: str) -> None:
    prompt = engine.tokenizer.encode(TEXT * 30)[:LONG]
    assert len(prompt) == LONG
    assert _greedy(engine, prompt, method, 64) == _greedy(engine, prompt, method, 1024)


def test_a_long_prefill_does_not_stall_a_running_decode(engine: Engine) -> None:
    engine.prefill_chunk = 64
    try:
        short = engine.start(engine.tokenizer.encode("def add"),
                             SamplingParams(max_new_tokens=40, ignore_eos=True))
        short.step()  # prefilled, decoding
        long = engine.start(engine.tokenizer.encode(TEXT * 30)[:LONG],
                            SamplingParams(max_new_tokens=4, ignore_eos=True))
        gens: list[Generation] = [short, long]
        steps_to_first_token = 0
        while not long.output_ids:
            outputs = engine.step(gens)
            assert not isinstance(outputs[0], Exception)
            steps_to_first_token += 1
    finally:
        engine.prefill_chunk = 512
    assert steps_to_first_token == -(-LONG // 64)  # one chunk per step
    assert len(short.output_ids) >= 1 + steps_to_first_token  # it decoded every step


def test_a_6000_token_prompt_answers_on_smollm2(smollm2_engine: Engine) -> None:
    question = "\n\nIn one word: which animal jumps over the dog?"
    story = "The quick brown fox jumps over the lazy dog near the river bank. " * 440
    prompt = chat_prompts(smollm2_engine, [story + question])[0]
    assert 5800 <= len(prompt) <= 6600
    gen = smollm2_engine.start(prompt, SamplingParams(max_new_tokens=3), "plain")
    steps = 0
    while not gen.finished:
        gen.step()
        steps += 1
    assert steps >= len(prompt) // smollm2_engine.prefill_chunk  # prefilled in chunks
    assert gen.output_ids and gen.finish_reason in ("stop", "length")
