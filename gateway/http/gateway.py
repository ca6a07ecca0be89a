"""The `Gateway`: the routing core plus the data path the HTTP front door needs (a
dispatcher to the workers), built once in `gateway.http.app.create_app` and handed to the
handlers as `app.state.gateway`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.classifier.minimal import Classify
from gateway.config import GatewayConfig
from gateway.core.services import Core
from gateway.http.deadlines import Clock
from gateway.telemetry.prometheus import Recorder
from gateway.upstream.adapters import make_adapters
from gateway.upstream.dispatch import Dispatcher
from gateway.upstream.http1 import Http1Client
from policies.protocol import RoutingPolicy


class Gateway(Core):
    """`Core` (its arguments) with an `Http1Client` to the workers, the `Dispatcher`
    over it, and the `Clock` the requests' own deadlines are kept on."""

    def __init__(self, config: GatewayConfig, *, policy: str | RoutingPolicy = "learned",
                 classify: Classify | None = None, recorder: Recorder | None = None,
                 registry: CollectorRegistry | None = None,
                 upstream: Http1Client | None = None) -> None:
        super().__init__(config, policy=policy, classify=classify, recorder=recorder,
                         registry=registry)
        server = config.server
        self.upstream = upstream or Http1Client(server.connect_timeout_s,
                                                server.read_timeout_s, server.total_timeout_s,
                                                server.max_response_bytes)
        self.dispatcher = Dispatcher(make_adapters(self.upstream), server)
        self.clock = Clock()

    async def stop(self) -> None:
        await super().stop()
        self.upstream.close()
