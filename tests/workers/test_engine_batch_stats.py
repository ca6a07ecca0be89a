"""What each request reports of its batch (`GenerationStats.batch_*`): per decode step, the
sequences in the shared forward and the draft tokens they verified in all, prefill chunks
of other requests counted as sequences with no drafts, a request's own prefill not
counted. The schedule below makes every figure exact arithmetic."""

from __future__ import annotations

import pytest
from tiny_models import near_bigram_llama

from bench.training.drafters.bpe import train_tokenizer
from workers.embedded.engine import Engine, Generation, SamplingParams, StepOutput
from workers.embedded.speculative import Draft
from workers.embedded.speculative.draft import DecodeState
from workers.embedded.speculative.methods import EngineMethod, builtin_methods
from workers.embedded.tokenizer import TextTokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
K = 3


class FixedChain:
    """Always proposes a chain of k tokens (the root repeated): k drafts every step."""

    def propose(self, state: DecodeState) -> Draft:
        return Draft.chain([state.tokens[-1]] * state.k)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    texts = [f"the quick brown fox jumps over the lazy dog {i} times" for i in range(100)]
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(texts, 300).save(str(path))
    methods = {**builtin_methods(), "fixed": EngineMethod("fixed", FixedChain, K)}
    engine = Engine.from_model(near_bigram_llama(300, 192, 0.3), TextTokenizer(path),
                               methods=methods)
    engine.prefill_chunk = 4
    return engine


def _start(engine: Engine, prompt_len: int, method: str, limit: int) -> Generation:
    prompt = list(range(10, 10 + prompt_len))
    return engine.start(prompt, SamplingParams(max_new_tokens=limit, ignore_eos=True), method)


def _run(engine: Engine, gens: list[Generation], join_at: dict[int, int]) -> list[int]:
    """Step the active generations together (generation i joins at turn join_at[i]) until
    all finish; returns the batch size of every turn."""
    sizes = []
    for turn in range(500):
        active = [g for i, g in enumerate(gens) if join_at.get(i, 0) <= turn and not g.finished]
        if not active:
            return sizes
        sizes.append(len(active))
        assert all(isinstance(out, StepOutput) for out in engine.step(active))
    raise AssertionError("did not finish")


def test_batch_stats_count_each_decode_step_of_the_shared_forward(engine: Engine) -> None:
    # turn 0: a and b prefill (not counted); turns 1-3: c prefills in 4 + 4 + 2 token
    # chunks beside a's and b's decode steps (its last chunk gives its first token);
    # turn 4: a's 4th and last decode step, c's first; turn 5: b and c; then b alone.
    a = _start(engine, 3, "plain", 5)
    b = _start(engine, 3, "fixed", 20)
    c = _start(engine, 10, "plain", 3)
    sizes = _run(engine, [a, b, c], join_at={2: 1})
    assert sizes[:6] == [2, 3, 3, 3, 3, 2] and set(sizes[6:]) == {1}

    assert (a.stats.batch_steps, a.stats.batch_requests, a.stats.batch_draft_tokens) \
        == (4, 4 * 3, 4 * K)
    assert a.stats.mean_batch == 3.0 and a.stats.mean_batch_draft_tokens == float(K)
    assert (c.stats.batch_steps, c.stats.mean_batch, c.stats.mean_batch_draft_tokens) \
        == (2, (3 + 2) / 2, float(K))

    steps = b.stats.batch_steps
    assert steps == b.stats.verify_steps - 1 == len(sizes) - 1  # all but its prefill
    assert b.stats.batch_requests == 4 * 3 + 2 + (steps - 5)
    assert b.stats.batch_draft_tokens == b.stats.num_proposed_drafts  # a and c: plain
    assert b.stats.num_proposed_drafts <= K * steps  # pruned near its token limit


def test_plain_alone_and_first_token_only(engine: Engine) -> None:
    plain = _start(engine, 3, "plain", 4)
    _run(engine, [plain], {})
    assert (plain.stats.batch_steps, plain.stats.mean_batch,
            plain.stats.mean_batch_draft_tokens) == (3, 1.0, 0.0)
    one = _start(engine, 3, "fixed", 1)  # ends at its first token: no decode step
    _run(engine, [one], {})
    assert one.stats.batch_steps == 0 and one.stats.mean_batch is None
    assert one.stats.mean_batch_draft_tokens is None


def test_pruned_drafts_count_what_the_target_verified(engine: Engine) -> None:
    """Near max_new_tokens a draft is cut to the tokens still allowed: the count follows."""
    gen = _start(engine, 3, "fixed", 3)  # after the first token, 2 left: drafts <= 1 deep
    _run(engine, [gen], {})
    assert gen.stats.batch_draft_tokens == gen.stats.num_proposed_drafts
    assert gen.stats.batch_draft_tokens < K * gen.stats.batch_steps
