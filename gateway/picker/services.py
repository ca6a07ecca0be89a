"""What the picker runs on: the standalone gateway's services, minus the data path.

Built from the same config and the same classes as the gateway's lifespan
(`gateway.http.app`): pools with their health monitor and Redis discovery, the worker
priors, the routing policy behind the SLO hook and admission, the router with the
classifier, tenants' keys and rate limits, and the reporter that feeds the policy. No
dispatcher: Envoy carries the bytes. `running(config)` starts them in that order and
stops them in reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry

from gateway.config import GatewayConfig
from gateway.http.app import load_default_classifier
from gateway.picker.protocol import endpoint_of
from gateway.pools import Pool, Worker, build_pools
from gateway.routing.admission import Admission
from gateway.routing.policy import RoutingPolicy, build_routing_policy
from gateway.routing.router import Classify, Decide, PoolRouter
from gateway.routing.slo import slo_layer
from gateway.telemetry.prometheus import FanoutRecorder, PrometheusRecorder
from gateway.telemetry.record import Reporter
from gateway.telemetry.spans import make_tracer
from gateway.telemetry.tenant_metrics import TenantMetrics
from gateway.tenants.auth import Authenticator, TenantReloader
from gateway.tenants.limits import Limits
from gateway.upstream.watchers import UpstreamWatchers
from workers.tracer_provider import ListeningTracerProvider

log = logging.getLogger("specroute.picker")


@dataclass(slots=True)
class PickerServices:
    config: GatewayConfig
    pools: dict[str, Pool]
    router: PoolRouter
    auth: Authenticator
    limits: Limits
    admission: Admission
    reporter: Reporter
    routing: RoutingPolicy
    registry: CollectorRegistry
    tracer: Tracer
    provider: ListeningTracerProvider | None = None
    started: bool = False  # the first health round has run (`running`)
    # endpoints named per request: 1 for an ORIGINAL_DST cluster (it takes one ip:port),
    # more for Envoy's override_host policy, which walks the list on retry
    max_endpoints: int = 3
    # picked requests whose response an observer stream will read, by exchange key
    exchanges: dict[str, Any] = field(default_factory=dict)

    def worker_at(self, endpoint: str) -> tuple[Pool, Worker] | None:
        """The pool and worker behind an `ip:port` (a handful of pools: a scan is fine)."""
        for pool in self.pools.values():
            for worker in pool.workers:
                if endpoint_of(worker.url) == endpoint:
                    return pool, worker
        return None

    @property
    def ready(self) -> bool:
        """Readiness: the first health round has run and some worker is available."""
        return self.started and any(
            pool.up_workers for pool in self.pools.values())


def build(config: GatewayConfig, *, policy: str = "learned", decide: Decide | None = None,
          classify: Classify | None = None, max_endpoints: int | None = None
          ) -> PickerServices:
    """The services, not started (no session, no tasks): `running` starts them; unit
    tests use them as they are. Blocking (the classifier's model loads here)."""
    registry = CollectorRegistry()
    tenant_metrics = TenantMetrics(registry)
    provider, tracer = make_tracer(config.server.otel_exporter)
    routing = (RoutingPolicy(decide, "custom") if decide
               else build_routing_policy(policy, config))
    pools = build_pools(config)
    limits = Limits(config.redis_url, config.limits.on_redis_error,
                    on_limited=tenant_metrics.limited)
    reporter = Reporter(FanoutRecorder(PrometheusRecorder(registry), routing, tenant_metrics),
                        pools, limits.spend, tracer, provider)
    auth = Authenticator(config.tenants, config.auth)
    holder: list[PickerServices] = []  # the SLO hook reads the tenants as reloaded
    admission, slo = slo_layer(config, pools, routing.decide, routing.predict,
                               lambda name: holder[0].auth.named(name), tenant_metrics)
    router = PoolRouter(pools, decide=slo.decide, classify=classify or load_default_classifier(),
                        predict=slo.predict)
    services = PickerServices(config=config, pools=pools, router=router, auth=auth,
                              limits=limits, admission=admission, reporter=reporter,
                              routing=routing, registry=registry, tracer=tracer,
                              provider=provider,
                              max_endpoints=max_endpoints or config.server.max_attempts)
    holder.append(services)
    return services


@contextlib.asynccontextmanager
async def running(services: PickerServices, config_path: str | None = None
                  ) -> AsyncIterator[PickerServices]:
    """Probe, discover and learn while the picker serves; with `config_path`, tenants
    reload when that file changes or on SIGHUP, as the gateway's do. Everything is
    stopped on exit."""
    config, server = services.config, services.config.server
    timeout = aiohttp.ClientTimeout(total=server.total_timeout_s,
                                    connect=server.connect_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        watchers = UpstreamWatchers(services.pools, session, server, config.redis_url,
                                    services.registry, services.routing.set_worker_prior)
        reloader = None
        if config_path is not None:
            def install(auth: Authenticator) -> None:
                services.auth = auth

            reloader = TenantReloader(config_path, install, services.auth.required)
            reloader.start()
        services.routing.start()
        await watchers.start()
        services.started = True
        for pool in services.pools.values():
            for worker in pool.workers:
                if endpoint_of(worker.url) is None:
                    log.warning("worker %s of pool %s has no ip:port; the picker cannot "
                                "name it to Envoy (use the pod IP)", worker.url, pool.name)
        try:
            yield services
        finally:
            await watchers.stop()
            if reloader is not None:
                await reloader.stop()
            await services.limits.close()
            await asyncio.to_thread(services.routing.stop)  # flushes telemetry to Redis
            if services.provider is not None:
                services.provider.shutdown()
