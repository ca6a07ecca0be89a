"""One request's pick: the routing core's admission, answered as endpoints.

The front door's part: the body arrives whole from Envoy (media type checked here, the
rest — size cap, rate limit, JSON, pins, validation, authorization, classification,
route — is `gateway.core.admit`, the token route's own), a subset hint checked as a pin,
then, instead of a dispatch, the endpoints to name to Envoy: the chosen pool's best
available worker, its other available workers, then the router's fallback pools (plain
last), at most `max_endpoints` in all (default `server.max_attempts`, the gateway's own
failover budget; 1 for an ORIGINAL_DST cluster, which takes one endpoint), only
`ip:port` workers and, with a subset hint, only those in the hint; then the pool's
admission slot. Every failure is a `GatewayError`, answered by the caller as an
ImmediateResponse.

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
from dataclasses import dataclass, field

import orjson

from gateway.config import TenantConfig
from gateway.core.admit import Admitted, admit
from gateway.errors import NoHealthyWorker, PermissionDenied
from gateway.http.bodies import check_media_type
from gateway.http.sglang_routes import parse_generate
from gateway.picker.protocol import SUBSET, endpoint_of, subset_header
from gateway.picker.runtime import PickerServices
from gateway.pools import Pool, Worker, served
from gateway.routing.admission import Ticket
from gateway.schemas import GenerationRequest, parse_request
from gateway.telemetry.record import Timer
from gateway.telemetry.spans import NO_TRACE, Trace
from gateway.upstream.adapters.base import worker_params
from policies.types import Decision

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions",
          "/generate": "generate"}
SPEC_DETAILS_ENGINES = frozenset({"sglang", "embedded"})


@dataclass(slots=True)
class Pick:
    """Where a request may go: who asked, the admitted request (None: not a token route,
    e.g. GET /v1/models), the endpoints in the order Envoy is to try them, and what it
    holds until its response ends."""

    tenant: TenantConfig
    trace: Trace = NO_TRACE
    job: Admitted | None = None
    targets: list[tuple[Pool, Worker]] = field(default_factory=list)
    body: bytes | None = None  # the body to send instead of the client's
    ticket: Ticket | None = None
    timer: Timer = field(default_factory=Timer)
    load: int = 0
    workers: int = 1

    @property
    def endpoints(self) -> list[str]:
        return [endpoint_of(w.url) or "" for _, w in self.targets]


def route_of(path: str) -> str | None:
    return ROUTES.get(path.split("?", 1)[0])


def parse(services: PickerServices, route: str, body: object) -> GenerationRequest:
    server = services.config.server
    if route == "generate":
        return parse_generate(body, sorted({p.config.model for p in services.pools.values()}),
                              server)
    return parse_request(body, route, server)  # type: ignore[arg-type]


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


async def place(services: PickerServices, headers: dict[str, str], raw: bytes,
                subset: set[str] | None, pick: Pick, budget: int) -> Pick:
    """Fill `pick` (made at the request's headers, with its tenant, timer and trace) for
    a token route; raises a `GatewayError` for every refusal."""
    route = route_of(headers.get(":path", ""))
    assert route is not None
    media = headers.get("content-type")
    check_media_type(media.encode("latin-1") if media is not None else None)
    job = await admit(services, pick.tenant, headers, raw,
                      lambda body: parse(services, route, body), pick.trace)
    if subset is None and (asked := subset_header(headers)) is not None:
        if not pick.tenant.may_pin:  # a client choosing pods is a pin
            raise PermissionDenied(f"tenant '{pick.tenant.name}' may not pin endpoints "
                                   f"({SUBSET})", param=SUBSET, code="pin_not_allowed")
        subset = asked
    chosen = targets(job.pools, budget, subset)
    if not chosen:
        where = "in the subset hint " if subset is not None else ""
        raise NoHealthyWorker(f"no ready endpoint {where}serves model {job.request.model!r}",
                              code="no_healthy_worker")
    pool, worker = chosen[0]
    job.decision = served(job.decision, pool, why=f"subset hint: {pool.name}"
                          if subset is not None else None)
    with pick.trace.phase("queue wait"):
        ticket = await services.admission.enter(job.decision.pool, pick.tenant,
                                                pick.timer.start)
    pick.job, pick.targets, pick.ticket = job, chosen, ticket
    pick.body = mutated_body(job.request, job.body, pool, job.decision)
    pick.load, pick.workers = pool.outstanding, pool.healthy_workers
    worker.outstanding += 1  # released by the exchange when the response ends
    worker.breaker.begin(time.monotonic())
    return pick


def any_worker(services: PickerServices, budget: int) -> list[tuple[Pool, Worker]]:
    """Where a request that is not a generation goes (`GET /v1/models`, `/health`): the
    first available worker of each pool, up to the attempt budget."""
    return targets(list(services.pools.values()), budget, None)
