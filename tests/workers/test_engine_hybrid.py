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
    short = HybridDrafter(model, head, HybridConfig(min_match=2, short_k=0)).propose(
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
    assert set(branches) <= {"ngram", "eagle", "plain", "none"}
    assert branches["none"]["accepted"] == branches["plain"]["accepted"] == 0
    assert sum(b["steps"] for b in branches.values()) == stats.verify_steps - 1
    assert branches["ngram"] == {"steps": tallies["ngram"].drafted,
                                 "accepted": tallies["ngram"].accepted}
    assert plain.stats.branches() == {}


@torch.inference_mode()
def test_after_a_copy_that_missed_eagle_drafts_for_the_backoff(model: LlamaForCausalLM,
                                                                head: EagleHead) -> None:
    """`miss_backoff` 2: an n-gram draft of which nothing was accepted sends the next two
    steps to EAGLE though the context still matches, the third copies again; a step
    proposed twice counts once; an accepted copy does not back off; 0 never does."""
    from workers.embedded.speculative.result import VerifyResult

    greedy = Sampler(0.0)
    text = PATTERN * 3 + PATTERN[:3]

    def verified(accepted: int) -> VerifyResult:
        return VerifyResult(accepted=PATTERN[3:3 + accepted], accepted_nodes=list(range(accepted)),
                            bonus=PATTERN[0], hidden=torch.zeros(accepted + 1, 1),
                            aux_logits=None, num_proposed=4, logits=torch.zeros(accepted + 1, V))

    def steps(config: HybridConfig, outcomes: list[int]) -> list[str | None]:
        """The branch of each step; before step i + 1, step i's draft kept outcomes[i]."""
        hybrid, out, last = HybridDrafter(model, head, config), [], None
        for i in range(len(outcomes) + 1):
            root = len(text) - len(outcomes) - 1 + i
            state = _state(model, text[: root + 1], greedy, start=root - 1 if i else 0)
            state.last = last
            out.append(hybrid.propose(state).source)
            if i == 1:  # the same step proposed again: the count does not move
                assert hybrid.propose(state).source == out[-1]
            if i < len(outcomes):
                last = verified(outcomes[i])
        return out

    assert steps(HybridConfig(miss_backoff=2), [0, 2, 2, 2]) == \
        ["ngram", "eagle", "eagle", "ngram", "ngram"]
    assert steps(HybridConfig(miss_backoff=2), [2, 2, 0, 2]) == \
        ["ngram", "ngram", "ngram", "eagle", "eagle"]
    assert steps(HybridConfig(miss_backoff=0), [0, 0, 0]) == ["ngram"] * 4
    with pytest.raises(ValueError):
        HybridConfig(miss_backoff=-1)
    # EAGLE below its bar: the back-off's steps go plain; without a back-off (the
    # default), the context's match copies at once
    below = dict(eagle_min_rate=1.0, fallback_k=2, sync_cost=0.0)
    assert steps(HybridConfig(**below, miss_backoff=2), [0, 2, 2]) == \
        ["ngram", "plain", "plain", "ngram"]
    assert HybridConfig().miss_backoff == 0
    assert steps(HybridConfig(**below), [0, 0, 2]) == ["ngram"] * 4


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_backing_off_stays_lossless(model_dir: Path, head: EagleHead,
                                    temperature: float) -> None:
    """Through the engine with `miss_backoff` 1 on a model that half agrees with its
    drafters: greedy output is plain's token for token; sampled output with the same seed
    is the same tokens as the shipped hybrid's where each step's draw is exact (the
    sampled distribution itself: test_engine_drafters)."""
    gen, plain = _hybrid_and_plain(model_dir, head, HybridConfig(min_match=1, miss_backoff=1),
                                   temperature)
    assert {"ngram", "eagle"} <= set(gen.stats.by_source)  # both branches drafted
    assert len(gen.output_ids) == 40
    if temperature == 0.0:
        assert gen.output_ids == plain


def _hybrid_and_plain(model_dir: Path, head: EagleHead, config: HybridConfig,
                      temperature: float) -> tuple[Generation, list[int]]:
    """Through the engine on a model that half agrees with its drafters, 40 tokens from a
    prompt that repeats in part: the hybrid's generation with `config`, and plain's
    tokens (same seed)."""
    model = load_model(model_dir, dtype=torch.float32).eval()
    methods = builtin_methods()
    methods["hybrid"] = EngineMethod("hybrid", lambda: HybridDrafter(model, head, config), 4)
    engine = Engine.from_model(model, TextTokenizer(model_dir / "tokenizer.json"),
                               methods=methods)
    prompt = [*PATTERN, *FRESH, *PATTERN, *FRESH[:4]]

    def run(method: str) -> Generation:
        gen = engine.start(prompt, SamplingParams(max_new_tokens=40, ignore_eos=True,
                                                  temperature=temperature, seed=3), method)
        while not gen.finished:
            gen.step()
        return gen

    return run("hybrid"), run("plain").output_ids


@torch.inference_mode()
def test_a_weak_match_drafts_short_k(model: LlamaForCausalLM, head: EagleHead) -> None:
    """`short_k` 2: a match of exactly `min_match` tokens copies at most 2 tokens; a longer
    match copies k."""
    greedy = Sampler(0.0)
    config = HybridConfig(min_match=2, short_k=2)
    two = [*FRESH[:3], *PATTERN[:2], *FRESH[3:], *PATTERN[:2]]  # "..., 11, 23" seen once
    short = HybridDrafter(model, head, config).propose(_state(model, two, greedy))
    assert short.source == "ngram" and short.tokens == FRESH[3:5]
    long = HybridDrafter(model, head, config).propose(
        _state(model, PATTERN * 2 + PATTERN[:3], greedy))
    assert long.source == "ngram" and long.tokens == PATTERN[3:] + PATTERN[:1]
    with pytest.raises(ValueError):
        HybridConfig(short_k=-1)


@torch.inference_mode()
def test_a_copy_drafts_long_only_after_a_copy_accepted_whole(model: LlamaForCausalLM,
                                                            head: EagleHead) -> None:
    """`copy_k` 2 at k 6: a copy drafts 2 tokens; after a copy accepted whole, the next
    drafts k; after one accepted in part (or an EAGLE step), 2 again. `eagle_k` 2 caps
    EAGLE's chain at 2 where it would draft more; 0 (the default) leaves both at k."""
    from workers.embedded.speculative.result import VerifyResult

    greedy = Sampler(0.0)
    text = PATTERN * 4 + PATTERN[:3]

    def lengths(config: HybridConfig, outcomes: list[tuple[int, int]]) -> list[int]:
        """Draft length of each step; before step i + 1, step i kept outcomes[i] =
        (accepted, proposed)."""
        hybrid, out, last = HybridDrafter(model, head, config), [], None
        for i in range(len(outcomes) + 1):
            root = len(text) - len(outcomes) - 1 + i
            state = _state(model, text[: root + 1], greedy, k=6, start=root - 1 if i else 0)
            state.last = last
            draft = hybrid.propose(state)
            assert draft.source == "ngram"
            out.append(len(draft))
            if i < len(outcomes):
                kept, proposed = outcomes[i]
                last = VerifyResult(accepted=[PATTERN[0]] * kept,
                                    accepted_nodes=list(range(kept)), bonus=PATTERN[0],
                                    hidden=torch.zeros(kept + 1, 1), aux_logits=None,
                                    num_proposed=proposed, logits=torch.zeros(kept + 1, V))
        return out

    assert lengths(HybridConfig(copy_k=2), [(2, 2), (6, 6), (3, 6), (0, 2)]) == [2, 6, 6, 2, 2]
    assert lengths(HybridConfig(), [(2, 6), (0, 6)]) == [6, 6, 6]
    state = _state(model, FRESH, greedy, k=6)
    chain = HybridDrafter(model, head, HybridConfig(min_confidence=0.0)).propose(state)
    capped = HybridDrafter(model, head, HybridConfig(min_confidence=0.0, eagle_k=2)).propose(
        _state(model, FRESH, greedy, k=6))
    assert chain.source == capped.source == "eagle"
    assert len(chain) == 6 and capped.tokens == chain.tokens[:2]
    with pytest.raises(ValueError):
        HybridConfig(copy_k=-1)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_long_copies_stay_lossless(model_dir: Path, head: EagleHead, temperature: float) -> None:
    """Through the engine with `copy_k` 1 and `eagle_k` 1 at k 4: greedy output is plain's
    token for token, sampled output runs its 40 tokens with both branches drafting."""
    gen, plain = _hybrid_and_plain(model_dir, head, HybridConfig(min_match=1, copy_k=1,
                                                                 eagle_k=1), temperature)
    assert {"ngram", "eagle"} <= set(gen.stats.by_source)
    assert len(gen.output_ids) == 40
    if temperature == 0.0:
        assert gen.output_ids == plain


@torch.inference_mode()
def test_eagle_drafts_only_while_its_acceptance_pays(model: LlamaForCausalLM,
                                                     head: EagleHead) -> None:
    """`eagle_min_rate` 0.5, `eagle_probe` 2, nothing to copy: EAGLE drafts first (a prior of
    one accepted in two); after a chain of 3 that kept nothing the steps go plain (empty
    drafts), one EAGLE step after 2 plain ones, then after 4; a probe that keeps all it
    drafts brings EAGLE back for good. Rate 0 is always EAGLE. (The shipped defaults:
    0.25, the measured cost of a drafted token over a plain step.)"""
    from workers.embedded.speculative.result import VerifyResult

    greedy = Sampler(0.0)
    text = list(range(101, 160))  # no token twice: nothing matches

    def verified(proposed: int, accepted: int) -> VerifyResult:
        return VerifyResult(accepted=text[:accepted], accepted_nodes=list(range(accepted)),
                            bonus=text[0], hidden=torch.zeros(accepted + 1, 1),
                            aux_logits=None, num_proposed=proposed,
                            logits=torch.zeros(accepted + 1, V))

    def steps(config: HybridConfig, outcomes: list[tuple[int, int]]) -> list[str | None]:
        """The branch of each step; step i's verify kept outcomes[i] = (proposed, accepted)."""
        hybrid, out, last = HybridDrafter(model, head, config), [], None
        for i in range(len(outcomes) + 1):
            root = 20 + i
            state = _state(model, text[: root + 1], greedy, start=root - 1 if i else 0)
            state.last = last
            draft = hybrid.propose(state)
            assert (draft.source == "plain") == (len(draft) == 0)
            out.append(draft.source)
            if i < len(outcomes):
                last = verified(*outcomes[i])
        return out

    gated = HybridConfig(eagle_min_rate=0.5, eagle_probe=2, sync_cost=0.0)
    miss, plain, hit = (3, 0), (0, 0), (3, 3)
    assert steps(gated, [miss, plain, plain, miss, *[plain] * 4]) == \
        ["eagle", "plain", "plain", "eagle", "plain", "plain", "plain", "plain", "eagle"]
    assert steps(gated, [miss, plain, plain, hit, hit]) == \
        ["eagle", "plain", "plain", "eagle", "eagle", "eagle"]
    assert steps(HybridConfig(eagle_min_rate=0.0, sync_cost=0.0), [miss] * 4) == ["eagle"] * 5
    with pytest.raises(ValueError):
        HybridConfig(eagle_min_rate=1.5)
    # the head's sync counts too: at 0.03 of a plain step a position the prompt's 20 cost
    # 0.6, so the prior (one accepted, 0.25 x 2 paid) no longer covers the first step; the
    # probe waits 2 steps (0.6 of a plain step to sync is less than one: no longer)
    synced = HybridConfig(eagle_min_rate=0.25, eagle_probe=2, sync_cost=0.03)
    assert steps(synced, [plain, plain, hit, hit]) == ["plain", "plain", "eagle", "eagle",
                                                      "eagle"]
    assert steps(HybridConfig(eagle_min_rate=0.25, sync_cost=0.005), [hit]) == \
        ["eagle", "eagle"]  # 20 positions at 0.005: 0.1, covered
    with pytest.raises(ValueError):
        HybridConfig(sync_cost=-1.0)


@torch.inference_mode()
def test_a_long_unread_input_waits_longer_for_the_probe(model: LlamaForCausalLM,
                                                        head: EagleHead) -> None:
    """Nothing to copy, a prompt of 59 positions at 0.05 of a plain step each (~3 plain
    steps to sync, one more position each step): no EAGLE first, and the probe once the
    plain steps reach 2 x the sync's cost (7 steps: 59 + 7 positions, 6.6), not after 2."""
    greedy = Sampler(0.0)
    text = list(range(101, 170))
    hybrid = HybridDrafter(model, head, HybridConfig(eagle_probe=2, sync_cost=0.05,
                                                     fallback_k=0))
    branches = []
    for i in range(9):  # the head reads nothing until EAGLE drafts: all stays unread
        root = 59 + i
        state = _state(model, text[: root + 1], greedy, start=root - 1 if i else 0)
        branches.append(hybrid.propose(state).source)
    assert branches == ["plain"] * 7 + ["eagle", "eagle"]


@torch.inference_mode()
@pytest.mark.parametrize(("max_new_tokens", "expected"),
                         [(7, ["plain"] * 9), (8, ["plain"] * 7 + ["eagle", "eagle"]),
                          (None, ["plain"] * 7 + ["eagle", "eagle"])])
def test_a_sync_that_the_tokens_left_cannot_repay_stays_plain(
        model: LlamaForCausalLM, head: EagleHead, max_new_tokens: int | None,
        expected: list[str]) -> None:
    """The probe of the test above syncs 66 positions (3.3 plain steps) at step 7. With
    `eagle_gain` 0.5, EAGLE could save at most half a plain step a token left: 6 tokens
    left (a budget of 7, one generated) cannot repay it and the step stays plain; 7 can;
    a request without a budget probes as before."""
    greedy = Sampler(0.0)
    text = list(range(101, 170))
    hybrid = HybridDrafter(model, head, HybridConfig(eagle_probe=2, sync_cost=0.05,
                                                     fallback_k=0, eagle_gain=0.5))
    branches = []
    for i in range(9):
        root = 59 + i
        state = _state(model, text[: root + 1], greedy, start=root - 1 if i else 0)
        state.prompt_len, state.max_new_tokens = root, max_new_tokens  # one token generated
        branches.append(hybrid.propose(state).source)
    assert branches == expected
    with pytest.raises(ValueError):
        HybridConfig(eagle_gain=1.5)


def test_the_engine_hands_the_drafter_its_budget(model_dir: Path, head: EagleHead) -> None:
    """Each state a drafter sees carries the request's `max_new_tokens`, and the tokens it
    has left count down with what was generated."""
    seen: list[tuple[int | None, int | None, int]] = []

    class Recording(HybridDrafter):
        def propose_steps(self, state: DecodeState):  # type: ignore[no-untyped-def]
            seen.append((state.max_new_tokens, state.tokens_left,
                         len(state.tokens) - state.prompt_len))
            return (yield from super().propose_steps(state))

    model = load_model(model_dir, dtype=torch.float32).eval()
    methods = builtin_methods()
    methods["hybrid"] = EngineMethod("hybrid", lambda: Recording(model, head), 4)
    engine = Engine.from_model(model, TextTokenizer(model_dir / "tokenizer.json"),
                               methods=methods)
    gen = engine.start([*PATTERN, *FRESH], SamplingParams(max_new_tokens=20, ignore_eos=True),
                       "hybrid")
    while not gen.finished:
        gen.step()
    assert len(gen.output_ids) == 20 and len(seen) >= 2
    assert all(budget == 20 and left == 20 - generated for budget, left, generated in seen)
    assert seen[0][1] == 19 and seen[-1][1] >= 1


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("config", [HybridConfig(eagle_min_rate=1.0, short_k=0, fallback_k=0),
                                    HybridConfig(eagle_min_rate=1.0, short_k=2, fallback_k=2)])
def test_plain_steps_stay_lossless_and_are_counted(model_dir: Path, head: EagleHead,
                                                   temperature: float,
                                                   config: HybridConfig) -> None:
    """Through the engine, an EAGLE bar no chain of the half-agreeing head clears: steps go
    plain (or, with `fallback_k`, copy a 1-token match), counted under the `plain` branch;
    greedy output is plain's token for token."""
    gen, plain = _hybrid_and_plain(model_dir, head, config, temperature)
    stats = gen.stats
    assert stats.by_source["plain"].steps > 0 and stats.by_source["plain"].drafted == 0
    branches = stats.branches()
    assert branches["plain"] == {"steps": stats.by_source["plain"].steps, "accepted": 0}
    assert sum(b["steps"] for b in branches.values()) == stats.verify_steps - 1
    assert len(gen.output_ids) == 40
    if temperature == 0.0:
        assert gen.output_ids == plain


@torch.inference_mode()
def test_the_token_of_a_plain_step_follows_the_target(model: LlamaForCausalLM,
                                                      head: EagleHead) -> None:
    """Sampling at T 0.8: a plain step (nothing to copy, EAGLE below its bar: here from the
    start, its prior of one in two under a bar of 1) commits one token drawn from the
    target's distribution p."""
    sampler = Sampler(0.8, generator=torch.Generator().manual_seed(0))
    tokens = list(range(101, 131))  # nothing matches
    hybrid = HybridDrafter(model, head, HybridConfig(eagle_min_rate=1.0))
    draft = hybrid.propose(_state(model, tokens, sampler))
    assert draft.source == "plain" and len(draft) == 0
    root_logits = model(torch.tensor([tokens])).logits[0, -1]  # (V,)
    counts: Counter[int] = Counter()
    for _ in range(1200):
        path, bonus, _ = accept(draft, root_logits.unsqueeze(0), sampler)
        assert path == []
        counts[bonus] += 1
    assert_follows(counts, sampler.probs(root_logits))


@torch.inference_mode()
def test_where_eagle_does_not_pay_a_one_token_match_drafts_fallback_k(
        model: LlamaForCausalLM, head: EagleHead) -> None:
    """EAGLE below its bar and no match of `min_match` 2: a 1-token match copies at most
    `fallback_k` tokens by n-gram; without `fallback_k`, or with nothing matching, the step
    is plain; with EAGLE paying, EAGLE drafts as before."""
    greedy = Sampler(0.0)
    text = [*range(101, 131), 105]  # only "105" occurred before, followed by 106, 107, ...
    state = _state(model, text, greedy)
    below = HybridConfig(eagle_min_rate=1.0, fallback_k=2)
    short = HybridDrafter(model, head, below).propose(state)
    assert short.source == "ngram" and short.tokens == [106, 107]
    assert HybridDrafter(model, head, HybridConfig(eagle_min_rate=1.0, fallback_k=0)).propose(
        state).source == "plain"
    assert HybridDrafter(model, head, below).propose(
        _state(model, text[:-1], greedy)).source == "plain"
    assert HybridDrafter(model, head, HybridConfig(fallback_k=2)).propose(
        state).source == "eagle"
