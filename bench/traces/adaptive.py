"""specroute's shipped decision on the trace world, driven the way the gateway drives it.

Per request, in the sequence's order: the OpenAI body (the prompt's messages, greedy,
its recorded output length as `max_tokens`) is validated by `gateway.schemas.
parse_request` and profiled by `gateway.classifier.classify.classify`, the call admission
makes (`gateway.core.admit`), so whatever the profile carries (a per-request prediction
included) reaches the policy; `policies.decision.Policy` (what `LearnedRoutingPolicy`
runs, on an in-process store, its shipped `PolicyConfig` but for the seed) decides over
the launched pools' `PoolView`s (one worker each, B - 1 requests in flight); the pool
serves it as a fixed-k server does (`gateway.pools.served`: the launch k); the finished
request goes back through `gateway.telemetry.record.request_record`, built from what
the worker would report (usage, verify steps counted as SGLang's `spec_verify_ct`, the
prefill's forward included, accepted and proposed drafts; the embedded engine also its
batch and decode seconds), into `Policy.observe`. The store's clock is simulated: each
request moves it by its GPU-seconds (decode seconds / B); the policy refits every
`REFIT_EVERY_S` of it (the gateway refits about every second), at least once per
`REFIT_EVERY_REQUESTS` requests. `adaptive` scores the whole sequence, learning from a
cold start; with a `warmup` sequence served first (not scored), its steady state.

Embedded pools start from what their workers publish (measured.json, `set_worker_prior`),
as `specroute up` does; the H100 pools (SGLang/vLLM servers) start from nothing.

`per_request_k`: the pools are the embedded engine's as `specroute up` launches them, one
per method with its default k, k chosen per request (`PoolView.per_request_k`, up to the
recorded k): the request is served at the decision's k (0: a plain step on that worker).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from bench.traces.fleets import PLAIN, Costs, PoolSpec, view
from bench.traces.world import MEASURED
from gateway.classifier.classify import classify
from gateway.config import TenantConfig
from gateway.schemas import GenerationRequest, parse_request
from gateway.telemetry.record import Outcome, Timer, request_record
from gateway.telemetry.worker_stats import SpecStats, Usage
from policies.decision import Policy, PolicyConfig
from policies.methods import default_k
from policies.predictor import Predictor
from policies.prior import Measured, WorkerPrior
from policies.telemetry import LocalTelemetry
from policies.types import Decision, PoolView, RequestProfile

REFIT_EVERY_S = 1.0
REFIT_EVERY_REQUESTS = 16
ENGINE = {"h100": "sglang", "embedded": "embedded"}
TENANT = TenantConfig(name="default")


def body(prompt: dict, max_tokens: int, model: str) -> dict:
    return {"model": model, "messages": prompt["messages"], "temperature": 0,
            "max_tokens": max_tokens}


def profile_of(prompt: dict, max_tokens: int, model: str, predictor: Predictor | None = None
               ) -> tuple[RequestProfile, GenerationRequest]:
    """The gateway's profile of the prompt (and the parsed request)."""
    request = parse_request(body(prompt, max_tokens, model), "chat")
    return classify(request, TENANT.name, predictor=predictor), request


Probe = Callable[[str, Policy, RequestProfile, list[PoolView], Decision], None]


@dataclass(slots=True)
class Run:
    """One adaptive replicate: its score and what it decided."""

    score: float
    decisions: list[Decision] = field(default_factory=list)
    policy: Policy | None = None


def per_request_view(method: str, max_k: int) -> PoolView:
    """An embedded pool of `method` as `specroute up` launches it: k per request."""
    k = 0 if method == "plain" else default_k(method)
    return PoolView(name=f"embedded-{method}", engine="embedded", method=method, k=k,
                    per_request_k=method != "plain", healthy_workers=1, outstanding=0,
                    max_k=max_k)


def adaptive(costs: Costs, sequence: Sequence[str], prompts: dict[str, dict],
             pools: Sequence[PoolSpec], world: str, seed: int, model: str,
             warmup: Sequence[str] = (), probe: Probe | None = None,
             per_request_k: int = 0, measured: Measured | None = None,
             unit: str = "class", predictor: Predictor | None = None) -> Run:
    """The policy serves `warmup` (learning, not scored), then `sequence` (scored);
    `probe` sees each scored request's decision before it is served (bench/traces/
    diagnose.py). `per_request_k` > 0: the pools' methods as per-request-k pools with that
    largest k (module docstring). `measured`: the embedded workers' measured.json in place
    of the shipped one. `unit`: `PolicyConfig.learning_unit`; `predictor`: the drafter
    predictor in place of the shipped one (a split check fits its own)."""
    engine = ENGINE[world]
    now = [0.0]
    store = LocalTelemetry(PolicyConfig().decay_tau_s, clock=lambda: now[0])
    policy = Policy(store, PolicyConfig(seed=seed, learning_unit=unit))
    if per_request_k:
        views = [replace(per_request_view(p.method, per_request_k), outstanding=costs.batch - 1)
                 for p in pools]
        by_name = {v.name: PoolSpec(v.method, v.k) for v in views}
    else:
        views = [view(p, costs.batch, engine) for p in pools]
        by_name = {p.name: p for p in pools}
    if engine == "embedded" and measured is None:
        with open(MEASURED) as handle:
            measured = Measured.from_dict(json.load(handle))
    if measured is not None:
        for v in views:
            if v.method != "plain":
                policy.set_worker_prior(v.name,
                                        WorkerPrior.from_measured(model, v.method, measured))
    tokens = seconds = 0.0
    run = Run(0.0, policy=policy)
    next_refit, since = 0.0, 0
    for position, rid in enumerate([*warmup, *sequence]):
        scored = position >= len(warmup)
        if now[0] >= next_refit or since >= REFIT_EVERY_REQUESTS:
            policy.refit()
            next_refit, since = now[0] + REFIT_EVERY_S, 0
        output = costs.traces[rid]["plain"].output_tokens
        profile, request = profile_of(prompts[rid], output, model, predictor)
        decision = policy.decide(profile, views)
        pool = by_name[decision.pool]
        if per_request_k:  # served at the decision's k; 0 is a plain step on that worker
            pool = PoolSpec(pool.method, decision.k) if decision.k > 0 else PLAIN
        else:
            decision = replace(decision, k=pool.k)  # a fixed-k server runs its launch k
        if probe is not None and scored:
            probe(rid, policy, profile, views, decision)
        served = costs(rid, pool)
        trace = costs.traces[rid]["plain" if pool.method == "plain" else pool.method]
        end = served.prefill_s + served.decode_s
        spec = SpecStats(
            verify_steps=served.steps + 1, accept_length=(served.tokens + 1) / (served.steps + 1),
            correct_drafts=served.accepted, proposed_drafts=served.drafted,
            batch=float(costs.batch) if engine == "embedded" else None,
            batch_draft_tokens=(costs.batch * served.drafted / max(served.steps, 1)
                                if engine == "embedded" else None),
            decode_s=served.decode_s,
            accept_histogram=served.histogram if pool.method != "plain" else None)
        outcome = Outcome(request=request, profile=profile, tenant=TENANT,
                          decision=decision, timer=Timer(start=0.0, first_token=0.0),
                          load=costs.batch - 1, workers=1,
                          usage=Usage(trace.prompt_tokens, served.tokens + 1),
                          spec=spec, ok=True, finish_reason="length")
        record, _ = request_record(outcome, end)
        now[0] += served.decode_s / costs.batch
        record.timestamp = now[0]
        policy.observe(record)
        since += 1
        if scored:
            run.decisions.append(decision)
            tokens += served.tokens
            seconds += served.decode_s
    run.score = tokens * costs.batch / seconds if seconds else 0.0
    return run
