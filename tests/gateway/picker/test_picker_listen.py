"""Where the picker's gRPC listens (gateway/picker/server.py): loopback by default, even
when the gateway's config binds the gateway to 0.0.0.0; a Unix socket; TLS, and TLS with
client certificates, from the PEM files the config's `picker:` names."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest
import yaml
from conftest import free_port, start_process, stop_process
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tls_certs import self_signed

from gateway.config import ConfigError, hash_api_key, parse_config
from gateway.picker.runtime import PickerServices, build
from gateway.picker.server import listen_address, make_server

RAW = {"server": {"host": "0.0.0.0"},  # the gateway's bind, as the shipped configs write it
       "pools": [{"name": "p", "engine": "sglang", "model": "m",
                  "workers": ["http://10.9.0.1:8000"]}],
       "tenants": [{"name": "t", "api_key_sha256": [hash_api_key("sk-listen")]}]}


def services(picker: dict | None = None) -> PickerServices:
    return build(parse_config({**RAW, "picker": picker or {}}), policy="static")


async def liveness(channel: grpc.aio.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    answer = await stub.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=5)
    return answer.status


def outside_address() -> str | None:
    """This machine's address on its default route, when it has one besides loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # a UDP connect sends nothing
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_the_default_is_loopback_whatever_the_gateway_binds(tmp_path: Path) -> None:
    """`specroute picker` with the gateway's config (server.host 0.0.0.0), no --host:
    it answers on 127.0.0.1 and refuses connections on this machine's other address."""
    assert listen_address(services().config.picker, None, 9002) == "127.0.0.1:9002"
    assert listen_address(services().config.picker, "0.0.0.0", 9002) == "0.0.0.0:9002"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(RAW))
    port = free_port()
    proc = start_process(["-m", "specroute.cli", "picker", "--config", str(config),
                          "--port", str(port), "--policy", "static"], tmp_path / "picker.log")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            stub = health_pb2_grpc.HealthStub(channel)
            assert stub.Check(health_pb2.HealthCheckRequest(service="liveness"),
                              timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        if (address := outside_address()) is not None:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((address, port), timeout=5).close()
    finally:
        stop_process(proc)


async def test_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "picker.sock"
    picker = services({"unix_socket": str(path)})
    address = listen_address(picker.config.picker, "0.0.0.0", 9002)
    assert address == f"unix:{path}"
    server, _ = make_server(picker, address)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            assert await liveness(channel) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0)


async def test_tls_round_trip_and_client_certificates(tmp_path: Path) -> None:
    """TLS only: a client trusting the picker's certificate gets answers, a plain-text
    client none; with `tls_client_ca_file`, only a client showing a certificate that
    CA signed."""
    cert, key = self_signed(tmp_path, "picker")
    client_cert, client_key = self_signed(tmp_path, "envoy")
    trusted = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    for client_ca in (None, client_cert):
        picker = services({"tls_cert_file": str(cert), "tls_key_file": str(key),
                           "tls_client_ca_file": str(client_ca) if client_ca else None})
        server, port = make_server(picker, "127.0.0.1:0")
        await server.start()
        target = f"127.0.0.1:{port}"
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                with pytest.raises(grpc.aio.AioRpcError):
                    await liveness(channel)
            if client_ca is None:
                async with grpc.aio.secure_channel(target, trusted) as channel:
                    assert await liveness(channel) == health_pb2.HealthCheckResponse.SERVING
                continue
            async with grpc.aio.secure_channel(target, trusted) as channel:  # no client cert
                with pytest.raises(grpc.aio.AioRpcError):
                    await liveness(channel)
            mutual = grpc.ssl_channel_credentials(
                root_certificates=cert.read_bytes(), private_key=client_key.read_bytes(),
                certificate_chain=client_cert.read_bytes())
            async with grpc.aio.secure_channel(target, mutual) as channel:
                assert await liveness(channel) == health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.stop(0)


def test_tls_files_go_together() -> None:
    for picker in ({"tls_cert_file": "c.pem"}, {"tls_key_file": "k.pem"},
                   {"tls_client_ca_file": "ca.pem"}):
        with pytest.raises(ConfigError, match="picker: tls_cert_file and tls_key_file"):
            parse_config({**RAW, "picker": picker})
