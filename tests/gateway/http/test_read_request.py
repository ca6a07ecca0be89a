"""`read_request` (gateway/http/endpoints.py) on the raw ASGI header list: the media type,
the key and the declared length read as sent (of a repeated header the last counts, as
a dict of them would keep), the pin headers handed to `admit` by name, nothing else."""

from __future__ import annotations

import asyncio

import pytest

from gateway.classifier.minimal import minimal_profile
from gateway.config import hash_api_key, parse_config
from gateway.errors import AuthenticationFailed, PayloadTooLarge, UnsupportedMediaType
from gateway.http.endpoints import read_request
from gateway.http.gateway import Gateway

BODY = b'{"model": "m", "prompt": "x"}'
GATEWAY = Gateway(parse_config({"pools": [{"name": "p", "engine": "sglang", "model": "m",
                                            "workers": ["http://127.0.0.1:1"]}],
                                 "server": {"max_body_bytes": 100},
                                 "tenants": [{"name": "acme",
                                              "api_key_sha256": [hash_api_key("sk-real")]}]}),
                  policy="first", classify=minimal_profile)


def read(headers: list[tuple[bytes, bytes]], body: bytes = BODY):  # noqa: ANN201
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    return asyncio.run(read_request(GATEWAY, {"headers": headers}, receive))  # type: ignore[arg-type]


def test_the_tenant_the_pins_by_name_and_the_body() -> None:
    tenant, pins, raw = read([(b"host", b"gw"), (b"content-type", b"application/json"),
                              (b"authorization", b"Bearer sk-real"),
                              (b"x-specroute-pool", b"p"), (b"x-specroute-k", b"3"),
                              (b"x-specroute-benchmark", b"1"), (b"x-other", b"y"),
                              (b"content-length", str(len(BODY)).encode())])
    assert tenant.name == "acme" and raw == BODY
    assert pins == {"x-specroute-pool": "p", "x-specroute-k": "3",
                    "x-specroute-benchmark": "1"}


def test_of_a_repeated_header_the_last_counts() -> None:
    key = (b"authorization", b"Bearer sk-real")
    assert read([(b"content-type", b"text/plain"), (b"content-type", b"application/json"),
                 (b"authorization", b"Bearer wrong"), key])[0].name == "acme"
    with pytest.raises(UnsupportedMediaType):
        read([(b"content-type", b"application/json"), (b"content-type", b"text/plain"), key])
    with pytest.raises(AuthenticationFailed):
        read([(b"content-type", b"application/json"), key, (b"authorization", b"Bearer no")])
    assert read([(b"content-type", b"application/json"), key, (b"x-specroute-k", b"1"),
                 (b"x-specroute-k", b"2")])[1] == {"x-specroute-k": "2"}


def test_a_declared_length_over_the_cap_is_refused_before_the_body_is_read() -> None:
    headers = [(b"content-type", b"application/json; charset=latin-1"),
               (b"authorization", b"Bearer sk-real"), (b"content-length", b"101")]
    with pytest.raises(PayloadTooLarge):
        read(headers, b"")
    assert read([*headers[:2], (b"content-length", b"")])[2] == BODY  # not digits: ignored
