"""The weighted drafters (medusa, eagle, eagle2, hybrid, draft): lossless greedy and sampled output,
EAGLE-2's tree visibility, drafter caches in step after rollback, near-full acceptance when
the drafter is exact."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from stats import assert_follows
from tiny_models import half_agreeing_drafters_dir, tiny_eagle_config

from workers.embedded.checkpoint import init_weights, load_model
from workers.embedded.drafter_models import (
    EagleHead,
    load_drafter,
)
from workers.embedded.engine import BUNDLED_MODEL_DIR, Engine, Generation, SamplingParams
from workers.embedded.model import LlamaForCausalLM
from workers.embedded.speculative import DecodeState, Draft, Drafter, Sampler, verify
from workers.embedded.speculative.eagle import EagleSync, HeadCall, answer
from workers.embedded.speculative.eagle2 import EagleTreeConfig, EagleTreeDrafter
from workers.embedded.speculative.medusa import best_paths
from workers.embedded.speculative.methods import load_methods
from workers.embedded.speculative.verify import accept

METHODS = ("medusa", "eagle", "eagle2", "hybrid", "draft")
V = 300
TRIALS = 1200


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return half_agreeing_drafters_dir(tmp_path_factory.mktemp("model"), V)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return Engine(model_dir, dtype=torch.float32)


def _run(
    engine: Engine, prompt: list[int], method: str = "plain", k: int | None = None, **params
) -> Generation:
    params.setdefault("ignore_eos", True)
    gen = engine.start(prompt, SamplingParams(**params), method, k)
    ids: list[int] = []
    for _ in range(500):
        ids += gen.step().token_ids
        if gen.finished:
            gen.ids = ids  # type: ignore[attr-defined]
            return gen
    raise AssertionError("generation did not finish")


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, V, (n,), generator=g).tolist() for n in (1, 6, 19)]
    return prompts + [torch.randint(3, V, (5,), generator=g).tolist() * 4]


def test_methods_appear_only_with_their_weights(model_dir: Path, tmp_path: Path) -> None:
    model = load_model(model_dir, dtype=torch.float32)
    assert set(METHODS) <= set(load_methods(model_dir, model))
    shutil.copytree(model_dir / "draft", tmp_path / "draft")
    only_draft = load_methods(tmp_path, model)
    assert "draft" in only_draft and not {"medusa", "eagle", "eagle2", "hybrid"} & set(only_draft)


@pytest.mark.parametrize("method", METHODS)
def test_greedy_output_equals_plain_greedy(engine: Engine, method: str) -> None:
    for prompt in _prompts():
        plain = _run(engine, prompt, max_new_tokens=20).ids
        for k in (None, 1, 3, engine.max_k):
            assert _run(engine, prompt, method, k, max_new_tokens=20).ids == plain, (prompt, k)


@pytest.mark.parametrize("method", METHODS)
def test_sampled_generation_is_seeded_and_exact_in_length(engine: Engine, method: str) -> None:
    params = dict(max_new_tokens=25, temperature=0.9, top_p=0.95, top_k=50)
    first = _run(engine, _prompts()[1], method, seed=7, **params).ids
    again = _run(engine, _prompts()[1], method, seed=7, **params).ids
    assert first == again and len(first) == 25


def _prefill_state(
    model: LlamaForCausalLM, prompt: list[int], sampler: Sampler, k: int
) -> tuple[DecodeState, torch.Tensor]:
    """The state right after prefill (root = the greedy first token), and the target's
    logits at the root."""
    out = model(torch.tensor([prompt]))
    root = int(out.logits[0, -1].argmax())
    state = DecodeState([*prompt, root], len(prompt), k, sampler, out.hidden[0], 0)
    return state, model(torch.tensor([[*prompt, root]])).logits[0, -1]



@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "sampler_args", [dict(temperature=1.0), dict(temperature=0.7, top_k=20, top_p=0.9)]
)
@torch.inference_mode()
def test_first_drafted_token_follows_the_target(
    model_dir: Path, method: str, sampler_args: dict
) -> None:
    """The token committed after the root has the target's distribution p, whatever the
    drafter proposed (its q, its tree)."""
    model = load_model(model_dir, dtype=torch.float32)
    drafter = load_methods(model_dir, model)[method].new_drafter()
    sampler = Sampler(**sampler_args, generator=torch.Generator().manual_seed(0))
    state, root_logits = _prefill_state(model, [5, 17, 42, 99, 7, 5, 17], sampler, k=2)
    counts: Counter[int] = Counter()
    accepted = 0
    draft = drafter.propose(state)
    for _ in range(TRIALS):
        if draft.q is not None:  # a sampled draft: draw a new one (proposing is idempotent)
            draft = drafter.propose(state)
        rows = root_logits.expand(1 + len(draft), -1)  # only the root row decides token 1
        path, bonus, _ = accept(draft, rows, sampler)
        counts[draft.tokens[path[0]] if path else bonus] += 1
        accepted += bool(path)
    assert accepted < TRIALS
    if draft.q is not None or "top_k" not in sampler_args:  # fixed random trees may all
        assert accepted > 0  # fall outside a narrow nucleus; sampled chains overlap p
    assert_follows(counts, sampler.probs(root_logits))


def _decode(
    model: LlamaForCausalLM,
    drafter: Drafter,
    prompt: list[int],
    sampler: Sampler,
    k: int,
    steps: int,
) -> DecodeState:
    """The engine's loop, by hand: prefill, then draft / verify / advance the state."""
    cache = model.new_cache()
    out = model(torch.tensor([prompt]), cache)
    cache.commit()
    state = DecodeState(
        [*prompt, int(out.logits[0, -1].argmax())], len(prompt), k, sampler, out.hidden[0], 0
    )
    for _ in range(steps):
        start = cache.length
        result = verify(model, cache, state.tokens[-1], drafter.propose(state), sampler)
        state.tokens.extend(result.tokens)
        state.hidden, state.hidden_start, state.last = result.hidden, start, result
    return state


@pytest.mark.parametrize("method", ("eagle", "draft"))
@torch.inference_mode()
def test_drafter_cache_after_rollbacks_matches_a_fresh_one(model_dir: Path, method: str) -> None:
    """After steps with rejections, the drafter proposes exactly what a fresh drafter does
    from the whole committed text (same tokens, same q): no rolled-back entry lingers."""
    model = load_model(model_dir, dtype=torch.float32)
    factory = load_methods(model_dir, model)[method].new_drafter
    drafter = factory()
    sampler = Sampler(1.0, generator=torch.Generator().manual_seed(3))
    state = _decode(model, drafter, [5, 17, 42, 99, 7], sampler, k=4, steps=8)
    assert state.last is not None and len(state.tokens) > 5 + 8
    tokens = state.tokens
    fresh_state = DecodeState(
        list(tokens), 5, 4, Sampler(1.0), model(torch.tensor([tokens[:-1]])).hidden[0], 0
    )
    state.sampler.generator.manual_seed(11)
    fresh_state.sampler.generator.manual_seed(11)
    ours, fresh = drafter.propose(state), factory().propose(fresh_state)
    assert ours.tokens == fresh.tokens
    assert ours.q is not None and fresh.q is not None
    torch.testing.assert_close(ours.q, fresh.q, atol=1e-4, rtol=1e-3)


@torch.inference_mode()
def test_eagle2_tree_nodes_see_exactly_their_ancestors(model_dir: Path) -> None:
    """Each node's cumulative log-prob, drafted in one batched tree pass per depth, equals
    the same path drafted alone as a chain: no node saw a sibling or a cousin."""
    model = load_model(model_dir, dtype=torch.float32)
    head = load_drafter(model_dir / "eagle", dtype=torch.float32)
    assert isinstance(head, EagleHead)
    drafter = EagleTreeDrafter(model, head, EagleTreeConfig(topk=2, depth=4))
    state, _ = _prefill_state(model, [9, 8, 7, 6, 5, 4], Sampler(0.0), k=16)
    draft = drafter.propose(state)
    assert len(draft) == 2 + 4 * 3 and max(draft.depths) == 4 and not draft.is_chain
    chain = EagleSync(model, head)
    root_position = len(state.tokens) - 1
    for node in range(len(draft)):
        path = [node]
        while draft.parents[path[0]] >= 0:
            path.insert(0, draft.parents[path[0]])
        (h, logits), score = answer([HeadCall(chain, chain.sync_input(state))])[0], 0.0
        for depth, n in enumerate(path):
            token = draft.tokens[n]
            score += float(logits[0].log_softmax(-1)[token])
            h, logits = answer([HeadCall(chain, chain.chain_input(
                h[-1:], torch.tensor([token]), torch.tensor([root_position + depth])))])[0]
        assert score == pytest.approx(drafter.last_scores[node], abs=1e-4), path


@torch.inference_mode()
def test_eagle2_keeps_the_k_best_nodes_of_the_expansion(model_dir: Path) -> None:
    """A smaller budget keeps exactly the k best-scoring nodes of the full expansion, for a
    flat head (whose expansion stops early: nothing deep can make the cut) and for a
    confident one (deep paths do make it)."""
    model = load_model(model_dir, dtype=torch.float32)
    flat = load_drafter(model_dir / "eagle", dtype=torch.float32)
    torch.manual_seed(2)
    confident = EagleHead(tiny_eagle_config())
    init_weights(confident.layer, std=0.3)
    deepest = []
    for head in (flat, confident):
        assert isinstance(head, EagleHead)
        drafter = EagleTreeDrafter(model, head.eval(), EagleTreeConfig(topk=2, depth=4))
        state, _ = _prefill_state(model, [9, 8, 7, 6, 5, 4], Sampler(0.0), k=16)
        full = drafter.propose(state)
        scores, paths = list(drafter.last_scores), _node_paths(full)
        deepest.append(max(full.depths[n] for n in _top(scores, 7)))
        for k in (4, 5, 7, 10):
            state.k = k
            draft = drafter.propose(state)
            assert len(draft) == k and set(_node_paths(draft)) == {
                paths[n] for n in _top(scores, k)
            }
    assert deepest[0] < 4 == deepest[1]


def _top(scores: list[float], k: int) -> list[int]:
    return sorted(range(len(scores)), key=lambda n: (-scores[n], n))[:k]


def _node_paths(draft: Draft) -> list[tuple[int, ...]]:
    """Each node as its token path from the root."""
    out: list[tuple[int, ...]] = []
    for token, parent in zip(draft.tokens, draft.parents, strict=True):
        out.append((*(out[parent] if parent >= 0 else ()), token))
    return out


def test_best_paths_is_the_k_most_probable_subtree() -> None:
    logp = [[-0.1, -2.5, -3.0], [-0.2, -1.0, -4.0], [-0.3, -3.0, -5.0]]
    tokens = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    draft = best_paths(logp, tokens, 5)
    # scores: 10:-0.1, 10-20:-0.3, 10-20-30:-0.6, 10-21:-1.1, 10-21-30:-1.4, ...
    assert draft.tokens == [10, 20, 30, 21, 30] and draft.parents == [-1, 0, 1, 0, 3]


@torch.inference_mode()
def test_exact_draft_model_is_almost_always_accepted(model_dir: Path, tmp_path: Path) -> None:
    """A draft model that is a copy of the target: greedy accepts all k every step (accept
    length (1 + n(k+1)) / (1 + n)); sampling accepts nearly every draft (q == p)."""
    (tmp_path / "draft").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(model_dir / name, tmp_path / name)
        if name != "tokenizer.json":
            shutil.copy(model_dir / name, tmp_path / "draft" / name)
    engine = Engine(tmp_path, dtype=torch.float32)
    k, n = 4, 6
    greedy = _run(engine, _prompts()[2], "draft", k, max_new_tokens=1 + n * (k + 1))
    assert greedy.stats.num_correct_drafts == greedy.stats.num_proposed_drafts == n * k
    assert greedy.stats.accept_length == pytest.approx((1 + n * (k + 1)) / (1 + n))
    sampled = _run(engine, _prompts()[2], "draft", k, max_new_tokens=60, temperature=1.0, seed=1)
    assert sampled.stats.accept_rate > 0.95


@pytest.mark.parametrize("method", ("medusa", "eagle2"))
@torch.inference_mode()
def test_tree_drafts_fill_the_node_budget(model_dir: Path, method: str) -> None:
    model = load_model(model_dir, dtype=torch.float32)
    drafter = load_methods(model_dir, model)[method].new_drafter()
    for k in (1, 2, 5, 9, 16):
        state, _ = _prefill_state(model, [3, 4, 5, 6], Sampler(0.0), k=k)
        draft = drafter.propose(state)
        assert len(draft) == k and max(draft.depths) <= k


BUNDLED = BUNDLED_MODEL_DIR / "eagle"
needs_bundled = pytest.mark.skipif(not BUNDLED.exists(), reason="bundled drafters absent")


@pytest.fixture(scope="module")
def bundled() -> Engine:
    return Engine(BUNDLED_MODEL_DIR, dtype=torch.float32)  # bf16 on CPU rounds per batch shape


@needs_bundled
@pytest.mark.parametrize("method", METHODS)
def test_bundled_drafters_are_lossless_and_accepted(bundled: Engine, method: str) -> None:
    prompt = bundled.tokenizer.encode("def add(a, b):\n    return")
    plain = _run(bundled, prompt, max_new_tokens=32)
    spec = _run(bundled, prompt, method, max_new_tokens=32)
    assert spec.ids == plain.ids
    assert spec.stats.accept_length > 1.2


@needs_bundled
@torch.inference_mode()
def test_bundled_heads_predict_the_offsets_they_are_drafted_for(bundled: Engine) -> None:
    """Teacher forcing on text: Medusa head 0 on f_t and EAGLE on (f_t, x_{t+1}) agree with
    the target's choice for x_{t+2} (the first draft position) more than with its choice
    for a neighbouring position, and well above chance."""
    model = bundled.model
    text = (
        "import json\nfrom pathlib import Path\n\n\ndef load_config(path):\n"
        '    """Read a JSON config file and return it as a dictionary."""\n'
        "    with open(path, encoding='utf-8') as handle:\n        data = json.load(handle)\n"
        "    if not isinstance(data, dict):\n        raise ValueError('config must be an object')\n"
        "    return data\n"
    )
    x = torch.tensor([bundled.tokenizer.encode(text)])
    out = model(x)
    target = out.logits[0].argmax(-1)  # target[t]: the target's choice for x_{t+1}
    medusa = load_drafter(BUNDLED_MODEL_DIR / "medusa", dtype=torch.float32)
    eagle = load_drafter(BUNDLED_MODEL_DIR / "eagle", dtype=torch.float32)
    head0 = model.lm_head(medusa(out.hidden)[0, 0]).argmax(-1)[1:-1]  # f_t, t = 1..T-2
    pairs = eagle(out.hidden[:, :-1], model.model.embed_tokens(x[:, 1:]))  # (f_t, x_{t+1})
    eagle_next = model.lm_head(pairs)[0].argmax(-1)[1:]  # t = 1..T-2

    def agree(pred: torch.Tensor, shift: int) -> float:  # vs the choice for x_{t+1+shift}
        return (pred == target[1 + shift : len(target) - 1 + shift]).float().mean().item()

    for name, pred in (("eagle", eagle_next), ("medusa", head0)):
        right, before = agree(pred, 1), agree(pred, 0)
        assert right > 0.2 and right > before, (name, right, before)


def _peaked(top: float, token: int, size: int = 8) -> torch.Tensor:
    """Logits (size,) whose softmax puts `top` on `token` and spreads the rest evenly."""
    p = torch.full((size,), (1 - top) / (size - 1))
    p[token] = top
    return p.log()


@pytest.mark.parametrize("greedy", (True, False))
def test_a_chain_stops_where_the_drafts_confidence_product_falls_below_the_cutoff(
    greedy: bool,
) -> None:
    """Tops 0.9, 0.5, 0.2, 0.9: the product 0.9, 0.45, 0.09 falls under 0.1 at the third
    position, so the chain holds two tokens (k 4); the first is drafted however unsure."""
    from workers.embedded.speculative.chain import draft_chain

    sampler = Sampler(0.0 if greedy else 1.0, generator=torch.Generator().manual_seed(0))
    levels = [_peaked(0.9, 1), _peaked(0.5, 2), _peaked(0.2, 3), _peaked(0.9, 4)]

    def chain(cutoff: float, first: torch.Tensor = levels[0]):
        from workers.embedded.speculative.chain import chain_steps

        steps = chain_steps(first, 4, sampler, None, cutoff)
        depth = 0
        next(steps)
        try:
            while True:
                depth += 1
                steps.send(levels[depth])
        except StopIteration as done:
            return done.value

    assert len(chain(0.1)) == 2 and len(chain(0.0)) == 4
    assert len(chain(0.95, _peaked(0.1, 1))) == 1  # the first token always
    short = chain(0.1)
    assert short.q is None if greedy else short.q.shape == (2, 8)
    if greedy:
        assert short.tokens == [1, 2]
    assert len(draft_chain(levels[0], 4, sampler, lambda d, t: levels[d + 1])) == 4  # no cutoff


@pytest.mark.parametrize(("sampler_args", "cutoff"), [
    (dict(temperature=1.0), 3.7e-4), (dict(temperature=0.7, top_k=20), 0.0108)])
@torch.inference_mode()
def test_the_token_after_a_cut_chain_position_follows_the_target(
    model_dir: Path, sampler_args: dict, cutoff: float
) -> None:
    """With a cutoff that ends about half the chains after their first token (the tiny
    head is unsure: the median product of its top two probabilities, measured), the second
    committed token still has the target's marginal sum_t1 p(t1) p(. | t1): whether a
    position gets a draft depends on the accepted prefix, never on the token drawn."""
    from workers.embedded.speculative.eagle import EagleChainDrafter

    model = load_model(model_dir, dtype=torch.float32)
    head = load_methods(model_dir, model)["eagle"].new_drafter()._eagle.head  # type: ignore[attr-defined]
    prompt = [5, 17, 42, 99, 7, 5, 17]
    probe = Sampler(**sampler_args, generator=torch.Generator().manual_seed(0))
    state, root_logits = _prefill_state(model, prompt, probe, k=3)
    root = state.tokens[-1]
    p1 = probe.probs(root_logits)  # (V,)
    following = model(torch.tensor([[*prompt, root, t] for t in range(V)])).logits[:, -1]
    marginal = sum(p1[t] * probe.probs(following[t]) for t in range(V) if p1[t] > 0)
    lengths: Counter[int] = Counter()
    counts: Counter[int] = Counter()
    for trial in range(TRIALS):
        sampler = Sampler(**sampler_args, generator=torch.Generator().manual_seed(trial))
        drafter = EagleChainDrafter(model, head, min_confidence=cutoff)
        original = drafter.propose_steps

        def recorded(state, original=original):
            draft = yield from original(state)
            lengths[len(draft)] += 1
            return draft

        drafter.propose_steps = recorded  # type: ignore[method-assign]
        state = _decode(model, drafter, prompt, sampler, 3, 2)
        counts[state.tokens[len(prompt) + 2]] += 1
    assert lengths[1] > TRIALS // 5 and sum(n for size, n in lengths.items() if size > 1) > TRIALS // 5
    assert_follows(counts, marginal)
