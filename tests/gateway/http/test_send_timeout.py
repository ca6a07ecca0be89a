"""A client that stops reading is cut within `server.send_timeout_s`: its admission slot,
its worker's outstanding count and its upstream stream are freed (security issue: slow
readers holding capacity).

The gateway app runs in this process in front of a real SGLang stub over HTTP; the
client is the ASGI `send` that, like uvicorn waiting on flow control for a zero TCP
window, never returns once the response has begun.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp.test_utils import TestServer
from sglang_stub import StubConfig, StubServer

from bench.gateway.hot_path import Lifespan
from gateway.classifier.minimal import minimal_profile
from gateway.config import parse_config
from gateway.http.app import create_app

SEND_TIMEOUT_S = 0.3


async def stalled_request(app, body: bytes) -> tuple[float, list[str]]:  # noqa: ANN001
    """One request whose client takes the head and one chunk, then nothing: how long
    the app took to give up, and what it sent."""
    sent: list[str] = []
    delivered = asyncio.Event()

    async def receive() -> dict:
        if not delivered.is_set():
            delivered.set()
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # connected, reading nothing: no disconnect either
        raise AssertionError("unreachable")

    stalled = asyncio.Event()

    async def send(message: dict) -> None:
        sent.append(message["type"])
        if len(sent) > 2 and not stalled.is_set():  # the window is full from here on
            stalled.set()  # (once: a cancelled wait must not hang the cleanup after it)
            await asyncio.Event().wait()

    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"content-type", b"application/json")], "query_string": b""}
    start = time.monotonic()
    await asyncio.wait_for(app(scope, receive, send), 10)
    return time.monotonic() - start, sent


async def test_a_client_that_stops_reading_is_cut_and_frees_its_slot() -> None:
    stub = StubConfig(model="m", drip_s=0.01)
    server = TestServer(StubServer(stub).app(), host="127.0.0.1")
    await server.start_server()
    config = parse_config({
        "server": {"send_timeout_s": SEND_TIMEOUT_S},
        "admission": {"max_inflight_per_worker": 1},
        "pools": [{"name": "p", "engine": "sglang", "model": "m", "method": "eagle", "k": 3,
                   "workers": [str(server.make_url("")).rstrip("/")]}]})
    app = create_app(config, policy="first", classify=minimal_profile)
    life = Lifespan(app)
    await life.start()
    try:
        gateway = app.state.gateway
        while not gateway.pools["p"].healthy_workers:
            await asyncio.sleep(0.02)
        body = orjson.dumps({"model": "m", "stream": True, "max_tokens": 200,
                             "prompt": " ".join(f"w{i}" for i in range(200))})
        took, sent = await stalled_request(app, body)
        assert sent[:2] == ["http.response.start", "http.response.body"]
        assert SEND_TIMEOUT_S <= took < SEND_TIMEOUT_S + 3
        assert gateway.admission.queues["p"].running == 0  # the slot is free
        assert gateway.pools["p"].workers[0].outstanding == 0
        deadline = time.monotonic() + 5
        while stub.in_flight:  # the upstream stream was closed: the worker stops
            assert time.monotonic() < deadline, "the worker still streams"
            await asyncio.sleep(0.02)
    finally:
        await life.stop()
        await server.close()
