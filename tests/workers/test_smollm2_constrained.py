"""Constrained decoding on SmolLM2 itself: a JSON schema answer validates, and speculation
under the grammar (n-gram, EAGLE-2) gives constrained plain decoding's tokens."""

from __future__ import annotations

import json

import pytest
from smollm2_prompts import chat_prompts

from workers.embedded.api import Constraint
from workers.embedded.engine import Engine, SamplingParams

SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 20},
                         "country": {"type": "string", "maxLength": 20},
                         "population_millions": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["city", "country", "population_millions"],
          "additionalProperties": False}


def _constrained(engine: Engine, prompt: list[int], method: str) -> list[int]:
    params = SamplingParams(max_new_tokens=48, stop_token_ids=list(engine.tokenizer.stop_ids),
                            constraint=Constraint("json_schema", json.dumps(SCHEMA)))
    gen = engine.start(prompt, params, method)
    while not gen.finished:
        gen.step()
    assert gen.finish_reason == "stop", engine.tokenizer.decode(gen.output_ids)
    return gen.output_ids


@pytest.mark.parametrize("method", ["ngram", "eagle2"])
def test_json_schema_on_smollm2_is_valid_and_lossless(smollm2_engine: Engine,
                                                      method: str) -> None:
    prompt = chat_prompts(smollm2_engine, ["Describe Paris as JSON: city, country and "
                                           "population in millions."])[0]
    plain = _constrained(smollm2_engine, prompt, "plain")
    doc = json.loads(smollm2_engine.tokenizer.decode(plain))
    assert set(doc) == {"city", "country", "population_millions"}
    assert 0 <= doc["population_millions"] <= 99
    assert _constrained(smollm2_engine, prompt, method) == plain
