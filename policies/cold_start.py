"""Cold-start tries: the few requests that measure a pool before its prior is trusted.

Without them a pool the prior ranks low is never measured: an idle plain pool kept the
fleet's median (speculative) step, 3x its own (docs/POLICY.md), and on the trace world
(docs/TRACES.md) the embedded workers' measured.json put n-gram's acceptance on code at
a = 0.09 (1.10 tokens a step, from the engine bench's own prompts), so code never went
to the n-gram pool that yields 1.6 tokens a step on it.

What a try measures decides what it is per:
- a speculative pool: its acceptance in this context (model, task, temperature bucket),
  whether or not its workers measured their step cost — a prior measured on other prompts
  is not this traffic's. Tried while the context has fewer than `samples` requests there;
- a plain pool: only its step cost, which no context changes: tried while the pool has
  fewer than `samples` requests in all, and never where its workers measured the cost.
Tries share exploration's budget (`explore_cap`); the caller checks it.
"""

from __future__ import annotations

from collections import defaultdict

from policies.learner import PolicyState
from policies.options import Option

Context = tuple[str, str, str]  # model, task, temperature bucket
ANY: Context = ("*", "*", "*")  # a plain pool's tries are per pool


class ColdStart:
    """Counts the tries made per (pool, context) and picks the next one."""

    def __init__(self, samples: float) -> None:
        self.samples = samples
        self.tries: dict[tuple[str, str, str, str], int] = {}

    def pick(self, options: list[Option], state: PolicyState, context: Context
             ) -> Option | None:
        """The least-tried pool still short of `samples` requests (module docstring),
        counted as tried; None once every pool has them."""
        if self.samples <= 0:
            return None
        plain_seen: dict[str, float] = defaultdict(float)
        for (pool, *_), n in state.traffic.items():
            plain_seen[pool] += n
        best = None
        for option in options:
            name = option.pool.name
            if option.pool.method == "plain":
                if name in state.cost_measured:  # its workers' batch bench did
                    continue
                key, seen = (name, *ANY), plain_seen.get(name, 0.0)
            else:
                key = (name, *context)
                seen = state.traffic.get(key, 0.0)
            tries = self.tries.get(key, 0)
            if seen >= self.samples or tries >= self.samples:
                continue
            rank = (seen + tries, -option.tokens_per_s)
            if best is None or rank < best[0]:
                best = (rank, option, key)
        if best is None:
            return None
        _, option, key = best
        self.tries[key] = self.tries.get(key, 0) + 1
        return option
