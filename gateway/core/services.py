"""`Core`: the services every front door runs on, built once from the config.

Pools with their health monitor, Redis discovery and the workers' priors; the routing
policy (`gateway.routing.policy`) wrapped by the SLO-aware policy over per-pool admission
slots; the router with the classifier; tenants' keys (reloadable) and rate limits; the
reporter that feeds metrics, the console's recent traffic and the policy. The HTTP app
(`gateway.http.gateway.Gateway`) adds a dispatcher; the picker
(`gateway.picker.runtime.PickerServices`) adds what Envoy needs. `start()` brings the
background parts up (policy threads, probes, discovery, tenant reloads); `stop()` takes
them down in reverse, each within `STOP_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiohttp
from prometheus_client import CollectorRegistry

from gateway.classifier.minimal import Classify, Guarded, minimal_profile
from gateway.config import GatewayConfig
from gateway.pools import Pool, build_pools
from gateway.routing.admission import Admission
from gateway.routing.policy import PolicyFeed, build_routing_policy
from gateway.routing.router import PoolRouter
from gateway.routing.slo_aware import SloAware
from gateway.telemetry.prometheus import FanoutRecorder, PrometheusRecorder, Recorder
from gateway.telemetry.recent import RecentTraffic
from gateway.telemetry.record import Reporter
from gateway.telemetry.spans import make_tracer
from gateway.telemetry.tenant_metrics import TenantMetrics
from gateway.tenants.auth import DEFAULT_TENANT, Authenticator, TenantReloader
from gateway.tenants.limits import Limits
from gateway.upstream.watchers import UpstreamWatchers
from policies.protocol import RoutingPolicy

log = logging.getLogger("specroute.gateway")
STOP_TIMEOUT_S = 15.0  # each part's share of a shutdown; more and it is left behind


def load_default_classifier() -> Classify:
    """`gateway.classifier.classify.classify` with its model loaded; the minimal profile
    (logged once) when the classifier or its model cannot load. Blocking."""
    try:
        from gateway.classifier.classify import classify, load_classifier

        load_classifier()
    except Exception as exc:  # noqa: BLE001 - any failure to load means: use the fallback
        log.warning("request classifier unavailable (%s: %s); using the minimal profile",
                    type(exc).__name__, exc)
        return minimal_profile
    return classify


async def bounded_stop(name: str, stop: Callable[[], Awaitable[None]]) -> None:
    """Await one part's stop for at most STOP_TIMEOUT_S: a part that hangs (a socket that
    never answers) is logged and left, and the shutdown goes on."""
    try:
        async with asyncio.timeout(STOP_TIMEOUT_S):
            await stop()
    except TimeoutError:
        log.warning("%s did not stop within %g s; shutting down without it", name,
                    STOP_TIMEOUT_S)


class Core:
    """The services (module docstring). `policy`: a name (`policies.rules.POLICY_NAMES`)
    or a policy; `classify=None`: the default classifier, loaded by `start` (the minimal
    profile until then); `recorder` replaces the Prometheus recorder (the policy is fed
    either way); `registry` is where every metric registers."""

    def __init__(self, config: GatewayConfig, *, policy: str | RoutingPolicy = "learned",
                 classify: Classify | None = None, recorder: Recorder | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry or CollectorRegistry()
        self.tenant_metrics = TenantMetrics(self.registry)
        self.provider, self.tracer = make_tracer(config.server.otel_exporter)
        self.policy = (build_routing_policy(policy, config) if isinstance(policy, str)
                       else policy)
        self.pools: dict[str, Pool] = build_pools(config)
        self.auth = Authenticator(config.tenants, config.auth)  # replaced when tenants reload
        self.tenants = dict(self.auth.by_name)  # updated in place when tenants reload
        self.limits = Limits(config.redis_url, config.limits.on_redis_error,
                             on_limited=self.tenant_metrics.limited)
        self.admission = Admission(config.admission, self.pools, self.tenant_metrics)
        slo_aware = SloAware(self.policy, self.tenants, DEFAULT_TENANT, self.admission,
                             config.admission.slo_aware, self.tenant_metrics)
        self.router = PoolRouter(self.pools, slo_aware)
        self.classify = Guarded(classify or minimal_profile)
        self._load_classifier = classify is None
        self.recent = RecentTraffic()  # what the console shows of the last hour
        self.reporter = Reporter(
            FanoutRecorder(recorder or PrometheusRecorder(self.registry),
                           PolicyFeed(self.policy), self.tenant_metrics, self.recent),
            self.pools, self.limits.spend, self.tracer, self.provider)
        self.watchers: UpstreamWatchers | None = None
        self.reloader: TenantReloader | None = None

    def install_auth(self, auth: Authenticator) -> None:
        """Tenants reloaded: their keys, and their SLOs as the policy reads them."""
        self.auth = auth
        self.tenants.clear()
        self.tenants.update(auth.by_name)

    async def start(self, session: aiohttp.ClientSession, config_path: str | None = None
                    ) -> None:
        """Load the classifier (off the loop), then start the policy, the upstream
        watchers and, with `config_path`, tenant reloads (on change or SIGHUP)."""
        if self._load_classifier:
            self.classify.classify = await asyncio.to_thread(load_default_classifier)
        if config_path is not None:
            self.reloader = TenantReloader(config_path, self.install_auth,
                                           self.auth.required)
            self.reloader.start()
        self.policy.start()
        self.watchers = UpstreamWatchers(self.pools, session, self.config.server,
                                         self.config.redis_url, self.registry,
                                         self.policy.set_worker_prior)
        await self.watchers.start()

    async def stop(self) -> None:
        """Stop in reverse; the policy last (it joins threads and flushes telemetry)."""
        if self.watchers is not None:
            await bounded_stop("watchers", self.watchers.stop)
        if self.reloader is not None:
            await bounded_stop("tenant reloader", self.reloader.stop)
        await bounded_stop("rate limits", self.limits.close)
        await asyncio.to_thread(self.policy.stop)
        if self.provider is not None:
            self.provider.shutdown()
