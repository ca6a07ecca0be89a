"""Fleets of fixed-k pools on the trace world (bench/traces/world.py), scored alike.

A fleet's figure is decode tokens per GPU-second with every worker full at batch B
(B requests like the one served sharing each step): the sum of the requests' decode
tokens over the sum of their decode seconds / B, over one request sequence (a mix's
draw). Every fleet below is scored on the same sequence:
- homogeneous: every request to one pool (plain, or a method at one k); a method's
  best k is the one that scores highest on the sequence (tuned as a user would);
- launched: plain and each method at its best homogeneous k, the pools the routed
  fleets choose among;
- `static`: the gateway's rule (`policies.rules.RULES["static"]`) on each request's
  profile;
- `oracle_class`: per classifier class, the launched pool best for that class's
  requests on this sequence; `oracle_request`: per request, the best launched pool.
  Both maximise the sequence's ratio exactly (Dinkelbach's iteration on
  sum(tokens) / sum(seconds)), so they bound every assignment over those pools;
- `adaptive`: bench/traces/adaptive.py, the shipped policy driven as the gateway does.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.traces.world import LAWS, Served, Trace, serve
from policies.rules import RULES
from policies.types import PoolView, RequestProfile

METHODS = ("ngram", "eagle")
KS = (1, 2, 3, 4, 6, 8, 12, 16)
# categories whose answer reuses material given in the prompt (by the prompt's source
# label): code edits, summaries, answers extracted from a passage, RAG. Spec-Bench's
# `qa` (Natural Questions, no passage given) is not.
COPY_HEAVY = frozenset({"code_edit", "summarization", "qa_extraction", "rag"})


@dataclass(frozen=True, slots=True)
class PoolSpec:
    method: str
    k: int

    @property
    def name(self) -> str:
        return "plain" if self.method == "plain" else f"{self.method}-k{self.k}"


PLAIN = PoolSpec("plain", 0)


def grid(max_k: int = 8) -> list[PoolSpec]:
    return [PLAIN, *(PoolSpec(m, k) for m in METHODS for k in KS if k <= max_k)]


def view(pool: PoolSpec, batch: int, engine: str) -> PoolView:
    """The pool as the gateway sees it: one worker with `batch - 1` requests in flight."""
    return PoolView(name=pool.name, engine=engine, method=pool.method, k=pool.k,
                    per_request_k=False, healthy_workers=1, outstanding=batch - 1)


class Costs:
    """Served (world.Served) per (request, pool), at one batch in one world; memoised."""

    def __init__(self, traces: dict[str, dict[str, Trace]], world: str, batch: int) -> None:
        self.traces, self.batch, self.law = traces, batch, LAWS[world]()
        self._memo: dict[tuple[str, str], Served] = {}

    def __call__(self, rid: str, pool: PoolSpec) -> Served:
        key = (rid, pool.name)
        served = self._memo.get(key)
        if served is None:
            trace = self.traces[rid]["plain" if pool.method == "plain" else pool.method]
            served = self._memo[key] = serve(trace, pool.method, pool.k, self.batch, self.law)
        return served

    def score(self, pairs: Sequence[tuple[str, PoolSpec]]) -> float:
        """Decode tokens per GPU-second of these (request, pool) assignments."""
        tokens = seconds = 0.0
        for rid, pool in pairs:
            s = self(rid, pool)
            tokens += s.tokens
            seconds += s.decode_s
        return tokens * self.batch / seconds if seconds else 0.0


def best_by_group(costs: Costs, sequence: Sequence[str], groups: Sequence[str],
                  pools: Sequence[PoolSpec]) -> list[PoolSpec]:
    """Per group label, the pool that maximises the whole sequence's tokens per second
    (Dinkelbach: per group minimise ratio * GPU-seconds - tokens, the ratio updated until it
    stays)."""
    ratio, chosen = 0.0, [pools[0]] * len(sequence)
    for _ in range(50):
        sums: dict[tuple[str, str], float] = {}
        for rid, group in zip(sequence, groups, strict=True):
            for pool in pools:
                s = costs(rid, pool)
                key = (group, pool.name)
                sums[key] = sums.get(key, 0.0) + ratio * s.decode_s / costs.batch - s.tokens
        pick = {g: min(pools, key=lambda p: (sums[(g, p.name)], p.name))  # noqa: B023
                for g in set(groups)}
        chosen = [pick[g] for g in groups]
        new = costs.score(list(zip(sequence, chosen, strict=True)))
        if abs(new - ratio) <= 1e-12 * max(new, 1.0):
            break
        ratio = new
    return chosen


def static_assignment(profiles: Sequence[RequestProfile], pools: Sequence[PoolSpec],
                      batch: int, engine: str) -> list[PoolSpec]:
    by_name = {p.name: p for p in pools}
    views = [view(p, batch, engine) for p in pools]
    return [by_name[RULES["static"].decide(profile, views).pool] for profile in profiles]


def mix_sequence(ids: Sequence[str], category: Callable[[str], str], share: float | None,
                 seed: int) -> list[str]:
    """The request order of one replicate: every id shuffled (`share` None: the recorded
    categories as they are), or as many draws, with replacement, `share` of them from the
    copy-heavy categories (COPY_HEAVY) and the rest from the others."""
    rng = random.Random(f"traces:{share}:{seed}")
    if share is None:
        order = list(ids)
        rng.shuffle(order)
        return order
    copy = [i for i in ids if category(i) in COPY_HEAVY]
    other = [i for i in ids if category(i) not in COPY_HEAVY]
    if not other or (share > 0 and not copy):
        return []
    n_copy = round(share * len(ids))
    draws = [rng.choice(copy) for _ in range(n_copy)]
    draws += [rng.choice(other) for _ in range(len(ids) - n_copy)]
    rng.shuffle(draws)
    return draws


@dataclass(slots=True)
class Scores:
    homogeneous: dict[str, float]  # pool name -> score
    best: dict[str, PoolSpec]  # method (plain too) -> its best pool
    launched: list[PoolSpec]
    static: float
    oracle_class: float
    oracle_request: float
    by_request: list[PoolSpec]  # the per-request oracle's pool for each request

    @property
    def best_homogeneous(self) -> tuple[str, float]:
        name = max(self.homogeneous, key=lambda n: (self.homogeneous[n], n))
        return name, self.homogeneous[name]


def score_fleets(costs: Costs, sequence: Sequence[str], profiles: Sequence[RequestProfile],
                 pools: Sequence[PoolSpec], engine: str) -> Scores:
    homogeneous = {p.name: costs.score([(r, p) for r in sequence]) for p in pools}
    best: dict[str, PoolSpec] = {}
    for pool in pools:
        current = best.get(pool.method)
        if current is None or homogeneous[pool.name] > homogeneous[current.name]:
            best[pool.method] = pool
    launched = [best[m] for m in ("plain", *METHODS) if m in best]
    static = static_assignment(profiles, launched, costs.batch, engine)
    by_class = best_by_group(costs, sequence, [p.task for p in profiles], launched)
    by_request = best_by_group(costs, sequence, [f"{i}" for i in range(len(sequence))],
                               launched)
    return Scores(homogeneous, best, launched,
                  costs.score(list(zip(sequence, static, strict=True))),
                  costs.score(list(zip(sequence, by_class, strict=True))),
                  costs.score(list(zip(sequence, by_request, strict=True))), by_request)
