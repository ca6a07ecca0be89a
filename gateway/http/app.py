"""The gateway ASGI application: routes, lifespan, and the error handler.

`create_app(config)` builds a Starlette app. The lifespan owns the long-lived
resources: the `Http1Client` that carries every generation call to the workers (kept
connections, the server's three deadlines), ONE `aiohttp.ClientSession` for the rest
(probes, scrapes, `/server_info`), the health monitor, the Redis worker
discovery (when `redis_url` is set), the classifier model, the tracer provider and the
routing policy (`gateway.routing.policy`: the learned policy and its telemetry store by
default). The token routes are raw ASGI (`gateway.http.endpoints`); the rest are plain
Starlette routes, where speed does not matter.

Faults: a `GatewayError` becomes its OpenAI-shaped answer where it is raised; anything
else is a bug, answered by `GatewayApp` (fast routes) or the `Exception` handler
(Starlette routes) with a 500 `internal_error` carrying a request id, under which the
traceback is logged: frames and the exception's type only, since an exception's message
may quote the request (its prompt, its key).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, ProcessCollector
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.classifier.minimal import Classify
from gateway.config import GatewayConfig
from gateway.core.planning import fleet_planning
from gateway.core.services import bounded_stop
from gateway.errors import GatewayError, shutting_down
from gateway.http.console import Console, console_asset, console_page, console_state_json
from gateway.http.endpoints import ExplainEndpoint, TokenEndpoint
from gateway.http.faults import SentWatch, gateway_error, http_error, internal_fault, log_fault
from gateway.http.gateway import Gateway
from gateway.http.openapi import openapi_document
from gateway.http.routes import (
    get_model,
    health,
    list_models,
    metrics,
    openapi_json,
    ready,
    routing_fleet,
)
from gateway.http.sglang_routes import GenerateEndpoint, health_generate, model_info, server_info
from gateway.telemetry.loop_lag import LoopLagProbe
from gateway.telemetry.prometheus import HttpMetrics, Recorder
from gateway.tenants.limits import LimitsCollector
from policies.protocol import DecideFn, RoutingPolicy, Rule

GIL_SWITCH_S = 0.001  # see the lifespan

log = logging.getLogger("specroute.gateway")
access_log = logging.getLogger("specroute.access")


class GatewayApp(Starlette):
    """Starlette with a front door for the token routes: a `POST` to one of them goes
    straight to its raw ASGI endpoint, skipping the middleware stack and the route
    table (each endpoint turns every `GatewayError` into a response itself). Everything
    else, including a wrong method on a token route (405), is plain Starlette. Any other
    exception, from either, is a bug: logged and answered here (`log_fault`)."""

    def __init__(self, *, fast_routes: dict[str, ASGIApp],
                 http_metrics: HttpMetrics | None = None, access_log: bool = False,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.fast_routes = fast_routes
        self.http_metrics = http_metrics or HttpMetrics(CollectorRegistry())
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        watch = SentWatch(send)
        started = time.perf_counter()
        endpoint = self.fast_routes.get(scope["path"]) if scope["method"] == "POST" else None
        try:
            if endpoint is not None:
                scope["app"] = self
                await endpoint(scope, receive, watch)
            else:
                await super().__call__(scope, receive, watch)
        except Exception as exc:  # noqa: BLE001 - the last line: a bug, never a bare 500
            if "specroute.request_id" not in scope:  # else answered by `internal_fault`
                await watch.fault(log_fault(scope, exc))
        except asyncio.CancelledError:
            # uvicorn cancels what still runs when the shutdown drain ends; the client is
            # told (a 503, or an error event) and the task ends here, without a traceback
            log.warning("%s %s cut by the shutdown (server.drain_timeout_s)",
                        scope["method"], scope["path"][:100])
            await watch.fault(shutting_down())
        finally:
            self.observe(scope, watch, endpoint is not None, time.perf_counter() - started)

    def observe(self, scope: Scope, watch: SentWatch, fast: bool, seconds: float) -> None:
        """Count the answer by route template and status; the access log line. Never
        the key, the prompt or the query string."""
        status = watch.start["status"] if watch.start is not None else 499
        route = scope["path"] if fast else getattr(scope.get("route"), "path", "other")
        self.http_metrics.observe(route, status, seconds)
        if self.access_log:
            access_log.info("%s %s %d %.1fms tenant=%s", scope["method"], route, status,
                            seconds * 1000, scope.get("specroute.tenant", "-"))


def create_app(config: GatewayConfig, *, policy: str | RoutingPolicy = "learned",
               decide: DecideFn | None = None, classify: Classify | None = None,
               recorder: Recorder | None = None,
               config_path: str | None = None) -> GatewayApp:
    """Build the app over the routing core (`gateway.core.services.Core`, its arguments);
    a `decide` function replaces the policy (a fixed rule that learns nothing). With
    `config_path`, tenants reload when that file changes or on SIGHUP."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)  # process_resident_memory_bytes, CPU seconds, fds
    server = config.server
    gateway = Gateway(config, policy=Rule(decide, "custom") if decide else policy,
                      classify=classify, recorder=recorder, registry=registry)
    registry.register(LimitsCollector(gateway.limits))  # Redis failures, counts kept

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=server.total_timeout_s,
                                        connect=server.connect_timeout_s,
                                        sock_read=server.read_timeout_s)
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector,
                                         auto_decompress=False) as session:
            app.state.session = session  # gateway.http.sglang_routes's /server_info asks the workers
            # The policy's refit and the telemetry store's flush are Python threads: while
            # one runs, the loop waits for the GIL up to the switch interval (5 ms by
            # default); 1 ms bounds what a refit or a flush can add to a request.
            sys.setswitchinterval(GIL_SWITCH_S)
            await gateway.start(session, config_path)
            assert gateway.watchers is not None
            app.state.priors = gateway.watchers.priors
            planning = app.state.planning = fleet_planning(config, gateway.pools,
                                                           gateway.policy)
            console = app.state.console = Console(gateway, planning,
                                                  gateway.watchers.priors.sources)
            app.state.loop_lag.start()
            if planning is not None:
                await planning.start()
            await console.start()
            # Startup leaves ~60k long-lived objects (classifier, policy, libraries); a
            # full collection walks them all. Frozen, they are never scanned.
            gc.freeze()
            try:
                yield
            finally:
                for name, stop in (
                        ("console", console.stop),
                        ("fleet planning", planning.stop if planning is not None else None),
                        ("loop lag probe", app.state.loop_lag.stop)):
                    if stop is not None:
                        await bounded_stop(name, stop)
                await gateway.stop()

    fast_routes: dict[str, ASGIApp] = {"/v1/chat/completions": TokenEndpoint("chat"),
                                       "/v1/completions": TokenEndpoint("completions"),
                                       "/v1/routing/explain": ExplainEndpoint(),
                                       "/generate": GenerateEndpoint()}
    routes = [
        *(Route(path, endpoint, methods=["POST"]) for path, endpoint in fast_routes.items()),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/routing/fleet", routing_fleet, methods=["GET"]),
        Route("/console", console_page, methods=["GET"]),
        Route("/console/{asset}", console_asset, methods=["GET"]),
        Route("/v1/console/state", console_state_json, methods=["GET"]),
        *(Route(path, server_info, methods=["GET"])
          for path in ("/server_info", "/get_server_info")),
        *(Route(path, model_info, methods=["GET"]) for path in ("/model_info", "/get_model_info")),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
    ]
    app = GatewayApp(fast_routes=fast_routes, http_metrics=HttpMetrics(registry),
                     access_log=server.access_log, routes=routes, lifespan=lifespan,
                     exception_handlers={GatewayError: gateway_error, HTTPException: http_error,
                                         Exception: internal_fault})
    app.state.registry = registry
    app.state.gateway = gateway
    app.state.routing = gateway.policy
    app.state.openapi = orjson.dumps(openapi_document(config.models))
    app.state.loop_lag = LoopLagProbe(registry)
    app.state.started = int(time.time())
    return app
