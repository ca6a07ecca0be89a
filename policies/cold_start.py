"""Cold-start tries: the few requests that measure a pool before its prior is trusted.

Without them a pool the prior ranks low is never measured: an idle plain pool kept the
fleet's median (speculative) step, 3x its own (docs/POLICY.md), and on the trace world
(docs/TRACES.md) the embedded workers' measured.json put n-gram's acceptance on code at
a = 0.09 (1.10 tokens a step, from the engine bench's own prompts), so code never went
to the n-gram pool that yields 1.6 tokens a step on it.

What a try measures decides what it is per:
- a fixed-k speculative pool: its acceptance in this context (model, task, temperature
  bucket), whether or not its workers measured their step cost — a prior measured on
  other prompts is not this traffic's. Tried while the context has fewer than `samples`
  requests there. A per-request-k pool whose workers measured their step cost (the
  embedded engine) is left to exploration, which varies its k too: forced tries at its
  configured k cost the simulator's embedded fleet (every method on every worker);
- a plain pool: only its step cost, which no context changes and one request's steps
  measure: tried once, while the pool has no request in any context, and never where
  its workers measured the cost.
A speculative pool is tried only while it may be the better pick: its tokens/s at the
optimistic acceptance (the UCB `policies.decision` explores with: the context's `a` plus
`ucb_z` standard errors of its requests and the prior's pseudo-counts) beats the greedy
pick's. On the trace world forced tries of every pool in every class cost 1-3% of a
240-request run (each a request served at ~0.6x), most of them on pools no outcome of
the try could have made the pick.
Tries share exploration's budget (`explore_cap`); the caller checks it.
"""

from __future__ import annotations

from collections import defaultdict

from policies.acceptance import A_MAX, acceptance_std
from policies.learner import PolicyState
from policies.options import Option

Context = tuple[str, str, str]  # model, task, temperature bucket
ANY: Context = ("*", "*", "*")  # a plain pool's tries are per pool
PLAIN_TRIES = 1  # a plain request's steps are all alike: one measures the pool's step


class ColdStart:
    """Counts the tries made per (pool, context) and picks the next one."""

    def __init__(self, samples: float, ucb_z: float, prior_weight: float) -> None:
        self.samples, self.ucb_z, self.prior_weight = samples, ucb_z, prior_weight
        self.tries: dict[tuple[str, str, str, str], int] = {}

    def hopeful(self, option: Option, state: PolicyState) -> float:
        """The option's tokens/s at its optimistic acceptance (module docstring)."""
        if option.k <= 0:
            return option.tokens_per_s
        upper = min(option.accept + self.ucb_z * acceptance_std(
            option.accept, option.samples + self.prior_weight), A_MAX)
        method = option.pool.method
        return option.tokens_per_s * (state.accept_length(upper, method, option.k)
                                      / state.accept_length(option.accept, method, option.k))

    def pick(self, options: list[Option], state: PolicyState, context: Context,
             greedy: Option) -> Option | None:
        """The least-tried pool still short of `samples` requests that may beat the
        `greedy` pick (module docstring), counted as tried; None when there is none."""
        if self.samples <= 0:
            return None
        plain_seen: dict[str, float] = defaultdict(float)
        for (pool, *_), n in state.traffic.items():
            plain_seen[pool] += n
        best = None
        for option in options:
            name = option.pool.name
            need = self.samples
            if option.pool.method == "plain":
                if name in state.cost_measured:  # its workers' batch bench did
                    continue
                key, seen, need = (name, *ANY), plain_seen.get(name, 0.0), PLAIN_TRIES
            else:
                if option.pool.per_request_k and name in state.cost_measured:
                    continue  # measured costs, k chosen per request: exploration's (below)
                if name != greedy.pool.name and (self.hopeful(option, state)
                                                 <= greedy.pool_score):
                    continue  # no outcome of the try would make it the pick
                key = (name, *context)
                seen = state.traffic.get(key, 0.0)
            tries = self.tries.get(key, 0)
            if seen >= need or tries >= need:
                continue
            rank = (seen + tries, -option.tokens_per_s)
            if best is None or rank < best[0]:
                best = (rank, option, key)
        if best is None:
            return None
        _, option, key = best
        self.tries[key] = self.tries.get(key, 0) + 1
        return option
