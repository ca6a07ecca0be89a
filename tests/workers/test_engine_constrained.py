"""Constrained decoding and logits processing with speculation on: a grammar, logit bias and
penalties shape the target's rows along the draft path, so every method's greedy output
equals constrained plain decoding and sampling follows the processed distribution;
logprobs are the target's."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch
from stats import assert_follows

from workers.embedded.api import Constraint
from workers.embedded.engine import Engine, EngineInputError, Generation, SamplingParams
from workers.embedded.speculative import Draft, Sampler
from workers.embedded.speculative.processors import Penalties
from workers.embedded.speculative.verify import accept

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
V = 30
TRIALS = 3000


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine()  # the bundled tiny model, with every drafter


@pytest.fixture(scope="module")
def prompt(engine: Engine) -> list[int]:
    return engine.tokenizer.encode_chat([{"role": "user", "content": "A person as JSON."}])


def _run(engine: Engine, prompt: list[int], method: str, **params) -> Generation:
    params.setdefault("stop_token_ids", list(engine.tokenizer.stop_ids))
    gen = engine.start(prompt, SamplingParams(**params), method)
    while not gen.finished:
        gen.step()
    return gen


def _valid(doc: dict) -> bool:
    return (set(doc) == {"name", "age", "tags"} and isinstance(doc["name"], str)
            and len(doc["name"]) <= 12 and isinstance(doc["age"], int)
            and 0 <= doc["age"] <= 120 and all(t in ("a", "b") for t in doc["tags"]))


def test_json_schema_greedy_is_identical_for_every_method(engine: Engine,
                                                          prompt: list[int]) -> None:
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    outputs = {}
    for method in engine.methods:
        gen = _run(engine, prompt, method, max_new_tokens=60, constraint=constraint)
        assert gen.finish_reason == "stop", method
        assert _valid(json.loads(engine.tokenizer.decode(gen.output_ids))), method
        outputs[method] = gen.output_ids
    assert {m: o == outputs["plain"] for m, o in outputs.items()} == \
        {m: True for m in engine.methods}


@pytest.mark.parametrize("method", ["eagle", "draft"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_chain_drafters_draft_under_the_grammar(engine: Engine, prompt: list[int],
                                                method: str, temperature: float) -> None:
    params = SamplingParams(max_new_tokens=40, temperature=temperature, seed=1,
                            stop_token_ids=list(engine.tokenizer.stop_ids),
                            constraint=Constraint("json_schema", json.dumps(SCHEMA)))
    gen = engine.start(prompt, params, method)
    gen.step()  # prefill and the first token
    grammar, state = gen._grammar, gen._state
    assert grammar is not None and state is not None
    before = grammar.matcher.validate_tokens(list(range(V)))  # the committed state's answer
    draft = gen._drafter.propose(state)
    assert len(draft) >= 2
    assert grammar.matcher.validate_tokens(draft.tokens) == len(draft.tokens)
    assert grammar.matcher.validate_tokens(list(range(V))) == before  # drafting was undone


@pytest.mark.parametrize("method", ["ngram", "eagle2", "draft"])
def test_json_schema_sampled_output_is_valid(engine: Engine, prompt: list[int],
                                             method: str) -> None:
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    for seed in range(3):
        gen = _run(engine, prompt, method, max_new_tokens=80, temperature=1.0, seed=seed,
                   constraint=constraint)
        assert gen.finish_reason == "stop"
        assert _valid(json.loads(engine.tokenizer.decode(gen.output_ids)))


def test_regex_and_ebnf(engine: Engine, prompt: list[int]) -> None:
    regex = r"(yes|no), [0-9]{2,4}"
    gen = _run(engine, prompt, "eagle", max_new_tokens=20, constraint=Constraint("regex", regex))
    assert re.fullmatch(regex, engine.tokenizer.decode(gen.output_ids))
    ebnf = 'root ::= "color: " ("red" | "green") "!"'
    gen = _run(engine, prompt, "medusa", max_new_tokens=20, constraint=Constraint("ebnf", ebnf))
    assert engine.tokenizer.decode(gen.output_ids) in ("color: red!", "color: green!")


@pytest.mark.parametrize("constraint", [Constraint("json_schema", "{not json"),
                                        Constraint("json_schema", '{"type": "nonsense"}'),
                                        Constraint("regex", "(unclosed"),
                                        Constraint("ebnf", "root ::= missing_rule")])
def test_a_bad_grammar_is_an_input_error(engine: Engine, prompt: list[int],
                                         constraint: Constraint) -> None:
    with pytest.raises(EngineInputError, match=constraint.kind):
        engine.validate(prompt, SamplingParams(constraint=constraint))


def test_penalties_and_bias_keep_methods_identical(engine: Engine, prompt: list[int]) -> None:
    first = engine.start(prompt, SamplingParams(max_new_tokens=1, top_logprobs=2)).step()
    runner_up = first.logprobs[0].top[1][0]  # type: ignore[index]
    plain = _run(engine, prompt, "plain", max_new_tokens=24, ignore_eos=True).output_ids
    params = dict(max_new_tokens=24, ignore_eos=True, frequency_penalty=2.0,
                  presence_penalty=2.0, logit_bias={runner_up: 1.0})
    shaped = {m: _run(engine, prompt, m, **params).output_ids for m in engine.methods}
    assert shaped["plain"][0] == runner_up and shaped["plain"] != plain
    assert all(out == shaped["plain"] for out in shaped.values())
    forced = _run(engine, prompt, "ngram", max_new_tokens=5, ignore_eos=True,
                  logit_bias={runner_up: 100.0})
    assert forced.output_ids == [runner_up] * 5


def test_penalties_count_generated_tokens() -> None:
    penalties = Penalties(0.5, 0.25, V, torch.device("cpu"))
    for token in (3, 3, 5):
        penalties.advance(token)
    shaped = penalties.apply(torch.zeros(V))
    assert shaped[3] == pytest.approx(-1.0) and shaped[5] == pytest.approx(-0.75)
    assert shaped[0] == 0.0


def test_logprobs_are_the_targets_for_every_method(engine: Engine, prompt: list[int]) -> None:
    def logprobs(method: str) -> list:
        gen = engine.start(prompt, SamplingParams(max_new_tokens=20, ignore_eos=True,
                                                  top_logprobs=3), method)
        out = []
        while not gen.finished:
            out += gen.step().logprobs or []
        assert [lp.token_id for lp in out] == gen.output_ids
        return out

    plain = logprobs("plain")
    assert all(lp.logprob == pytest.approx(lp.top[0][1]) for lp in plain)  # greedy: the best
    for method in ("ngram", "eagle2", "draft"):
        spec = logprobs(method)
        assert [lp.token_id for lp in spec] == [lp.token_id for lp in plain]
        for a, b in zip(spec, plain, strict=True):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]


# --- the rejection rule under a processor: rows differ along the path ---------------------


class NoRepeat:
    """A processor whose mask depends on the path: forbids `banned` and the last token."""

    def __init__(self, banned: set[int]) -> None:
        self.banned, self.last = set(banned), None

    def mask(self) -> torch.Tensor:
        allowed = torch.ones(V, dtype=torch.bool)
        for t in self.banned | ({self.last} if self.last is not None else set()):
            allowed[t] = False
        return allowed

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.masked_fill(~self.mask(), float("-inf"))

    def advance(self, token: int) -> None:
        self.last = token


def test_sampling_under_a_processor_follows_the_processed_rows() -> None:
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1)) * 1.5  # (3, V)
    banned = {int(logits[0].argmax()), 7}
    p0 = torch.softmax(NoRepeat(banned).apply(logits[0]), -1)
    given = int(p0.argmax())
    noise = torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(2)), -1)
    q = 0.5 * noise + 0.5 * torch.nn.functional.one_hot(torch.tensor(given), V)  # (V,)
    sampler = Sampler(1.0, generator=torch.Generator().manual_seed(0))
    firsts: Counter[int] = Counter()
    seconds: Counter[int] = Counter()  # the token after `given`
    for _ in range(TRIALS):
        xs = torch.multinomial(q, 2, replacement=True, generator=sampler.generator).tolist()
        draft = Draft.chain(xs, q=torch.stack([q, q]))
        path, bonus, rows = accept(draft, logits, sampler, NoRepeat(banned))
        committed = [draft.tokens[i] for i in path] + [bonus]
        assert rows.shape == (len(committed), V)
        firsts[committed[0]] += 1
        if committed[0] == given and len(committed) > 1:
            seconds[committed[1]] += 1
    assert all(firsts[t] == 0 for t in banned)
    assert_follows(firsts, p0)
    after = NoRepeat(banned)
    after.advance(given)
    assert sum(seconds.values()) > 300 and seconds[given] == 0
    assert_follows(seconds, torch.softmax(after.apply(logits[1]), -1))
