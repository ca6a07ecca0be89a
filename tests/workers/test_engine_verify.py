"""Shared verification: tree masks, KV compaction, and the rejection rule's distribution."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from workers.embedded.checkpoint import init_weights
from workers.embedded.model import LlamaForCausalLM, ModelConfig
from workers.embedded.speculative import AuxBranch, Draft, Sampler, verify
from workers.embedded.speculative.draft import attention_layout
from workers.embedded.speculative.verify import accept

V = 40  # vocabulary of the synthetic target distributions
TRIALS = 4000


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    m = LlamaForCausalLM(config)
    init_weights(m, std=0.3)
    return m.eval()


def test_tree_mask_each_node_sees_exactly_its_ancestors() -> None:
    parents = [-1, -1, 0, 0, 2]  # root -> {0, 1}; 0 -> {2, 3}; 2 -> {4}
    aux = AuxBranch([7, 8], [1, 2], torch.ones(2, 2, dtype=torch.bool).tril())
    mask, offsets = attention_layout(Draft([5, 6, 7, 8, 9], parents, aux=aux))
    assert mask is not None
    ancestors = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 4}, 5: {0, 1, 3, 5}}
    ancestors |= {6: {0, 6}, 7: {0, 6, 7}}  # aux rows: the root and earlier aux tokens
    for row, seen in ancestors.items():
        assert {c for c in range(8) if mask[row, c]} == seen, row
    assert offsets == [0, 1, 1, 2, 2, 3, 1, 2]


def test_chain_needs_no_mask_and_prune_keeps_ancestors() -> None:
    assert attention_layout(Draft.chain([4, 5, 6]))[0] is None
    pruned = Draft([5, 6, 7, 8, 9], [-1, -1, 0, 0, 2]).prune(max_nodes=4, max_depth=2)
    assert pruned.tokens == [5, 6, 7, 8] and pruned.parents == [-1, -1, 0, 0]
    assert Draft([5, 6, 7, 8, 9], [-1, -1, 0, 0, 2]).prune(9, 1).tokens == [5, 6]


def _fresh_logits(model: LlamaForCausalLM, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens])).logits[0]


@torch.inference_mode()
def test_rollback_then_redecode_matches_fresh_run(model: LlamaForCausalLM) -> None:
    prefix, extra = list(range(10, 30)), [40, 41, 42, 43, 44]
    cache = model.new_cache()
    model(torch.tensor([prefix]), cache)
    cache.commit()
    for t in [99, 98, 97]:  # a detour that must leave no trace
        model(torch.tensor([[t]]), cache)
        cache.commit()
    cache.rollback(len(prefix))
    logits = model(torch.tensor([extra]), cache).logits[0]
    torch.testing.assert_close(
        logits, _fresh_logits(model, prefix + extra)[len(prefix) :], atol=1e-4, rtol=1e-4
    )


@torch.inference_mode()
def test_keep_after_tree_verify_matches_fresh_run(model: LlamaForCausalLM) -> None:
    prefix, root = list(range(50, 70)), 7
    cache = model.new_cache()
    model(torch.tensor([prefix]), cache)
    cache.commit()
    g1, g2, g3 = _greedy(model, prefix + [root], 3)
    wrong = [(g + 1) % 300 for g in (g1, g2)]
    # root -> {wrong1, g1}; g1 -> {wrong2, g2}: the accepted path is nodes 1, 3 (not contiguous)
    draft = Draft([wrong[0], g1, wrong[1], g2], [-1, -1, 1, 1])
    result = verify(model, cache, root, draft, Sampler(0.0))
    assert result.accepted_nodes == [1, 3] and result.tokens == [g1, g2, g3]
    assert cache.length == len(prefix) + 3
    sequence = prefix + [root, g1, g2, g3]
    fresh = model(torch.tensor([sequence]))
    torch.testing.assert_close(
        result.hidden, fresh.hidden[0, len(prefix) : len(prefix) + 3], atol=1e-4, rtol=1e-4
    )
    after = model(torch.tensor([[g3, 11]]), cache).logits[0]
    torch.testing.assert_close(
        after, _fresh_logits(model, sequence + [11])[-2:], atol=1e-4, rtol=1e-4
    )


def _greedy(model: LlamaForCausalLM, tokens: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(_fresh_logits(model, tokens + out)[-1].argmax()))
    return out


# --- the rejection rule: the first committed token must follow p at the root ----------


def _target_logits(rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, V, generator=g) * 1.5  # (rows, V)


def _assert_follows(counts: Counter[int], p: torch.Tensor) -> None:
    """Chi-square goodness of fit, tokens with tiny expected counts pooled."""
    total = sum(counts.values())
    expected = p.double() / p.double().sum() * total
    big = [t for t in range(V) if expected[t] >= 20]
    observed = [counts[t] for t in big] + [total - sum(counts[t] for t in big)]
    wanted = [float(expected[t]) for t in big]
    wanted.append(total - sum(wanted))
    if wanted[-1] < 1:  # the pooled tail has (almost) no mass, e.g. cut by top-k
        assert observed.pop() == 0
        wanted.pop()
        wanted[-1] += total - sum(wanted)
    assert chisquare(observed, wanted).pvalue > 1e-3, (observed, wanted)


def _first_tokens(draft_for, logits: torch.Tensor, sampler_args: dict) -> Counter[int]:
    counts: Counter[int] = Counter()
    sampler = Sampler(**sampler_args, generator=torch.Generator().manual_seed(0))
    for _ in range(TRIALS):
        draft = draft_for(sampler.generator)
        path, bonus, _ = accept(draft, logits[: 1 + len(draft)], sampler)
        counts[draft.tokens[path[0]] if path else bonus] += 1
    return counts


SAMPLING = [dict(temperature=1.0), dict(temperature=0.8, top_k=12, top_p=0.9)]


@pytest.mark.parametrize("sampler_args", SAMPLING)
def test_point_mass_chain_keeps_target_distribution(sampler_args: dict) -> None:
    logits = _target_logits(3, seed=1)
    p = Sampler(**sampler_args).probs(logits)
    likely = int(p[0].argsort()[-2])  # a plausible but not certain draft token
    counts = _first_tokens(lambda g: Draft.chain([likely, 3]), logits, sampler_args)
    assert 0 < counts[likely] < TRIALS
    _assert_follows(counts, p[0])


def test_point_mass_chain_second_token_follows_its_row() -> None:
    logits = _target_logits(3, seed=2)
    sampler_args = dict(temperature=1.0)
    p = Sampler(**sampler_args).probs(logits)
    first = int(p[0].argmax())
    seconds: Counter[int] = Counter()
    sampler = Sampler(**sampler_args, generator=torch.Generator().manual_seed(0))
    for _ in range(TRIALS * 2):
        path, bonus, _ = accept(Draft.chain([first, 5]), logits, sampler)
        if path == [0]:
            seconds[bonus] += 1
        elif len(path) == 2:
            seconds[5] += 1
    assert sum(seconds.values()) > TRIALS // 2
    _assert_follows(seconds, p[1])


def test_general_q_chain_keeps_target_distribution() -> None:
    logits = _target_logits(2, seed=3)
    q = torch.softmax(_target_logits(1, seed=4)[0], -1)  # a drafter that disagrees with p

    def draft_for(g: torch.Generator) -> Draft:
        x = int(torch.multinomial(q, 1, generator=g))
        return Draft.chain([x], q=q[None])

    _assert_follows(
        _first_tokens(draft_for, logits, dict(temperature=1.0)), torch.softmax(logits[0], -1)
    )


def test_point_mass_tree_siblings_keep_target_distribution() -> None:
    logits = _target_logits(5, seed=5)
    p = torch.softmax(logits[0], -1)
    top = p.argsort(descending=True).tolist()
    draft = Draft([top[0], top[1], top[2], 9], [-1, -1, -1, 0])  # three siblings, one grandchild
    _assert_follows(_first_tokens(lambda g: draft, logits, dict(temperature=1.0)), p)


def test_iid_q_tree_siblings_keep_target_distribution() -> None:
    logits = _target_logits(3, seed=6)
    q = torch.softmax(_target_logits(1, seed=7)[0] + logits[0], -1)

    def draft_for(g: torch.Generator) -> Draft:
        xs = torch.multinomial(q, 2, replacement=True, generator=g).tolist()
        return Draft(xs, [-1, -1], q=torch.stack([q, q]))

    _assert_follows(
        _first_tokens(draft_for, logits, dict(temperature=1.0)), torch.softmax(logits[0], -1)
    )
