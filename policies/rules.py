"""The hand-written routing policies, beside the learned one (`policies.decision`).

- `first_healthy`: the first pool (config order) with a healthy worker;
- `static_rules`: task and temperature -> method, a stand-in until the learned policy
  takes over.
Both have the learned policy's signature, `decide(profile, pools) -> Decision`, and raise
ValueError when no pool has a healthy worker (the router answers that with a 503);
`RULES` holds them as `policies.protocol.Rule` policies, by the name `--policy` takes.
"""

from __future__ import annotations

from policies.protocol import Rule
from policies.types import Decision, PoolView, RequestProfile

# the names `specroute gateway --policy` takes (gateway.routing.policy builds them)
POLICY_NAMES = ("learned", "static", "first")


def first_healthy(profile: RequestProfile, pools: list[PoolView]) -> Decision:
    """Default policy: the first pool (config order) that has a healthy worker."""
    for view in pools:
        if view.healthy_workers > 0:
            rest = tuple(p.name for p in pools if p.name != view.name and p.healthy_workers)
            return Decision(pool=view.name, method=view.method, k=view.k,
                            reason="first pool with a healthy worker", fallbacks=rest)
    raise ValueError("no pool with a healthy worker")


# method preference per request class for `static_rules`, best first. Input-grounded
# code suits prompt-lookup/lookahead drafting; JSON's fixed keys and punctuation suit
# lookahead's n-gram pool and tree drafts; free chat needs a learned drafter (EAGLE,
# arXiv 2401.15077); at high temperature acceptance collapses, so plain decoding wins.
# `hybrid` (n-gram where the context matches, else EAGLE: docs/WORKER.md) comes next
# where a learned drafter or prompt lookup leads: on SmolLM2 its accept length matched or
# beat EAGLE's on 8 of 10 classes (docs/results/2026-12-06-hybrid.md).
STATIC_PREFERENCES: dict[str, tuple[str, ...]] = {
    "code": ("ngram", "hybrid", "lookahead", "eagle2", "eagle3", "eagle", "medusa", "draft"),
    "structured": ("lookahead", "ngram", "eagle2", "eagle3", "hybrid", "medusa", "eagle",
                   "draft"),
    "chat": ("eagle3", "hybrid", "eagle2", "eagle", "medusa", "draft", "lookahead", "ngram"),
    "edit": ("ngram", "hybrid", "lookahead", "eagle3", "eagle2", "eagle", "medusa", "draft"),
    "thigh": ("plain",),
}


def static_rules(profile: RequestProfile, pools: list[PoolView]) -> Decision:
    """Hand-written class → method rules: code and edits → n-gram, structured →
    lookahead, chat → EAGLE, temperature > 0.7 → plain; plain pools are always the last fallback."""
    key = "thigh" if profile.temperature_bucket == "thigh" else profile.task
    preference = STATIC_PREFERENCES[key]

    def rank(view: PoolView) -> tuple[int, float]:
        plain = view.method == "plain" or view.k == 0
        order = preference.index(view.method) if view.method in preference else (
            len(preference) + (1 if plain else 0))
        return order, view.outstanding / max(1, view.healthy_workers)

    ranked = sorted((v for v in pools if v.healthy_workers > 0), key=rank)
    if not ranked:
        raise ValueError("no pool with a healthy worker")
    best = ranked[0]
    reason = (f"static rule: {key} -> {best.method}" if best.method in preference
              else f"static rule: no {'/'.join(preference[:2])} pool for {key}")
    return Decision(pool=best.name, method=best.method, k=best.k, reason=reason,
                    fallbacks=tuple(v.name for v in ranked[1:]))


RULES: dict[str, Rule] = {"static": Rule(static_rules, "static"),
                          "first": Rule(first_healthy, "first")}
