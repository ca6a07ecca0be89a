"""The engine end to end: every method reproduces plain greedy output, limits and stops hold."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import near_bigram_llama

from bench.training.drafters.bpe import train_tokenizer
from workers.embedded.engine import (
    BUNDLED_MODEL_DIR,
    Engine,
    EngineInputError,
    Generation,
    SamplingParams,
)
from workers.embedded.model import LlamaForCausalLM
from workers.embedded.tokenizer import TextTokenizer

METHODS = ("plain", "ngram", "lookahead")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _model(residual_scale: float) -> LlamaForCausalLM:
    """A seeded random model; a small residual_scale makes it nearly a bigram model, whose
    greedy output soon cycles (so drafts get accepted)."""
    return near_bigram_llama(300, 192, residual_scale)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    texts = [f"the quick brown fox jumps over the lazy dog {i} times" for i in range(200)]
    texts += [f"def f(x):\n    return x * {i}\n" for i in range(100)]
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(texts, 300).save(str(path))
    return TextTokenizer(path)


@pytest.fixture(scope="module")
def engine(tokenizer: TextTokenizer) -> Engine:
    return Engine.from_model(_model(0.3), tokenizer)


@pytest.fixture(scope="module")
def looping_engine(tokenizer: TextTokenizer) -> Engine:
    return Engine.from_model(_model(0.02), tokenizer)


def _run(gen: Generation) -> tuple[list[int], str]:
    ids: list[int] = []
    text = ""
    for _ in range(1000):
        out = gen.step()
        ids += out.token_ids
        text += out.text
        if out.finished:
            return ids, text
    raise AssertionError("generation did not finish")


def _greedy(
    engine: Engine, prompt: list[int], method: str = "plain", k: int | None = None, **params
) -> Generation:
    params.setdefault("ignore_eos", True)
    gen = engine.start(prompt, SamplingParams(**params), method, k)
    gen.ids, gen.text = _run(gen)  # type: ignore[attr-defined]
    return gen


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (1, 5, 17)]
    prompts += [
        torch.randint(3, 300, (6,), generator=g).tolist() * 4 for _ in range(2)
    ]  # repetitive
    return prompts


def _looping_prompt(engine: Engine) -> list[int]:
    """A prompt that already holds the model's greedy cycle, so it goes on repeating."""
    return [5, 6, 7] + _greedy(engine, [5, 6, 7], max_new_tokens=60).ids


@pytest.mark.parametrize("method", METHODS[1:])
def test_greedy_output_equals_plain_greedy(engine: Engine, method: str) -> None:
    for prompt in _prompts():
        plain = _greedy(engine, prompt, max_new_tokens=24).ids
        for k in (None, 1, engine.max_k):
            assert _greedy(engine, prompt, method, k, max_new_tokens=24).ids == plain, (prompt, k)


@pytest.mark.parametrize("method", METHODS[1:])
def test_drafts_are_accepted_on_a_repetitive_prompt(looping_engine: Engine, method: str) -> None:
    prompt = _looping_prompt(looping_engine)
    plain = _greedy(looping_engine, prompt, max_new_tokens=40)
    spec = _greedy(looping_engine, prompt, method, max_new_tokens=40)
    assert spec.ids == plain.ids and spec.text == plain.text
    assert plain.stats.accept_length == 1.0
    assert spec.stats.accept_length > 2.0 and spec.stats.num_correct_drafts > 0
    assert spec.stats.completion_tokens == 40 and spec.stats.verify_steps < 20


@pytest.mark.parametrize("method", METHODS)
def test_max_new_tokens_is_exact(looping_engine: Engine, method: str) -> None:
    prompt = _looping_prompt(looping_engine)
    for limit in (1, 2, 7):
        gen = _greedy(looping_engine, prompt, method, max_new_tokens=limit)
        assert len(gen.ids) == gen.stats.completion_tokens == limit
        assert gen.finish_reason == "length"


@pytest.mark.parametrize("method", METHODS)
def test_stop_token_and_eos_end_the_output(looping_engine: Engine, method: str) -> None:
    prompt = _looping_prompt(looping_engine)
    plain = _greedy(looping_engine, prompt, max_new_tokens=20).ids
    stop = plain[9]
    cut = plain.index(stop)
    gen = _greedy(looping_engine, prompt, method, max_new_tokens=20, stop_token_ids=[stop])
    assert gen.ids == plain[: cut + 1] and gen.finish_reason == "stop" and gen.matched_stop == stop
    assert gen.text == looping_engine.tokenizer.decode(plain[:cut])
    eos_engine = Engine.from_model(looping_engine.model, looping_engine.tokenizer)
    eos_engine.eos_token_id = stop
    assert (
        _greedy(eos_engine, prompt, method, max_new_tokens=20, ignore_eos=False).ids
        == plain[: cut + 1]
    )
    assert _greedy(eos_engine, prompt, method, max_new_tokens=20, ignore_eos=True).ids == plain


@pytest.mark.parametrize("method", METHODS)
def test_stop_string_is_cut_from_text(engine: Engine, method: str) -> None:
    prompt = _prompts()[3]
    plain = _greedy(engine, prompt, max_new_tokens=30)
    stop = plain.text[12:15]
    gen = _greedy(engine, prompt, method, max_new_tokens=30, stop=["zzzz", stop])
    assert gen.text == plain.text[: plain.text.index(stop)]
    assert gen.finish_reason == "stop" and gen.matched_stop == stop
    assert stop in engine.tokenizer.decode(gen.ids) and gen.ids == plain.ids[: len(gen.ids)]


@pytest.mark.parametrize("method", METHODS)
def test_seeded_sampling_is_reproducible(looping_engine: Engine, method: str) -> None:
    prompt = _looping_prompt(looping_engine)
    params = dict(max_new_tokens=30, temperature=0.9, top_p=0.95, top_k=50, ignore_eos=True)
    first = _run(looping_engine.start(prompt, SamplingParams(seed=7, **params), method))
    again = _run(looping_engine.start(prompt, SamplingParams(seed=7, **params), method))
    other = _run(looping_engine.start(prompt, SamplingParams(seed=8, **params), method))
    assert first == again and first != other and len(first[0]) == 30


def test_cancel_finishes_the_generation(engine: Engine) -> None:
    gen = engine.start([5, 6, 7], SamplingParams(max_new_tokens=50), "ngram")
    gen.step()
    gen.cancel()
    out = gen.step()
    assert gen.finished and out.finished and out.token_ids == []


@pytest.mark.parametrize(
    ("prompt", "params", "method", "k"),
    [
        ([], SamplingParams(), "plain", None),
        ([5] * 192, SamplingParams(), "plain", None),
        ([300], SamplingParams(), "plain", None),
        ([5], SamplingParams(), "medusa-typo", None),
        ([5], SamplingParams(), "ngram", -1),
        ([5], SamplingParams(), "ngram", 17),
        ([5], SamplingParams(), "plain", 3),
        ([5], SamplingParams(max_new_tokens=0), "plain", None),
        ([5], SamplingParams(temperature=-1), "plain", None),
        ([5], SamplingParams(top_p=0), "plain", None),
        ([5], SamplingParams(top_k=-1), "plain", None),
        ([5], SamplingParams(stop=[""]), "plain", None),
    ],
)
def test_bad_input_raises_engine_input_error(engine: Engine, prompt, params, method, k) -> None:
    with pytest.raises(EngineInputError):
        engine.start(prompt, params, method, k)


def test_validate_decides_method_and_k_once(engine: Engine) -> None:
    plain = engine.validate([5], SamplingParams(), "ngram", 0)  # k = 0: plain decoding
    assert (plain.method, plain.k) == ("plain", 0)
    ngram = engine.validate([5], SamplingParams(max_new_tokens=None), "ngram", None)
    assert (ngram.method, ngram.k) == ("ngram", engine.default_k["ngram"])
    assert ngram.max_new_tokens == engine.max_context - 1
    default = engine.default_k["ngram"]
    engine.set_default_k("ngram", 3)  # a worker's --num-speculative-tokens
    try:
        assert engine.validate([5], SamplingParams(), "ngram", None).k == 3
    finally:
        engine.set_default_k("ngram", default)


def test_context_limit_ends_with_length(engine: Engine) -> None:
    gen = _greedy(engine, [5] * 180, "ngram", max_new_tokens=100)
    assert gen.finish_reason == "length" and len(gen.ids) == 192 - 180


@pytest.mark.skipif(
    not (BUNDLED_MODEL_DIR / "model.safetensors").exists(), reason="bundled weights absent"
)
def test_bundled_model_greedy_methods_agree() -> None:
    engine = Engine(BUNDLED_MODEL_DIR, dtype=torch.float32)  # fp32: no bf16 near-ties
    assert {"plain", "ngram", "lookahead"} <= set(engine.methods)
    prompt = engine.tokenizer.encode(
        "def add(a, b):\n    return a + b\n\n" * 3 + "def add(a, b):\n"
    )
    plain = _greedy(engine, prompt, max_new_tokens=24)
    for method in ("ngram", "lookahead"):
        assert _greedy(engine, prompt, method, max_new_tokens=24).ids == plain.ids


def test_bundled_dir_is_inside_the_package() -> None:
    assert BUNDLED_MODEL_DIR.parts[-3:] == ("embedded", "weights", "specroute-tiny")
    assert isinstance(BUNDLED_MODEL_DIR, Path)


@pytest.mark.parametrize("packed", ["1", "0"])
@pytest.mark.parametrize("method", METHODS[1:])
def test_greedy_output_equals_plain_greedy_on_four_bit_layers(tokenizer: TextTokenizer,
                                                              method: str, packed: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Lossless on the 4-bit path too: plain and speculative steps share its products;
    with SPECROUTE_PACKED_WEIGHTS=0 the head's multi-row products run on the parameters."""
    from test_engine_int4 import four_bit_model

    monkeypatch.setenv("SPECROUTE_PACKED_WEIGHTS", packed)
    engine = Engine.from_model(four_bit_model()[1], tokenizer)
    assert engine.model.four_bit
    for prompt in _prompts():
        plain = _greedy(engine, prompt, max_new_tokens=24).ids
        for k in (1, engine.max_k):
            assert _greedy(engine, prompt, method, k, max_new_tokens=24).ids == plain, (prompt, k)
