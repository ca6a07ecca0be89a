"""The admission pipeline, written once for both front doors.

One generation request, in order: (the front door has authenticated it, checked its
media type and read its body) → size cap → rate limit → parse JSON → read pins →
validate → authorize → classify → route (SGLang's native body: to the pools that speak
it) → with `queue`, a slot in the chosen pool (`gateway.routing.admission`). Every
refusal is a `GatewayError`, answered by the front door (an OpenAI-shaped error, or
Envoy's ImmediateResponse). What comes out, `Admitted`, carries a final decision
(`gateway.pools.served`) and the pools to try. The picker queues itself, after it has
moved to a pool its subset hint allows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.config import TenantConfig
from gateway.core.services import Core
from gateway.errors import InvalidRequest, body_too_large, invalid_json
from gateway.pins import NO_PIN, Pin
from gateway.pools import Pool
from gateway.routing.admission import Ticket
from gateway.routing.router import Assessment
from gateway.schemas import GenerationRequest
from gateway.telemetry.spans import NO_TRACE, Trace, request_attributes
from gateway.tenants.auth import authorize
from policies.types import Decision, RequestProfile

NATIVE_ENGINES = frozenset({"sglang", "embedded"})  # the engines that speak `/generate`


@dataclass(slots=True)
class Admitted:
    """A request that passed every check and has a route."""

    tenant: TenantConfig
    request: GenerationRequest
    profile: RequestProfile
    decision: Decision
    pools: list[Pool]
    body: Any  # the JSON the client sent (`Any`: mypyc builds a field typed `object`
    # into a module that fails at import, KeyError 'object')
    pin: Pin
    trace: Trace = NO_TRACE
    assessed: list[Assessment] | None = None  # every pool's eligibility (explain only)
    ticket: Ticket | None = None  # its slot in the pool (`queue`), left by the front door


def native_pools(request: GenerationRequest, pools: list[Pool]) -> list[Pool]:
    """SGLang's native body (`POST /generate`) goes only to pools that speak it."""
    native = [p for p in pools if p.config.engine in NATIVE_ENGINES]
    if not native:
        raise InvalidRequest(f"POST /generate needs a pool of engine sglang or embedded "
                             f"serving {request.model!r}", param="model",
                             code="unsupported_capability")
    return native


async def admit(core: Core, tenant: TenantConfig, headers: Mapping[str, str], raw: bytes,
                parse: Callable[[object], GenerationRequest], trace: Trace = NO_TRACE,
                *, explain: bool = False, queue: float | None = None) -> Admitted:
    """Run the pipeline (module docstring) on a body read in full; `headers` by
    lowercase name (the pins are read from them); `parse` validates the JSON for the
    route. `explain` routes with the policy's side-effect-free `predict` and keeps every
    pool's assessment; `queue` (the request's start, `time.monotonic()`) waits for a
    slot in the chosen pool (a 429 when shed)."""
    server = core.config.server
    if len(raw) > server.max_body_bytes:
        raise body_too_large(server.max_body_bytes)
    with trace.phase("rate limit"):
        await core.limits.admit(tenant)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_json(exc) from exc
    pin = Pin.from_headers(headers.get("x-specroute-pool"), headers.get("x-specroute-k"),
                           headers.get("x-specroute-benchmark")) if headers else NO_PIN
    request = parse(body)
    request_attributes(trace, request, server.otel_capture_content)
    authorize(tenant, request, pin)
    with trace.phase("classify"):
        profile = core.classify(request, tenant.name)
    router = core.router
    with trace.phase("decide"):
        assessed = router.assess(request, profile, pin)
        decision, pools = router.route_assessed(assessed, profile, pin, explain=explain)
    if request.native is not None:
        pools = native_pools(request, pools)
    job = Admitted(tenant, request, profile, decision, pools, body, pin, trace,
                   assessed if explain else None)
    if queue is not None:
        with trace.phase("queue wait"):
            job.ticket = await core.admission.enter(decision.pool, tenant, queue)
        trace.set("specroute.queued_ms", round(job.ticket.queued_s * 1000, 3))
    return job
