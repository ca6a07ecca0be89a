"""Which pool serves a request: filter by model and capability, then ask the policy.

The `PoolRouter` owns the facts (which pools serve the model, which can do constrained
decoding or tools, which fit the prompt, which have an available worker); the choice
among the remaining pools is the `policies.protocol.RoutingPolicy` it holds (in the
routing core, the SLO-aware wrapper around the learned policy or a rule); a policy that
finds no pool with a healthy worker raises ValueError, answered 503 here. The decision
that leaves `route` is final: its `k` is what the pool runs (`gateway.pools.served`).
A `Pin` from the `x-specroute-pool` / `x-specroute-k` headers overrides the policy
for benchmarks and debugging; capability checks still apply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

from gateway.errors import InvalidRequest, ModelNotFound, NoHealthyWorker
from gateway.pins import NO_PIN, Pin
from gateway.pools import Pool, served
from gateway.schemas import GenerationRequest
from policies.protocol import RoutingPolicy
from policies.rules import RULES
from policies.types import Decision, PoolView, RequestProfile

log = logging.getLogger("specroute.gateway")
JSON_OBJECT_PREFERENCE = ("lacks constrained_decoding, preferred for response_format "
                          "json_object")


class Requirement(NamedTuple):
    """One thing a request needs of a pool: why a pool fails it, the test, the error
    when no pool passes."""

    why: str
    keep: Callable[[Pool], bool]
    error: Callable[[], InvalidRequest]


@dataclass(frozen=True, slots=True)
class Assessment:
    """One pool as the router sees one request: excluded (and why) or eligible."""

    pool: Pool
    excluded: str | None = None

    def to_dict(self) -> dict:
        return {"pool": self.pool.name, "engine": self.pool.config.engine,
                "method": self.pool.config.method, "k": self.pool.config.k,
                "eligible": self.excluded is None, "why_not": self.excluded,
                "healthy_workers": self.pool.healthy_workers,
                "outstanding": self.pool.outstanding,
                "reported_batch": round(self.pool.reported_batch(time.monotonic()), 3)}


class PoolRouter:
    """Routes live requests with the policy's `decide`; explain and pinned requests use
    its pure `predict`, which must move no counter, RNG or exploration budget."""

    def __init__(self, pools: dict[str, Pool], policy: RoutingPolicy = RULES["first"]) -> None:
        self.pools = pools
        self.policy = policy
        self.eligible: dict[str, Assessment] = {}  # each pool's eligible assessment, reused

    def assess(self, request: GenerationRequest, profile: RequestProfile,
               pin: Pin = NO_PIN) -> list[Assessment]:
        """Every pool, excluded with a reason or eligible; raises when none is eligible,
        naming the first requirement no pool of the model meets."""
        out: dict[str, Assessment] = {}
        serving: list[Pool] = []
        for name, pool in self.pools.items():
            if pool.config.model == request.model:
                serving.append(pool)
                out[name] = self._eligible(name, pool)
            else:
                out[name] = Assessment(pool, f"serves model '{pool.config.model}'")
        if not serving:
            raise ModelNotFound(f"The model '{request.model}' does not exist",
                                param="model", code="model_not_found")
        if pin.pool is not None and pin.pool not in {p.name for p in serving}:
            raise InvalidRequest(f"x-specroute-pool: no pool named '{pin.pool}' serves "
                                 f"model '{request.model}'", param="x-specroute-pool",
                                 code="unknown_pool")
        remaining = serving
        for why, keep, error in self._requirements(request, profile, pin, serving):
            kept = [p for p in remaining if keep(p)]
            if len(kept) == len(remaining):  # the usual case: nothing to exclude
                continue
            if not kept and pin.pool is not None:
                raise InvalidRequest(f"x-specroute-pool: pool '{pin.pool}' cannot serve this "
                                     f"request: it {why}", param="x-specroute-pool",
                                     code="unsupported_capability")
            if not kept:
                raise error()
            for pool in remaining:
                if pool not in kept:
                    out[pool.name] = Assessment(pool, why)
            remaining = kept
        for pool in remaining:
            if pool.healthy_workers == 0:
                out[pool.name] = Assessment(pool, "no available worker")
        if request.wants_json_object:
            self._prefer_constrained(serving if pin.pool else remaining, out, pin)
        return list(out.values())

    def _eligible(self, name: str, pool: Pool) -> Assessment:
        """`Assessment(pool)`, made once per pool (it is frozen): most pools pass."""
        known = self.eligible.get(name)
        if known is None or known.pool is not pool:
            known = self.eligible[name] = Assessment(pool)
        return known

    @staticmethod
    def _prefer_constrained(pools: list[Pool], out: dict[str, Assessment], pin: Pin) -> None:
        """json_object: pools that can enforce it win when one is available; otherwise
        every pool stays and the format is stripped at dispatch (with a warning). A pin
        to a pool that cannot enforce it while another can is a 400."""
        def capable(pool: Pool) -> bool:
            return pool.config.capabilities.constrained_decoding and pool.healthy_workers > 0

        if not any(capable(p) for p in pools):
            return
        if pin.pool is not None:
            pinned = out[pin.pool].pool
            if not pinned.config.capabilities.constrained_decoding:
                raise InvalidRequest(f"x-specroute-pool: pool '{pin.pool}' cannot serve this "
                                     f"request: it {JSON_OBJECT_PREFERENCE} (another pool "
                                     f"enforces it)", param="x-specroute-pool",
                                     code="unsupported_capability")
            return
        for pool in pools:
            if out[pool.name].excluded is None and not pool.config.capabilities.constrained_decoding:
                out[pool.name] = Assessment(pool, JSON_OBJECT_PREFERENCE)

    def _requirements(self, request: GenerationRequest, profile: RequestProfile, pin: Pin,
                      serving: list[Pool]) -> list[Requirement]:
        """What this request needs of a pool, in the order the errors are reported (built
        only as needed: most requests carry none)."""
        caps: list[Requirement] = []
        if pin.pool is not None:
            caps.append(Requirement("is not the pool pinned by x-specroute-pool",
                                    lambda p: p.name == pin.pool,
                                    lambda: InvalidRequest("unreachable")))
        if request.needs_constrained or profile.needs_constrained:
            caps.append(Requirement(
                "lacks constrained_decoding (response_format)",
                lambda p: p.config.capabilities.constrained_decoding,
                lambda: self._missing("constrained_decoding", "response_format", request)))
        if request.needs_tools or profile.needs_tools:
            caps.append(Requirement("lacks tools", lambda p: p.config.capabilities.tools,
                                    lambda: self._missing("tools", "tools", request)))
        wanted = profile.prompt_tokens + (request.max_tokens or 0)
        for pool in serving:  # built only when some pool is too small: rarely
            if pool.config.capabilities.max_context < wanted:
                caps.append(Requirement(f"has max_context < ~{wanted} tokens needed",
                                        lambda p: p.config.capabilities.max_context >= wanted,
                                        lambda: self._too_long(wanted, request, serving)))
                break
        if pin.k is not None:
            caps.append(Requirement(
                f"has k fixed at launch, not {pin.k}",
                lambda p: p.config.capabilities.per_request_k or p.config.k == pin.k,
                lambda: self._no_k(pin, request)))
        return caps

    @staticmethod
    def _missing(capability: str, param: str, request: GenerationRequest) -> InvalidRequest:
        return InvalidRequest(f"no pool serving '{request.model}' supports {capability} "
                              f"(needed for '{param}')", param=param,
                              code="unsupported_capability")

    @staticmethod
    def _too_long(wanted: int, request: GenerationRequest,
                  serving: list[Pool]) -> InvalidRequest:
        largest = max(p.config.capabilities.max_context for p in serving)
        return InvalidRequest(f"the request needs about {wanted} tokens of context; the "
                              f"largest max_context for '{request.model}' is {largest}",
                              param="max_tokens", code="context_length_exceeded")

    @staticmethod
    def _no_k(pin: Pin, request: GenerationRequest) -> InvalidRequest:
        return InvalidRequest(f"x-specroute-k: no eligible pool serving '{request.model}' "
                              f"takes k per request or runs k={pin.k}",
                              param="x-specroute-k", code="unsupported_capability")

    def route(self, request: GenerationRequest, profile: RequestProfile,
              pin: Pin = NO_PIN) -> tuple[Decision, list[Pool]]:
        """The decision and the pools to try: chosen, fallbacks, then plain pools last."""
        return self.route_assessed(self.assess(request, profile, pin), profile, pin)

    def predictions(self, assessed: list[Assessment], profile: RequestProfile,
                    pin: Pin) -> dict[str, dict]:
        """What the policy predicts for this request on each eligible pool on its own (for
        explain: predict moves no counter), by pool name."""
        out = {}
        for a in assessed:
            if a.excluded is not None:
                continue
            try:
                decision = self.policy.predict(profile, [self._view(a.pool, pin)])
            except ValueError:
                continue
            out[a.pool.name] = {"k": served(decision, a.pool).k,
                                "predicted_accept_length": decision.predicted_accept_length,
                                "predicted_tokens_per_s": decision.predicted_tokens_per_s}
        return out

    def route_assessed(self, assessed: list[Assessment], profile: RequestProfile,
                       pin: Pin, explain: bool = False) -> tuple[Decision, list[Pool]]:
        """As `route`; `explain` asks the policy's side-effect-free `predict`."""
        eligible = [a.pool for a in assessed if a.excluded is None]
        by_name = {p.config.name: p for p in eligible}
        pinned = pin.active
        if pin.pool is not None:
            pool = self.pools[pin.pool]
            decision = Decision(pool=pool.name, method=pool.config.method, k=pool.config.k,
                                reason="pinned by x-specroute-pool", pinned=True)
            if not eligible:
                raise NoHealthyWorker(f"no available worker in pinned pool {pin.pool!r}",
                                      code="no_healthy_worker")
        else:
            if not eligible:
                raise NoHealthyWorker(f"no healthy worker serves model {profile.model!r}",
                                      code="no_healthy_worker")
            # a pinned k is predicted at that k; a pinned request is no policy decision
            decide = self.policy.predict if explain or pinned else self.policy.decide
            views = [p.view() for p in eligible] if pin.k is None else \
                [self._view(p, pin) for p in eligible]
            try:
                decision = decide(profile, views)
            except ValueError as exc:  # the policy found no pool with a healthy worker
                raise NoHealthyWorker(f"no healthy worker serves model {profile.model!r}: "
                                      f"{exc}", code="no_healthy_worker") from exc
        chosen = by_name.get(decision.pool)
        if chosen is None:
            raise NoHealthyWorker(f"policy chose unavailable pool {decision.pool!r}",
                                  code="no_healthy_worker")
        decision = served(decision, chosen, pinned_k=pin.k)
        if decision.pinned != pinned:
            decision = replace(decision, pinned=pinned)
        if len(eligible) == 1:  # nothing to fail over to
            return decision, [chosen]
        rest = [by_name[n] for n in dict.fromkeys(decision.fallbacks)
                if n in by_name and n != chosen.config.name]
        if pin.pool is None:
            rest += [p for p in eligible if p.config.k == 0 and p not in rest
                     and p is not chosen]
            rest.sort(key=lambda p: p.config.k == 0)  # stable: plain pools last
        return decision, [chosen, *rest]

    @staticmethod
    def _view(pool: Pool, pin: Pin) -> PoolView:
        """The pool as the policy sees it; with k pinned, a per-request-k pool runs that k
        only, so the prediction and the reason are for the k actually used."""
        view = pool.view()
        if pin.k is None or not view.per_request_k or view.method == "plain":
            return view
        return replace(view, k=pin.k, per_request_k=False, max_k=pin.k)
