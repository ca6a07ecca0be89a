"""Which pool serves a request: filter by model and capability, then ask a policy.

The `PoolRouter` owns the facts (which pools serve the model, which can do constrained
decoding or tools, which fit the prompt, which have an available worker); the choice
among the remaining pools is a pluggable `decide(profile, pools) -> Decision` from
`policies/` (the learned `policies.decision.Policy`, or `policies.rules`); a policy that
finds no pool with a healthy worker raises ValueError, answered 503 here.
A `Pin` from the `x-specroute-pool` / `x-specroute-k` headers overrides the policy
for benchmarks and debugging; capability checks still apply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

from gateway.classifier.minimal import minimal_profile
from gateway.errors import InvalidRequest, ModelNotFound, NoHealthyWorker, traceback_text
from gateway.pools import Pool
from gateway.schemas import GenerationRequest
from policies.rules import first_healthy
from policies.types import Decision, PoolView, RequestProfile

log = logging.getLogger("specroute.gateway")
Decide = Callable[[RequestProfile, list[PoolView]], Decision]
Classify = Callable[[GenerationRequest, str], RequestProfile]
MAX_PINNED_K = 16
JSON_OBJECT_PREFERENCE = ("lacks constrained_decoding, preferred for response_format "
                          "json_object")


@dataclass(frozen=True, slots=True)
class Pin:
    """Routing forced (`x-specroute-pool`, `x-specroute-k`) or traffic marked
    (`x-specroute-benchmark`) by request headers; empty by default. Any of them makes the
    request a benchmark: its record is marked `pinned` and does not teach the policy."""

    pool: str | None = None
    k: int | None = None
    benchmark: bool = False

    @property
    def active(self) -> bool:
        return self.pool is not None or self.k is not None or self.benchmark

    @classmethod
    def from_headers(cls, pool: str | None, k: str | None,
                     benchmark: str | None = None) -> Pin:
        return cls(pool=pool or None, k=None if k is None else parse_pinned_k(k),
                   benchmark=benchmark is not None and benchmark.strip() not in ("", "0"))


def parse_pinned_k(text: str) -> int:
    """ASCII digits only: `str.isdigit` accepts '²' or Arabic-Indic digits, which `int`
    then refuses or reads as another number."""
    value = text.strip(" \t")  # HTTP optional whitespace; not str.strip's Unicode set
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_PINNED_K:
        raise InvalidRequest(f"x-specroute-k must be an integer 0..{MAX_PINNED_K}, "
                             f"got {text!r}", param="x-specroute-k", code="invalid_value")
    return int(value)


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
    """`decide` routes live requests; `predict` (default: `decide`) is the policy's pure
    ranking, used by explain, which must move no counter, RNG or exploration budget."""

    def __init__(self, pools: dict[str, Pool], decide: Decide = first_healthy,
                 classify: Classify = minimal_profile, predict: Decide | None = None) -> None:
        self.pools = pools
        self.decide = decide
        self.predict = predict or decide
        self.classifier = classify
        self._classifier_failed = False

    def classify(self, request: GenerationRequest, tenant: str) -> RequestProfile:
        """The classifier's profile; a classifier bug must not fail a valid request, so
        it degrades to the minimal profile (logged with its traceback the first time)."""
        try:
            return self.classifier(request, tenant)
        except Exception as exc:  # noqa: BLE001 - any classifier failure: route on the basics
            if not self._classifier_failed:
                self._classifier_failed = True
                log.error("request classifier failed; using the minimal profile: %s",
                          traceback_text(exc))  # not the message: it may quote the prompt
            return minimal_profile(request, tenant)

    def assess(self, request: GenerationRequest, profile: RequestProfile,
               pin: Pin = Pin()) -> list[Assessment]:
        """Every pool, excluded with a reason or eligible; raises when none is eligible,
        naming the first requirement no pool of the model meets."""
        out = {name: Assessment(pool) for name, pool in self.pools.items()}
        serving = [p for p in self.pools.values() if p.config.model == request.model]
        if not serving:
            raise ModelNotFound(f"The model '{request.model}' does not exist",
                                param="model", code="model_not_found")
        for pool in self.pools.values():
            if pool.config.model != request.model:
                out[pool.name] = Assessment(pool, f"serves model '{pool.config.model}'")
        if pin.pool is not None and pin.pool not in {p.name for p in serving}:
            raise InvalidRequest(f"x-specroute-pool: no pool named '{pin.pool}' serves "
                                 f"model '{request.model}'", param="x-specroute-pool",
                                 code="unknown_pool")
        remaining = serving
        for why, keep, error in self._requirements(request, profile, pin, serving):
            if all(keep(p) for p in remaining):  # the usual case: nothing to exclude
                continue
            kept = [p for p in remaining if keep(p)]
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
        only as needed: most requests carry just the context-length one)."""
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
        caps.append(Requirement(f"has max_context < ~{wanted} tokens needed",
                                lambda p: p.config.capabilities.max_context >= wanted,
                                lambda: self._too_long(wanted, request, serving)))
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
              pin: Pin = Pin()) -> tuple[Decision, list[Pool]]:
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
                decision = self.predict(profile, [self._view(a.pool, pin)])
            except ValueError:
                continue
            out[a.pool.name] = {"k": a.pool.config.run_k(decision.k),
                                "predicted_accept_length": decision.predicted_accept_length,
                                "predicted_tokens_per_s": decision.predicted_tokens_per_s}
        return out

    def route_assessed(self, assessed: list[Assessment], profile: RequestProfile,
                       pin: Pin, explain: bool = False) -> tuple[Decision, list[Pool]]:
        """As `route`; `explain` asks the policy's side-effect-free `predict`."""
        eligible = [a.pool for a in assessed if a.excluded is None]
        by_name = {p.name: p for p in eligible}
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
            decide = self.predict if explain or pin.active else self.decide
            try:
                decision = decide(profile, [self._view(p, pin) for p in eligible])
            except ValueError as exc:  # the policy found no pool with a healthy worker
                raise NoHealthyWorker(f"no healthy worker serves model {profile.model!r}: "
                                      f"{exc}", code="no_healthy_worker") from exc
        chosen = by_name.get(decision.pool)
        if chosen is None:
            raise NoHealthyWorker(f"policy chose unavailable pool {decision.pool!r}",
                                  code="no_healthy_worker")
        decision = self._with_k(decision, chosen, pin)
        if decision.pinned != pin.active:
            decision = replace(decision, pinned=pin.active)
        rest = [by_name[n] for n in dict.fromkeys(decision.fallbacks)
                if n in by_name and n != chosen.name]
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

    @staticmethod
    def _with_k(decision: Decision, pool: Pool, pin: Pin) -> Decision:
        if not pool.config.capabilities.per_request_k:  # k is fixed at launch
            k = pool.config.run_k(decision.k)
            return decision if decision.k == k else replace(decision, k=k)
        if pin.k is None:
            return decision
        if decision.k == pin.k:
            return replace(decision, reason=f"{decision.reason}; k pinned by x-specroute-k")
        return replace(decision, k=pin.k, reason=f"{decision.reason}; k={pin.k} pinned by "
                       f"x-specroute-k")
