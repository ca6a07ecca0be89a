"""The hybrid drafter: n-gram where the context matches (by the threshold), EAGLE elsewhere;
the EAGLE head in step after n-gram steps; exact sampling on the n-gram branch; the
request's stats per branch. Lossless greedy and sampled output with the other weighted
drafters (test_engine_drafters)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from stats import assert_follows
from tiny_models import half_agreeing_drafters_dir, near_bigram_llama

from workers.embedded.checkpoint import load_model
from workers.embedded.drafter_models import EagleHead, load_drafter
from workers.embedded.engine import Engine, Generation, SamplingParams
from workers.embedded.model import LlamaForCausalLM
from workers.embedded.speculative import DecodeState, Sampler
from workers.embedded.speculative.eagle import EagleChainDrafter
from workers.embedded.speculative.hybrid import HybridConfig, HybridDrafter
from workers.embedded.speculative.methods import EngineMethod, builtin_methods
from workers.embedded.speculative.verify import accept
from workers.embedded.tokenizer import TextTokenizer

V = 300
PATTERN = [11, 23, 35, 47, 59, 71]  # six distinct tokens
FRESH = [101, 113, 127, 131, 149, 157, 163, 179, 191, 199]  # none of them in PATTERN

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return half_agreeing_drafters_dir(tmp_path_factory.mktemp("model"), V)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> LlamaForCausalLM:
    return load_model(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def head(model_dir: Path) -> EagleHead:
    head = load_drafter(model_dir / "eagle", dtype=torch.float32)
    assert isinstance(head, EagleHead)
    return head


def _state(model: LlamaForCausalLM, tokens: list[int], sampler: Sampler, k: int = 4,
           start: int = 0) -> DecodeState:
    """The state with root tokens[-1] whose last verify made positions [start, root) known."""
    hidden = model(torch.tensor([tokens[:-1]])).hidden[0]  # (root, C)
    return DecodeState(list(tokens), len(tokens) - 1, k, sampler, hidden[start:], start)


@torch.inference_mode()
def test_the_branch_follows_the_match_threshold(model: LlamaForCausalLM, head: EagleHead) -> None:
    """A text that repeats itself drafts its continuation by n-gram; one without a match
    drafts EAGLE's chain; a 2-token match drafts by n-gram only under a threshold of 2."""
    greedy = Sampler(0.0)
    hybrid = HybridDrafter(model, head)
    copied = hybrid.propose(_state(model, PATTERN * 2 + PATTERN[:3], greedy))
    assert copied.source == "ngram" and copied.tokens == PATTERN[3:] + PATTERN[:1]

    state = _state(model, FRESH, greedy)
    written = HybridDrafter(model, head).propose(state)
    assert written.source == "eagle" and len(written) > 0
    assert written.tokens == EagleChainDrafter(model, head).propose(state).tokens

    two = [*FRESH[:3], *PATTERN[:2], *FRESH[3:], *PATTERN[:2]]  # "..., 11, 23" seen once
    assert HybridDrafter(model, head, HybridConfig(min_match=3)).propose(
        _state(model, two, greedy)).source == "eagle"
    short = HybridDrafter(model, head, HybridConfig(min_match=2)).propose(
        _state(model, two, greedy))
    assert short.source == "ngram" and short.tokens == FRESH[3:7]


@torch.inference_mode()
def test_eagle_after_ngram_steps_drafts_as_a_fresh_head(model: LlamaForCausalLM,
                                                        head: EagleHead) -> None:
    """Two n-gram steps, then an EAGLE step: the head catches up on the features the
    n-gram steps made known and drafts what a fresh chain drafter does from the whole
    prefix (same tokens, same q)."""
    text = [*PATTERN, *PATTERN, *FRESH[:3]]
    roots = (len(PATTERN) + 2, len(PATTERN) + 4, len(text) - 1)  # n-gram, n-gram, EAGLE
    hybrid, start = HybridDrafter(model, head), 0
    sampler = Sampler(1.0, generator=torch.Generator())
    for root in roots:
        sampler.generator.manual_seed(5)
        draft = hybrid.propose(_state(model, text[: root + 1], sampler, start=start))
        start = root  # the next step's verify makes [root, next root) known
    assert draft.source == "eagle" and draft.q is not None
    fresh_sampler = Sampler(1.0, generator=torch.Generator().manual_seed(5))
    fresh = EagleChainDrafter(model, head).propose(_state(model, text, fresh_sampler))
    assert draft.tokens == fresh.tokens and fresh.q is not None
    torch.testing.assert_close(draft.q, fresh.q, atol=1e-4, rtol=1e-3)


@torch.inference_mode()
def test_the_token_after_an_ngram_draft_follows_the_target(model: LlamaForCausalLM,
                                                           head: EagleHead) -> None:
    """Sampling at T 0.8: the n-gram branch's point-mass draft is accepted or rejected so
    that the committed token has the target's distribution p."""
    sampler = Sampler(0.8, generator=torch.Generator().manual_seed(0))
    tokens = PATTERN * 2 + PATTERN[:3]
    root_logits = model(torch.tensor([tokens])).logits[0, -1]  # (V,)
    draft = HybridDrafter(model, head).propose(_state(model, tokens, sampler))
    assert draft.source == "ngram" and draft.q is None
    rows = root_logits.expand(1 + len(draft), -1)  # only the root row decides token 1
    counts: Counter[int] = Counter()
    for _ in range(1200):
        path, bonus, _ = accept(draft, rows, sampler)
        counts[draft.tokens[path[0]] if path else bonus] += 1
    assert_follows(counts, sampler.probs(root_logits))


def test_a_repeating_request_drafts_by_ngram_and_counts_each_branch(
    model_dir: Path, head: EagleHead
) -> None:
    """Through the engine: a prompt holding a nearly-bigram model's own greedy cycle goes on
    repeating, so the hybrid copies it by n-gram, accepted; every decode step is counted
    under its branch."""
    looping = near_bigram_llama(V, residual_scale=0.02)
    methods = builtin_methods()
    methods["hybrid"] = EngineMethod("hybrid", lambda: HybridDrafter(looping, head), 4)
    engine = Engine.from_model(looping, TextTokenizer(model_dir / "tokenizer.json"),
                               methods=methods)

    def run(prompt: list[int], method: str = "plain", k: int | None = None,
            tokens: int = 16) -> Generation:
        gen = engine.start(prompt, SamplingParams(max_new_tokens=tokens, ignore_eos=True),
                           method, k)
        while not gen.finished:
            gen.step()
        return gen

    prompt = [5, 6, 7, *run([5, 6, 7], tokens=80).output_ids]  # ends cycling "154 132"
    gen, plain = run(prompt, "hybrid", 4), run(prompt)
    assert gen.output_ids == plain.output_ids
    tallies, stats = gen.stats.by_source, gen.stats
    assert set(tallies) <= {"ngram", "eagle"} and tallies["ngram"].accepted > 8
    assert sum(t.steps for t in tallies.values()) == stats.verify_steps - 1
    assert sum(t.accepted for t in tallies.values()) == stats.num_correct_drafts
    assert sum(sum(t.proposed_at) for t in tallies.values()) == stats.num_proposed_drafts
    assert plain.stats.by_source == {}
    branches = stats.branches()  # what the worker reports (`specroute_drafts`, /metrics)
    assert set(branches) <= {"ngram", "eagle", "none"} and branches["none"]["accepted"] == 0
    assert sum(b["steps"] for b in branches.values()) == stats.verify_steps - 1
    assert branches["ngram"] == {"steps": tallies["ngram"].drafted,
                                 "accepted": tallies["ngram"].accepted}
    assert plain.stats.branches() == {}
