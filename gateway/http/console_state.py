"""What `GET /v1/console/state` answers: the gateway's state as the console draws it.

One JSON document, built from what the gateway already holds in process (no I/O here):
the routing policy's side-effect-free `predict` for each request class, the recent
traffic (`gateway.telemetry.recent`), the tenant counters (`TenantMetrics`), the pools
and their workers, the fleet planner's latest plan, and the registry facts the console
reads from Redis off the request path (`gateway.http.console.RegistryFacts`). It never
holds a prompt, an output or a key: none of its sources does. The decisions stay frozen
dataclasses, which orjson writes as objects.

Sections: `gateway` (policy, models, sampling), `routing` (a row per model x task x
temperature bucket: the pool, method and k chosen now, predicted and observed tokens/s,
the reason), `pools` (per pool: the prior the policy started from and the samples of the
last hour), `tenants` (SLO targets, attainment, TTFT / TPOT percentiles, shed and
rate-limited counts), `fleet` (per model: workers per pool now and planned, relaunches,
unhealthy workers, open breakers) and `decisions` (the last requests, newest first).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.core.planning import FleetPlanning
from gateway.http.gateway import Gateway
from gateway.pools import BreakerState, Pool, served
from gateway.routing.policy import LearnedRoutingPolicy
from gateway.telemetry.recent import RecentTraffic, Tally
from gateway.telemetry.series import Counter
from gateway.telemetry.tenant_metrics import TenantMetrics
from gateway.tenants.auth import DEFAULT_TENANT
from policies.acceptance import TEMPERATURE_BUCKETS
from policies.learner import PolicyState
from policies.protocol import RoutingPolicy
from policies.telemetry import LocalTelemetry
from policies.types import TASKS, RequestProfile

# a temperature inside each bucket (`policies.types.temperature_bucket`)
BUCKET_TEMPERATURE = {"t0": 0.0, "tlow": 0.5, "thigh": 1.0}
# the request a class's row is predicted for: a typical chat turn
TABLE_PROMPT_TOKENS = 256
TABLE_MAX_TOKENS = 256


@dataclass(frozen=True, slots=True)
class RegistryFacts:
    """What the console read from Redis last (`gateway.http.console`): the k each
    registered worker runs, each fixed-k pool's desired k, each model's moving worker."""

    running_k: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # pool -> url -> k
    desired_k: Mapping[str, int] = field(default_factory=dict)
    moving: Mapping[str, dict] = field(default_factory=dict)  # model -> {url, src, dst, since}
    read_at: float | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ConsoleSources:
    gateway: Gateway
    routing: RoutingPolicy
    planning: FleetPlanning | None
    recent: RecentTraffic
    tenant_metrics: TenantMetrics
    prior_sources: Mapping[str, str]  # pool -> where its workers' prior came from
    registry: RegistryFacts
    started: float  # unix time the gateway started


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def policy_state(routing: RoutingPolicy) -> PolicyState | None:
    return routing.policy.state if isinstance(routing, LearnedRoutingPolicy) else None


def routing_table(sources: ConsoleSources) -> list[dict]:
    """Per model x task x temperature bucket, what the policy picks now among the model's
    available pools (its `predict`: no counter, RNG draw or exploration moves). The
    request-specific filters (constrained decoding, tools, context length) are not
    applied: a row says what an ordinary request of the class gets."""
    gateway, recent = sources.gateway, sources.recent
    rows = []
    for model in gateway.config.models:
        pools = [p for p in gateway.pools.values() if p.config.model == model]
        views = [p.view() for p in pools if p.healthy_workers > 0]
        for task in TASKS:
            for bucket in TEMPERATURE_BUCKETS:
                row: dict = {"model": model, "task": task, "temperature_bucket": bucket}
                if not views:
                    rows.append({**row, "pool": None, "reason": "no available worker"})
                    continue
                profile = RequestProfile(task=task, temperature=BUCKET_TEMPERATURE[bucket],
                                         top_p=1.0, prompt_tokens=TABLE_PROMPT_TOKENS,
                                         max_tokens=TABLE_MAX_TOKENS, stream=True,
                                         tenant=DEFAULT_TENANT.name, model=model)
                try:
                    decision = gateway.router.policy.predict(profile, views)
                except ValueError as exc:
                    rows.append({**row, "pool": None, "reason": str(exc)})
                    continue
                pool = gateway.pools.get(decision.pool)
                k = served(decision, pool).k if pool is not None else decision.k
                seen = recent.observed(model, task, bucket, decision.pool)
                rows.append({**row, "pool": decision.pool, "method": decision.method, "k": k,
                             "predicted_accept_length": _round(decision.predicted_accept_length),
                             "predicted_tokens_per_s": _round(decision.predicted_tokens_per_s),
                             **observed(seen), "reason": decision.reason})
    return rows


def observed(tally: Tally) -> dict:
    return {"observed_requests": tally.requests,
            "observed_accept_length": _round(tally.accept_length),
            "observed_tokens_per_s": _round(tally.tokens_per_s)}


def pool_prior(state: PolicyState | None, pool: Pool, source: str | None) -> dict:
    """The accept length at the pool's k that the policy started from: what its workers
    measured (the class mean), else the learner's flat default; plain is 1 by definition."""
    method, k, model = pool.config.method, pool.config.k, pool.config.model
    if method == "plain" or k == 0:
        return {"accept_length": 1.0, "a": None, "source": "plain: one token per step"}
    if state is None:
        return {"accept_length": None, "a": None, "source": "no learned policy"}
    measured = [a for t in TASKS for b in TEMPERATURE_BUCKETS
                if (a := state.prior.get((model, method, t, b))) is not None]
    a = statistics.fmean(measured) if measured else state.default_accept
    where = source or ("the workers' measurement" if measured
                       else f"the learner's flat default a={state.default_accept:g}")
    return {"accept_length": round(state.accept_length(a, method, k), 3), "a": round(a, 4),
            "source": where}


def _drafts(drafts: dict[str, tuple[int, int]] | None) -> dict | None:
    """A hybrid pool's last hour per branch: {branch: {"steps", "accepted"}}; None: none."""
    if not drafts:
        return None
    return {b: {"steps": steps, "accepted": accepted}
            for b, (steps, accepted) in sorted(drafts.items())}


def pools_section(sources: ConsoleSources) -> list[dict]:
    state = policy_state(sources.routing)
    out = []
    for name, pool in sources.gateway.pools.items():
        learned = state.pool_accept_length.get(name) if state is not None else None
        out.append({"pool": name, "model": pool.config.model, "engine": pool.config.engine,
                    "method": pool.config.method, "k": pool.config.k,
                    "per_request_k": pool.config.capabilities.per_request_k,
                    "prior": pool_prior(state, pool, sources.prior_sources.get(name)),
                    "learned_accept_length": _round(learned, 3),
                    "drafts": _drafts(sources.recent.drafts(name)),
                    "samples": [s.to_dict() for s in sources.recent.samples(name)]})
    return out


def counter_values(counter: Counter, *labels: str) -> dict[tuple[str, ...], float]:
    """A labelled counter's totals by the values of `labels` (summed over the others)."""
    out: dict[tuple[str, ...], float] = {}
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = tuple(sample.labels.get(label, "") for label in labels)
                out[key] = out.get(key, 0.0) + sample.value
    return out


def tenants_section(sources: ConsoleSources) -> list[dict]:
    metrics, recent = sources.tenant_metrics, sources.recent
    outcomes = counter_values(metrics.requests, "tenant", "outcome")
    shed = counter_values(metrics.shed_total, "tenant")
    limited = counter_values(metrics.limited_total, "tenant")
    configured = dict(sources.gateway.auth.by_name) or {DEFAULT_TENANT.name: DEFAULT_TENANT}
    names = sorted(set(configured) | set(recent.tenants())
                   | {key[0] for key in (*outcomes, *shed, *limited)})
    out = []
    for name in names:
        tenant = configured.get(name) or sources.gateway.auth.named(name)
        out.append({"tenant": name, "priority": tenant.priority,
                    "slo_ttft_ms": tenant.slo_ttft_ms, "slo_tpot_ms": tenant.slo_tpot_ms,
                    "rate_limit_rpm": tenant.rate_limit_rpm,
                    "rate_limit_tpm": tenant.rate_limit_tpm,
                    **{key: _round(value) for key, value in
                       recent.tenant_latency(name).to_dict().items()},
                    **{f"{outcome}_total": int(outcomes.get((name, outcome), 0))
                       for outcome in ("met", "missed", "failed")},
                    "shed": int(shed.get((name,), 0)),
                    "rate_limited": int(limited.get((name,), 0))})
    return out


def _fleet_pool(pool: Pool, sources: ConsoleSources, planned: int | None, now: float) -> dict:
    facts = sources.registry
    workers = pool.workers
    running = dict(facts.running_k.get(pool.name, {}))
    desired = facts.desired_k.get(pool.name)
    store = getattr(sources.routing, "store", None)
    if desired is None and isinstance(store, LocalTelemetry):
        desired = store.desired_k.get(pool.name)
    fixed = not pool.config.capabilities.per_request_k and pool.config.method != "plain"
    relaunch = None
    if fixed and desired is not None:
        now_k = sorted(set(running.values())) or [pool.config.k]
        if now_k != [desired]:
            relaunch = f"k {','.join(map(str, now_k))} -> {desired}"
    admission = sources.gateway.admission
    queue = admission.queues.get(pool.name) if admission is not None else None
    return {"pool": pool.name, "engine": pool.config.engine, "method": pool.config.method,
            "k": pool.config.k, "running_k": running, "desired_k": desired if fixed else None,
            "workers": len(workers), "available": pool.healthy_workers, "planned": planned,
            "outstanding": pool.outstanding,
            "queued": len(queue.waiting) if queue is not None else 0,
            "relaunch": relaunch,
            "unhealthy": [w.url for w in workers if not w.healthy],
            "draining": [w.url for w in workers if w.draining],
            "open_breakers": [{"url": w.url, "state": w.breaker.state(now).value}
                              for w in workers
                              if w.breaker.state(now) is not BreakerState.CLOSED]}


def fleet_section(sources: ConsoleSources) -> list[dict]:
    planning, facts = sources.planning, sources.registry
    plans = planning.plans if planning is not None else {}
    now = time.monotonic()
    out = []
    for model in sources.gateway.config.models:
        plan = plans.get(model)
        pools = [p for p in sources.gateway.pools.values() if p.config.model == model]
        out.append({
            "model": model,
            "planner": "on" if planning is not None else "off (it needs redis_url and the "
                                                          "learned policy)",
            "planned_at": planning.planned_at if planning is not None else None,
            "reason": plan.reason if plan is not None else None,
            "adopted": plan.adopted if plan is not None else None,
            "predicted_gain": round(plan.gain, 4) if plan is not None else None,
            "moving": facts.moving.get(model),
            "pools": [_fleet_pool(p, sources, plan.desired.get(p.name) if plan else None, now)
                      for p in pools]})
    return out


def console_state(sources: ConsoleSources) -> dict:
    recent = sources.recent
    registry = sources.registry
    return {
        "gateway": {"policy": sources.routing.name, "models": list(sources.gateway.config.models),
                    "now": time.time(), "uptime_s": round(time.time() - sources.started, 1),
                    "sample_interval_s": recent.config.sample_interval_s,
                    "span_s": recent.config.span_s,
                    "registry_read_at": registry.read_at, "registry_error": registry.error},
        "routing": routing_table(sources),
        "pools": pools_section(sources),
        "tenants": tenants_section(sources),
        "fleet": fleet_section(sources),
        "decisions": recent.decisions(),
    }
