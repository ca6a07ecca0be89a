"""One request's pick: the standalone gateway's decision path, answered as endpoints.

The steps are the token route's (`gateway.http.endpoints.TokenEndpoint`), in its order:
authenticate → check the media type and size → rate limit → parse JSON → validate →
authorize → classify → route (policy, SLO hook) → admission; then, instead of a
dispatch, the endpoints to name to Envoy: the chosen pool's best available worker, its
other available workers, then the router's fallback pools (plain last), at most
`max_endpoints` in all (default `server.max_attempts`, the gateway's own failover
budget; 1 for an ORIGINAL_DST cluster, which takes one endpoint), only `ip:port`
workers and, with a subset hint, only those in the hint. Every failure is a
`GatewayError`, answered by the caller as an ImmediateResponse.

The body reaches the worker as the client sent it, except where the picked pool needs
more (a body mutation): a per-request-k pool gets the decided k in `custom_params`
(`worker_params`, as the gateway's adapters send it: never the client's method or k), an SGLang-speaking pool is asked for its
per-request speculation counters (`return_spec_tokens_details`), a stream asks for its
usage chunk (`stream_options.include_usage`, where vLLM puts its speculation metrics),
and a tenant's `max_tokens` cap is written in. Engines fixing k per server need none of it:
the picker chooses among pools, not k.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import orjson

from gateway.config import TenantConfig
from gateway.errors import InvalidRequest, NoHealthyWorker, PayloadTooLarge, PermissionDenied
from gateway.http.endpoints import check_media_type, content_length
from gateway.http.sglang_routes import NATIVE_ENGINES, parse_generate
from gateway.picker.protocol import SUBSET, endpoint_of, subset_header
from gateway.picker.services import PickerServices
from gateway.pools import Pool, Worker
from gateway.routing.admission import Ticket
from gateway.routing.router import Pin
from gateway.schemas import GenerationRequest, parse_request
from gateway.telemetry.record import Timer
from gateway.telemetry.spans import NO_TRACE, Trace
from gateway.tenants.auth import authorize
from gateway.upstream.adapters.base import worker_params
from policies.types import Decision, RequestProfile

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions",
          "/generate": "generate"}
SPEC_DETAILS_ENGINES = frozenset({"sglang", "embedded"})


@dataclass(slots=True)
class Pick:
    """A routed request: who asked, what was decided, where it may go."""

    tenant: TenantConfig
    request: GenerationRequest | None  # None: not a token route (GET /v1/models, ...)
    profile: RequestProfile | None
    decision: Decision | None
    targets: list[tuple[Pool, Worker]]  # in the order Envoy is to try them
    body: bytes | None = None  # the body to send instead of the client's
    ticket: Ticket | None = None
    timer: Timer = field(default_factory=Timer)
    load: int = 0
    workers: int = 1
    trace: Trace = NO_TRACE

    @property
    def endpoints(self) -> list[str]:
        return [endpoint_of(w.url) or "" for _, w in self.targets]


def route_of(path: str) -> str | None:
    return ROUTES.get(path.split("?", 1)[0])


def read_body(services: PickerServices, headers: dict[str, str], raw: bytes) -> object:
    """The JSON body, within the gateway's size cap; 400/413/415 as the gateway answers."""
    check_media_type(headers["content-type"].encode("latin-1")
                     if "content-type" in headers else None)
    limit = services.config.server.max_body_bytes
    declared = content_length(headers["content-length"].encode("latin-1")) \
        if "content-length" in headers else None
    if len(raw) > limit or (declared is not None and declared > limit):
        raise PayloadTooLarge(f"Request body is larger than {limit} bytes",
                              code="request_too_large")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}",
                             code="invalid_json") from exc


def parse(services: PickerServices, route: str, body: object) -> GenerationRequest:
    if route == "generate":
        return parse_generate(body, sorted({p.config.model for p in services.pools.values()}))
    return parse_request(body, route)  # type: ignore[arg-type]


def targets(pools: list[Pool], budget: int, subset: set[str] | None
            ) -> list[tuple[Pool, Worker]]:
    """Available workers, best first (`Pool.pick`: least outstanding, power of two),
    pool by pool in the router's order, at most `budget`."""
    out: list[tuple[Pool, Worker]] = []
    tried: set[str] = set()
    for pool in pools:
        while len(out) < budget:
            worker = pool.pick(tried)
            if worker is None:
                break
            tried.add(worker.url)
            endpoint = endpoint_of(worker.url)
            if endpoint is not None and (subset is None or endpoint in subset):
                out.append((pool, worker))
    return out


def served_decision(decision: Decision, pool: Pool, why: str) -> Decision:
    """The decision as run on `pool` (a fallback or the subset's): the dispatcher's
    failover rewrite (`gateway.upstream.dispatch`)."""
    if pool.name == decision.pool:
        return decision
    return replace(decision, pool=pool.name, method=pool.config.method,
                   k=pool.config.run_k(decision.k), reason=f"{decision.reason}; {why}")


def mutated_body(request: GenerationRequest, original: object, pool: Pool,
                 decision: Decision) -> bytes | None:
    """The body the picked pool needs (module docstring), or None to send the client's."""
    if request.native is not None:  # /generate: SGLang's own body, spec counters included
        return None
    body = dict(request.body)
    params = worker_params(body.pop("custom_params", None), pool.config, decision.k)
    if params is not None:
        body["custom_params"] = params
    if pool.config.engine in SPEC_DETAILS_ENGINES and "return_spec_tokens_details" not in body:
        body["return_spec_tokens_details"] = True
    if request.stream and not request.include_usage:
        options = body.get("stream_options")
        body["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                  "include_usage": True}
    return None if body == original else orjson.dumps(body)


async def decide(services: PickerServices, headers: dict[str, str], raw: bytes,
                 subset: set[str] | None, pick: Pick, budget: int) -> Pick:
    """Fill `pick` (made at the request's headers, with its tenant, timer and trace) for
    a token route; raises a `GatewayError` for every refusal."""
    route = route_of(headers.get(":path", ""))
    assert route is not None
    trace = pick.trace
    body = read_body(services, headers, raw)
    with trace.phase("rate limit"):
        await services.limits.admit(pick.tenant)
    request = parse(services, route, body)
    pin = Pin.from_headers(headers.get("x-specroute-pool"), headers.get("x-specroute-k"),
                           headers.get("x-specroute-benchmark"))
    authorize(pick.tenant, request, pin)
    if subset is None and (asked := subset_header(headers)) is not None:
        if not pick.tenant.may_pin:  # a client choosing pods is a pin
            raise PermissionDenied(f"tenant '{pick.tenant.name}' may not pin endpoints "
                                   f"({SUBSET})", param=SUBSET, code="pin_not_allowed")
        subset = asked
    with trace.phase("classify"):
        profile = services.router.classify(request, pick.tenant.name)
    with trace.phase("decide"):
        decision, pools = services.router.route(request, profile, pin)
    if route == "generate":
        pools = [p for p in pools if p.config.engine in NATIVE_ENGINES]
        if not pools:
            raise InvalidRequest(f"POST /generate needs a pool of engine sglang or embedded "
                                 f"serving {request.model!r}", param="model",
                                 code="unsupported_capability")
    chosen = targets(pools, budget, subset)
    if not chosen:
        where = "in the subset hint " if subset is not None else ""
        raise NoHealthyWorker(f"no ready endpoint {where}serves model {request.model!r}",
                              code="no_healthy_worker")
    pool, worker = chosen[0]
    decision = served_decision(decision, pool, f"subset hint: {pool.name}"
                               if pool.name != decision.pool and subset is not None
                               else f"failover to {pool.name}")
    with trace.phase("queue wait"):
        ticket = await services.admission.enter(decision.pool, pick.tenant, pick.timer.start)
    pick.request, pick.profile, pick.decision, pick.targets = request, profile, decision, chosen
    pick.body, pick.ticket = mutated_body(request, body, pool, decision), ticket
    pick.load, pick.workers = pool.outstanding, pool.healthy_workers
    worker.outstanding += 1  # released by the exchange when the response ends
    worker.breaker.begin(time.monotonic())
    return pick


def any_worker(services: PickerServices, budget: int) -> list[tuple[Pool, Worker]]:
    """Where a request that is not a generation goes (`GET /v1/models`, `/health`): the
    first available worker of each pool, up to the attempt budget."""
    return targets(list(services.pools.values()), budget, None)
