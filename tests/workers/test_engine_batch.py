"""Batched decoding: concurrent requests share each target forward and lose nothing.

Every method with its own k in one batch gives, token for token, what each request gives
alone; seeded sampling draws the same tokens batched or not, and the token committed after
the root follows the target's p when three drafts share a forward; caches rolled back and
compacted inside a batch (and grown on the way) match fresh runs; a request cancelled
mid-batch leaves the others exact.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from stats import assert_follows
from tiny_models import half_agreeing_drafters_dir

from workers.embedded.engine import Engine, Generation, SamplingParams, StepOutput
from workers.embedded.kv_cache import KVCache
from workers.embedded.model import LlamaForCausalLM, SequenceInput
from workers.embedded.speculative import Draft, Sampler
from workers.embedded.speculative.hybrid import HybridDrafter
from workers.embedded.speculative.methods import EngineMethod
from workers.embedded.speculative.verify import VerifyStep

V = 300
TRIALS = 1200
# (method, k) run side by side: plain, a short ngram chain, lookahead's aux branch, trees
# (medusa, eagle2), a sampled-q chain (eagle), a draft model and the hybrid (n-gram or
# the EAGLE chain, per step), with k from 1 to 16
MIXED = [("plain", 0), ("ngram", 4), ("lookahead", None), ("medusa", 6), ("eagle", 3),
         ("eagle2", 8), ("draft", 1), ("ngram", 16), ("hybrid", 5)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return Engine(half_agreeing_drafters_dir(tmp_path_factory.mktemp("model"), V),
                  dtype=torch.float32)


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(4)
    lengths = [1, 7, 30, 70, 3, 12, 5, 40]
    prompts = [torch.randint(3, V, (lengths[i % 8],), generator=g).tolist() for i in range(n)]
    return prompts


def _start(engine: Engine, prompt: list[int], method: str, k: int | None, seed: int,
           sampled: bool, limit: int) -> Generation:
    params = SamplingParams(max_new_tokens=limit, ignore_eos=True, seed=seed,
                            **(dict(temperature=0.9, top_p=0.95, top_k=50) if sampled else {}))
    return engine.start(prompt, params, method, k)


def _alone(gen: Generation) -> tuple[list[int], str]:
    ids, text = [], ""
    while not gen.finished:
        out = gen.step()
        ids += out.token_ids
        text += out.text
    return ids, text


def _together(engine: Engine, gens: list[Generation], join_after: dict[int, int],
              cancel_after: dict[int, int] | None = None) -> list[tuple[list[int], str]]:
    """Step generations as the scheduler does: all active ones per `Engine.step`; request i
    joins after join_after[i] steps, and is cancelled after cancel_after[i] of its own."""
    cancel_after = cancel_after or {}
    results: list[tuple[list[int], str]] = [([], "") for _ in gens]
    steps = [0] * len(gens)
    sizes: list[int] = []
    for turn in range(1000):
        active = [i for i, g in enumerate(gens) if join_after.get(i, 0) <= turn and not g.finished]
        if not active:
            break
        sizes.append(len(active))
        outputs = engine.step([gens[i] for i in active])
        for i, out in zip(active, outputs, strict=True):
            assert isinstance(out, StepOutput), out
            ids, text = results[i]
            results[i] = (ids + out.token_ids, text + out.text)
            steps[i] += 1
            if cancel_after.get(i) == steps[i]:
                gens[i].cancel()
    assert max(sizes) > 1
    return results


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_mixed_methods_in_one_batch_equal_each_request_alone(engine: Engine,
                                                             sampled: bool) -> None:
    """Greedy: token for token. Sampled with seeds: the same draws, since each request's
    drafter, sampler and generator are its own and only the forward is shared."""
    prompts = _prompts(len(MIXED))
    limits = [12 + 3 * i for i in range(len(MIXED))]

    def new(i: int) -> Generation:
        method, k = MIXED[i]
        return _start(engine, prompts[i], method, k, seed=i, sampled=sampled, limit=limits[i])

    alone = [_alone(new(i)) for i in range(len(MIXED))]
    gens = [new(i) for i in range(len(MIXED))]
    together = _together(engine, gens, join_after={3: 2, 5: 4, 7: 9})
    for i, (method, k) in enumerate(MIXED):
        assert together[i] == alone[i], (method, k)
        assert len(together[i][0]) == limits[i]
    accepted = {MIXED[i][0] for i, g in enumerate(gens) if g.stats.num_correct_drafts}
    assert len(accepted) >= 2  # drafts were accepted, so caches were rolled back and compacted


def _network(engine: Engine, method: str) -> tuple[object, str]:
    """The drafter network every request of `method` shares, and its batched entry."""
    drafter = engine._methods[method].new_drafter()
    if method == "medusa":
        return drafter._heads, "forward"  # (N, 1, C): one row per sequence
    if method == "hybrid":
        drafter = drafter._chain  # its EAGLE branch
    return drafter._eagle.head, "forward_batch"  # a list of inputs, one per sequence


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize(("method", "plan"), [("eagle", [3, 1, 5, 2]),
                                              ("eagle2", [8, 4, 12, 6]),
                                              ("hybrid", [3, 1, 5, 2]),
                                              ("medusa", [4, 2, 6, 3])])
def test_drafters_draft_together_and_equal_each_request_alone(
        engine: Engine, sampled: bool, method: str, plan: list[int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Several EAGLE chains (EAGLE-2 trees, Medusa trees; k per request in `plan`) in a
    step draft in lock-step: one forward of their network per depth (Medusa: per step)
    over all of them, not one per request; each request's tokens are still what it
    gets alone. (The hybrid without its EAGLE bar, so that every request's EAGLE branch
    drafts where nothing matches; the bar: test_engine_hybrid.)"""
    if method == "hybrid":
        shipped = engine._methods["hybrid"]
        drafter = shipped.new_drafter()
        config = dataclasses.replace(drafter.config, eagle_min_rate=0.0)
        model, head = drafter._chain._eagle.model, drafter._chain._eagle.head
        monkeypatch.setitem(engine._methods, "hybrid", EngineMethod(
            "hybrid", lambda: HybridDrafter(model, head, config), shipped.default_k))
    prompts = _prompts(len(plan))

    def new(i: int) -> Generation:
        return _start(engine, prompts[i], method, plan[i], seed=i, sampled=sampled,
                      limit=14 + 2 * i)

    network, entry = _network(engine, method)
    sizes: list[int] = []
    forward = getattr(network, entry)

    def counted(inputs):  # noqa: ANN001, ANN202
        sizes.append(len(inputs))
        return forward(inputs)

    setattr(network, entry, counted)
    try:
        singles = [new(i) for i in range(len(plan))]
        alone = [_alone(g) for g in singles]
        forwards_alone, sizes[:] = len(sizes), []
        gens = [new(i) for i in range(len(plan))]
        together = _together(engine, gens, join_after={2: 3})
    finally:
        delattr(network, entry)
    assert together == alone
    drafts = [(g.stats.num_proposed_drafts, g.stats.num_correct_drafts) for g in gens]
    assert drafts == [(g.stats.num_proposed_drafts, g.stats.num_correct_drafts)
                      for g in singles]  # the same drafts, accepted alike
    assert max(sizes) == len(plan)  # all four drafters in one forward
    assert sum(sizes) == forwards_alone  # the same inputs...
    assert len(sizes) < 0.6 * forwards_alone  # ...in far fewer forwards


def test_cancel_mid_batch_leaves_the_others_exact(engine: Engine) -> None:
    prompts = _prompts(4)
    plan = [("eagle2", 8), ("plain", 0), ("ngram", 4), ("medusa", 6)]

    def new(i: int) -> Generation:
        return _start(engine, prompts[i], *plan[i], seed=i, sampled=False, limit=20)

    alone = [_alone(new(i)) for i in range(4)]
    gens = [new(i) for i in range(4)]
    together = _together(engine, gens, join_after={}, cancel_after={0: 2, 2: 3})
    assert gens[0].finished and gens[0].finish_reason is None
    assert together[1] == alone[1] and together[3] == alone[3]
    assert alone[2][0][: len(together[2][0])] == together[2][0] != alone[2][0]
    finished = engine.step(gens)  # stepping finished or cancelled requests is harmless
    assert all(isinstance(o, StepOutput) and o.finished and not o.token_ids for o in finished)


def test_a_failing_request_fails_alone(engine: Engine) -> None:
    gens = [_start(engine, p, "ngram", 4, seed=0, sampled=False, limit=10) for p in _prompts(2)]

    class Broken:
        def propose(self, state):
            raise RuntimeError("drafter broke")

    gens[0].step()
    gens[0]._drafter = Broken()
    failed, fine = engine.step(gens)
    assert isinstance(failed, RuntimeError) and gens[0].finished
    assert isinstance(fine, StepOutput) and not gens[1].finished


# --- the batched forward and verify, below the engine ---------------------------------


def _fresh_logits(model: LlamaForCausalLM, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens])).logits[0]


def _prefilled(model: LlamaForCausalLM, prompts: list[list[int]]) -> list[KVCache]:
    caches = [model.new_cache() for _ in prompts]
    model.forward_batch([SequenceInput(torch.tensor(p), c) for p, c in zip(prompts, caches,
                                                                          strict=True)])
    for cache in caches:
        cache.commit()
    return caches


def test_cache_grows_by_doubling_up_to_its_limit(engine: Engine) -> None:
    cache = engine.model.new_cache(max_length=150)
    assert cache.capacity == KVCache.MIN_CAPACITY == 64
    layers = engine.model.config.num_hidden_layers
    k = torch.randn(1, 2, 70, 16)
    for layer in range(layers):
        cache.append(layer, k, k)
    cache.commit()
    assert cache.capacity == 128 and cache.length == 70
    for layer in range(layers):
        keys, _ = cache.append(layer, k[:, :, :60], k[:, :, :60])
        torch.testing.assert_close(keys[:, :, :70], k, rtol=0, atol=0)  # kept across growth
    cache.commit()
    assert cache.capacity == 150 and cache.length == 130
    with pytest.raises(ValueError, match="full"):
        cache.append(0, k, k)


@torch.inference_mode()
def test_rollback_and_keep_in_a_batch_match_fresh_runs(engine: Engine) -> None:
    """Three sequences (one past a growth of its cache) verify in one forward: a chain
    rejected half-way (rollback), a tree whose path is not contiguous (keep), a plain step;
    then each cache decodes on exactly like a fresh run of its committed tokens."""
    model = engine.model
    prompts = [list(range(10, 75)), [5, 6, 7], list(range(100, 120))]
    caches = _prefilled(model, prompts)
    roots = [3, 4, 8]
    greedy = [_fresh_logits(model, p + [r])[-1].argmax().item() for p, r in zip(prompts, roots,
                                                                            strict=True)]
    drafts = [
        Draft.chain([greedy[0], (greedy[0] + 1) % V, 9]),  # first accepted, then rejected
        Draft([(greedy[1] + 1) % V, greedy[1], 11], [-1, -1, 1]),  # path: node 1 alone
        Draft.empty(),
    ]
    steps = [VerifyStep(c, r, d) for c, r, d in zip(caches, roots, drafts, strict=True)]
    outs = model.forward_batch([s.input for s in steps])
    results = [s.finish(o, Sampler(0.0)) for s, o in zip(steps, outs, strict=True)]
    assert results[0].accepted == [greedy[0]] and results[1].accepted_nodes[0] == 1
    for prompt, root, cache, result in zip(prompts, roots, caches, results, strict=True):
        committed = prompt + [root] + result.accepted
        assert cache.length == len(committed)
        after = model.forward_batch([SequenceInput(torch.tensor([result.bonus, 17]), cache)])
        fresh = _fresh_logits(model, committed + [result.bonus, 17])[-2:]
        torch.testing.assert_close(after[0].logits[0], fresh, atol=1e-4, rtol=1e-4)
    assert caches[0].capacity == 128



@torch.inference_mode()
def test_first_token_follows_the_target_when_drafts_share_a_forward(engine: Engine) -> None:
    """Three requests verify together, trial after trial (rolled back each time): a point-
    mass chain, a sibling tree, a sampled-q chain. The token each commits after its root
    follows its own p, at its own temperature."""
    model = engine.model
    prompts = [[5, 17, 42, 99, 7], [8, 8, 9], [30, 31, 32, 33]]
    roots = [5, 9, 34]
    caches = _prefilled(model, prompts)
    args = [dict(temperature=1.0), dict(temperature=0.7, top_k=20, top_p=0.9),
            dict(temperature=1.0)]
    samplers = [Sampler(**a, generator=torch.Generator().manual_seed(i))
                for i, a in enumerate(args)]
    ps = [s.probs(_fresh_logits(model, p + [r])[-1])
          for s, p, r in zip(samplers, prompts, roots, strict=True)]
    likely = [p.argsort(descending=True).tolist() for p in ps]
    q = torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(9)), -1)
    counts: list[Counter[int]] = [Counter() for _ in prompts]
    for _ in range(TRIALS):
        x = int(torch.multinomial(q, 1, generator=samplers[2].generator))
        drafts = [Draft.chain([likely[0][1], 3]),
                  Draft(likely[1][:3] + [7], [-1, -1, -1, 0]),
                  Draft.chain([x], q=q[None])]
        steps = [VerifyStep(c, r, d) for c, r, d in zip(caches, roots, drafts, strict=True)]
        outs = model.forward_batch([s.input for s in steps])
        for i, (step, out) in enumerate(zip(steps, outs, strict=True)):
            result = step.finish(out, samplers[i])
            counts[i][result.tokens[0]] += 1
            caches[i].rollback(len(prompts[i]))
    for i in range(3):
        assert_follows(counts[i], ps[i])
