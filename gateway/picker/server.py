"""The picker's gRPC server: Envoy's ext_proc v3 `ExternalProcessor` and gRPC health.

One `Exchange` per ext_proc stream (one HTTP request). Health (grpc.health.v1, the
protocol's "Health Checking", `Check` and the streaming `Watch`): `liveness` is SERVING
while the process answers;
`readiness`, `envoy.service.ext_proc.v3.ExternalProcessor` and the empty service name
are SERVING once the first health round has run and some worker is available, else
NOT_SERVING (one replica serves alone: no leader election); any other name is
SERVICE_UNKNOWN (NOT_FOUND, as the reference servicer answers).

Where it listens (`PickerConfig`, the config's `picker:`): on loopback unless `--host` or
`picker.host` names another address (the gateway's `server.host` does not: a config
written for a gateway on 0.0.0.0 keeps the picker on loopback), or on a Unix socket
(`picker.unix_socket`). With `picker.tls_cert_file` and `tls_key_file` it serves TLS only;
with `tls_client_ca_file` too, it asks every client for a certificate that CA signed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.config import PickerConfig
from gateway.picker.exchange import Exchange, observe
from gateway.picker.protocol import MAX_ENDPOINTS_METADATA, RESPONSE_METADATA
from gateway.picker.runtime import PickerServices, running

log = logging.getLogger("specroute.picker")
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
READY_SERVICES = frozenset({"", "readiness", EXT_PROC_SERVICE})
Status = health_pb2.HealthCheckResponse.ServingStatus


class Processor(ext_grpc.ExternalProcessorServicer):
    def __init__(self, services: PickerServices) -> None:
        self.services = services

    async def Process(self, request_iterator: AsyncIterator[ext.ProcessingRequest],  # noqa: N802
                      context: grpc.aio.ServicerContext) -> AsyncIterator[ext.ProcessingResponse]:
        metadata = context.invocation_metadata()
        role = stream_role(metadata)
        if role == "observe":  # the response side, sent and not waited on: no answers
            await observe(self.services, request_iterator)
            return
        exchange = Exchange(self.services, stream_budget(metadata), role)
        try:
            async for message in request_iterator:
                for answer in await exchange.handle(message):
                    yield answer
        finally:
            exchange.close()  # also when Envoy or the client gives up mid-request


def stream_budget(metadata: object) -> int | None:
    """The endpoints a stream's listener takes (`MAX_ENDPOINTS_METADATA`); None: the
    picker's own `max_endpoints`."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == MAX_ENDPOINTS_METADATA and isinstance(value, str) and value.isdigit():
            return int(value) or None
    return None


def stream_role(metadata: object) -> str:
    """`observe` (an observer's stream), `observed` (a pick whose response an observer
    reads), `body` (a pick that reads its response's body alone, the status and the
    served endpoint as its attributes) or "" (a pick that reads the response's headers
    and body): `RESPONSE_METADATA`."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == RESPONSE_METADATA and value in ("observe", "observed", "body"):
            return value
    return ""


class Health(health_pb2_grpc.HealthServicer):
    """`Check` answers from the state at the time; `Watch` (streaming) sends the status,
    then each change, read every `poll_s` (readiness follows the health monitor's rounds,
    which run every `server.health_interval_s`): grpcio-health-checking's reference
    servicer is set by hand (`set`), this one reads. As the reference's `Watch` does, an
    unknown service is answered SERVICE_UNKNOWN and the call stays open; a stopping picker
    turns the ready services NOT_SERVING for its grace period."""

    def __init__(self, ready: Callable[[], bool], poll_s: float = 0.25) -> None:
        self.ready = ready
        self.poll_s = poll_s
        self.stopping = False

    def status(self, service: str) -> int | None:
        if service == "liveness":
            return health_pb2.HealthCheckResponse.SERVING
        if service in READY_SERVICES:
            return (health_pb2.HealthCheckResponse.SERVING
                    if self.ready() and not self.stopping
                    else health_pb2.HealthCheckResponse.NOT_SERVING)
        return None

    async def Watch(self, request: health_pb2.HealthCheckRequest,  # noqa: N802
                    context: grpc.aio.ServicerContext) -> None:
        last = None
        while True:  # until the client cancels or the server stops
            status = self.status(request.service)
            if status is None:
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            await asyncio.sleep(self.poll_s)

    async def Check(self, request: health_pb2.HealthCheckRequest,  # noqa: N802
                    context: grpc.aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)


def listen_address(picker: PickerConfig, host: str | None, port: int) -> str:
    """The gRPC address: `unix:PATH` with a Unix socket, else `host` (the command line's)
    or the picker's own host, and `port`."""
    if picker.unix_socket:
        return f"unix:{picker.unix_socket}"
    return f"{host or picker.host}:{port}"


def credentials(picker: PickerConfig) -> grpc.ServerCredentials | None:
    """TLS from the configured PEM files, or None (plain text)."""
    if not picker.tls_cert_file or not picker.tls_key_file:
        return None
    with open(picker.tls_key_file, "rb") as key, open(picker.tls_cert_file, "rb") as cert:
        pair = (key.read(), cert.read())
    client_ca = None
    if picker.tls_client_ca_file:
        with open(picker.tls_client_ca_file, "rb") as ca:
            client_ca = ca.read()
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


def make_server(services: PickerServices, address: str) -> tuple[grpc.aio.Server, int]:
    """The gRPC server with both services, bound to `address` (host:port, port 0 picks a
    free one; or unix:PATH), with TLS when the config's `picker` has it; not started.
    Returns it and its port."""
    # a whole request body arrives in one message: room for the gateway's body cap (the
    # cap itself is answered 413), where gRPC's default would refuse at 4 MiB
    size = services.config.server.max_body_bytes + 1024 * 1024
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", size),
                                      ("grpc.max_send_message_length", size)])
    ext_grpc.add_ExternalProcessorServicer_to_server(Processor(services), server)
    health = Health(lambda: services.ready)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.health = health  # type: ignore[attr-defined]  # `serve` marks it stopping
    tls = credentials(services.config.picker)
    port = (server.add_secure_port(address, tls) if tls is not None
            else server.add_insecure_port(address))
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return server, port


async def serve(services: PickerServices, address: str, grace_s: float = 5.0,
                config_path: str | None = None) -> None:
    """Run until SIGTERM or SIGINT; requests in flight get `grace_s` to end."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running(services, config_path):
        server, _ = make_server(services, address)
        await server.start()
        log.info("specroute picker (ext_proc v3 + grpc.health.v1) on %s%s, pools: %s",
                 address, " (TLS)" if services.config.picker.tls_cert_file else "",
                 ", ".join(services.pools))
        await stop.wait()
        server.health.stopping = True  # type: ignore[attr-defined]
        await server.stop(grace_s)


def run(config_path: str, host: str | None, port: int, policy: str = "learned",
        max_endpoints: int | None = None, metrics_port: int = 0) -> int:
    """`specroute picker`: load the gateway config, serve until stopped; 2 on a bad
    config or an exposure the gateway would refuse too. With `metrics_port`, the
    gateway's Prometheus metrics (requests, latency, accept length per pool, the engines'
    own acceptance) on that port's `/metrics`."""
    from gateway.config import ConfigError, load_config, with_environment
    from gateway.picker.runtime import build
    from gateway.tenants.auth import check_exposure

    try:
        config = with_environment(load_config(config_path), os.environ)
    except ConfigError as exc:
        print(f"specroute picker: {exc}", file=sys.stderr)
        return 2
    address = listen_address(config.picker, host, port)
    host = "localhost" if config.picker.unix_socket else (host or config.picker.host)
    if (why := check_exposure(config, host)) is not None:
        print(f"specroute picker: {why}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.server.log_level.upper().replace("TRACE", "DEBUG"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    services = build(config, policy=policy, max_endpoints=max_endpoints)
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=host, registry=services.registry)
    asyncio.run(serve(services, address, config_path=config_path))
    return 0
