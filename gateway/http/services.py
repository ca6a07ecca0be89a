"""The `Gateway` container: everything a request needs, built once in the app lifespan
(`gateway.http.app`) and handed to the handlers as `app.state.gateway`."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import Tracer

from gateway.config import GatewayConfig
from gateway.pools import Pool
from gateway.routing.admission import Admission
from gateway.routing.router import PoolRouter
from gateway.telemetry.record import Reporter
from gateway.tenants.auth import Authenticator
from gateway.tenants.limits import Limits
from gateway.upstream.dispatch import Dispatcher
from workers.tracer_provider import ListeningTracerProvider


@dataclass(slots=True)
class Gateway:
    config: GatewayConfig
    pools: dict[str, Pool]
    router: PoolRouter
    auth: Authenticator  # replaced whole when tenants reload
    limits: Limits
    dispatcher: Dispatcher
    reporter: Reporter
    tracer: Tracer
    provider: ListeningTracerProvider | None = None  # None: always emit spans
    admission: Admission | None = None  # None: no per-pool slots (unit tests)
