"""The gateway and the embedded worker draw the same lines (policies/request_limits.py):
what one admits at the edge of a limit the other accepts, and one past it both refuse."""

from __future__ import annotations

import pytest
from tiny_models import near_bigram_llama

from bench.training.drafters.bpe import train_tokenizer
from gateway.classifier.classify import classify
from gateway.errors import InvalidRequest
from gateway.pins import parse_pinned_k
from gateway.schemas import parse_request
from policies.request_limits import COMPLETIONS_DEFAULT_MAX_TOKENS, GRAMMAR_FIELDS, MAX_K, MAX_N
from policies.types import PoolView
from workers.embedded import parsing
from workers.embedded.engine import Engine, EngineInputError
from workers.embedded.errors import BadRequest
from workers.embedded.tokenizer import TextTokenizer

COMPLETION = {"model": "m", "prompt": "x"}


def test_n_up_to_max_n_on_both_sides():
    assert parse_request({**COMPLETION, "n": MAX_N}, "completions").n == MAX_N
    assert parsing.parse_completion({**COMPLETION, "n": MAX_N}).n == MAX_N
    with pytest.raises(InvalidRequest) as refused:
        parse_request({**COMPLETION, "n": MAX_N + 1}, "completions")
    assert refused.value.param == "n"
    with pytest.raises(BadRequest, match=f"1..{MAX_N}"):
        parsing.parse_completion({**COMPLETION, "n": MAX_N + 1})


def test_a_completion_without_max_tokens_gets_the_same_default_on_both_sides():
    assert classify(parse_request(COMPLETION, "completions")).max_tokens \
        == COMPLETIONS_DEFAULT_MAX_TOKENS
    assert parsing.parse_completion(COMPLETION).sampling.max_new_tokens \
        == COMPLETIONS_DEFAULT_MAX_TOKENS


@pytest.mark.parametrize("field", GRAMMAR_FIELDS)
def test_each_grammar_field_is_passed_on_and_two_are_refused_on_both_sides(field):
    one = {**COMPLETION, field: "x"}
    assert parse_request(one, "completions").body[field] == "x"
    assert parsing.parse_completion(one).sampling.constraint.kind == field
    other = next(f for f in GRAMMAR_FIELDS if f != field)
    with pytest.raises(InvalidRequest):
        parse_request({**one, other: "y"}, "completions")
    with pytest.raises(BadRequest):
        parsing.parse_completion({**one, other: "y"})


@pytest.mark.usefixtures("one_torch_thread")
def test_k_up_to_max_k_for_the_header_the_policy_and_the_engine(tmp_path):
    assert parse_pinned_k(str(MAX_K)) == MAX_K
    with pytest.raises(InvalidRequest):
        parse_pinned_k(str(MAX_K + 1))
    assert PoolView("p", "embedded", "ngram", 4, True, 1, 0).max_k == MAX_K
    path = tmp_path / "tokenizer.json"
    train_tokenizer([f"the quick brown fox {i}" for i in range(50)], 300).save(str(path))
    engine = Engine.from_model(near_bigram_llama(300, 64, 0.3), TextTokenizer(path))
    engine.set_default_k("ngram", MAX_K)
    with pytest.raises(EngineInputError):
        engine.set_default_k("ngram", MAX_K + 1)
