"""Property tests (hypothesis) for what the gateway reads from clients and workers.

- the classifier never raises for any request `parse_request` accepts, and takes
  bounded time for any prompt up to the body limit (repetitive text is where a
  backtracking regular expression would blow up);
- the SSE parser (`wire.sse_data`, reading the real `http1.Response`) and the relay
  (`ChunkWriter` out, parsed back) give the same text for any chunking of the bytes;
- header parsing (pins, the API key, media type, content length, and `read_request` as
  a whole) either accepts a value or raises a 4xx `ClientError`, never anything else.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.classifier.classify import classify, load_classifier
from gateway.classifier.minimal import minimal_profile
from gateway.config import ServerConfig, TenantConfig, hash_api_key, parse_config
from gateway.core.admit import admit
from gateway.errors import (
    AuthenticationFailed,
    ClientError,
    InvalidRequest,
    UnsupportedMediaType,
)
from gateway.http.bodies import check_media_type, content_length
from gateway.http.endpoints import TokenEndpoint, read_request
from gateway.http.gateway import Gateway
from gateway.http.responses import ChunkWriter
from gateway.pins import Pin, parse_pinned_k
from gateway.schemas import ROLES, GenerationRequest, parse_request
from gateway.telemetry.record import Timer
from gateway.telemetry.worker_stats import SpecStats, Usage
from gateway.tenants.auth import Authenticator
from gateway.upstream.adapters.base import Delta, Final, StreamItem
from gateway.upstream.adapters.wire import sse_data
from gateway.upstream.http1 import Connection, Http1Client, Response, target
from policies.request_limits import MAX_K
from policies.types import Decision

load_classifier()
BODY_LIMIT = ServerConfig().max_body_bytes
WORDS = ["```", "```python\n", "\n", " ", "def f(x):", "return", "{", "}", '"key": 1,',
         "json", "respond in JSON", "yaml", "csv", "#include <x>", "import os", "SELECT",
         "é", "中", "😀", "\t", "\\", "<", ">"]
prose = st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=12)),
                 max_size=60).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
content = st.one_of(prose, st.none(), st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "x"])},
    optional={"text": st.one_of(prose, json_values)}), max_size=3))
message = st.fixed_dictionaries({"role": st.sampled_from(sorted(ROLES)), "content": content},
                                optional={"name": json_values})
response_format = st.one_of(json_values, st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "json_object", "json_schema"])},
    optional={"json_schema": json_values}))
extras = {name: json_values for name in ("tools", "tool_choice", "guided_json", "regex",
                                         "ebnf", "json_schema", "stop", "seed", "user")}
extras |= {"response_format": response_format, "max_tokens": json_values,
           "temperature": st.floats(0, 2), "stream": st.booleans()}
chat_body = st.fixed_dictionaries({"model": st.just("m"),
                                   "messages": st.lists(message, min_size=1, max_size=5)},
                                  optional=extras)
completions_body = st.fixed_dictionaries(
    {"model": st.just("m"), "prompt": st.one_of(prose, st.lists(st.integers(0, 2**31 - 1),
                                                                 min_size=1, max_size=8))},
    optional=extras)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(chat_body.map(lambda b: ("chat", b)),
                 completions_body.map(lambda b: ("completions", b))))
def test_classifier_never_raises(case: tuple) -> None:
    endpoint, body = case
    try:
        request = parse_request(body, endpoint)
    except InvalidRequest:
        return
    profile = classify(request, "tenant")
    assert profile.task in ("code", "structured", "chat")
    assert profile.prompt_tokens >= 0


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unit=prose.filter(bool), chat=st.booleans())
def test_classifier_time_is_bounded_up_to_the_body_limit(unit: str, chat: bool) -> None:
    """A prompt filling the body limit with one pattern repeated: linear-time rules and
    bounded windows keep it well under a second on an idle core (~0.05 s measured);
    the bound is loose for the shared box."""
    text = unit * ((BODY_LIMIT - 200) // len(unit.encode()))
    body = ({"model": "m", "messages": [{"role": "system", "content": text[:1000]},
                                        {"role": "user", "content": text}]} if chat
            else {"model": "m", "prompt": text})
    request = parse_request(body, "chat" if chat else "completions")
    start = time.perf_counter()
    classify(request, "tenant")
    assert time.perf_counter() - start < 3.0


# --- SSE: any chunking, the same events and text ---------------------------------------

def cut(data: bytes, points: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


async def parse(chunks: list[bytes]) -> list[dict]:
    """`sse_data` over the gateway's real HTTP/1.1 response reader, fed a chunked answer
    whose HTTP chunks are `chunks`, one loop turn apart, so reads see every partial line
    the chunking makes."""
    connection = Connection(Http1Client(5, 5, 5), target("http://127.0.0.1:1"))
    response = Response(connection, time.monotonic() + 60, 60)
    connection.response = response
    connection.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")

    async def feed() -> None:
        for chunk in chunks:
            if chunk:
                connection.data_received(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            await asyncio.sleep(0)
        connection.data_received(b"0\r\n\r\n")

    feeder = asyncio.create_task(feed())
    items = [item async for item in sse_data("w", response)]
    await feeder
    return items


events = st.lists(st.one_of(
    st.text().map(lambda t: ("data", {"text": t})),
    st.text(max_size=8).map(lambda t: ("named", {"ids": [1, 2], "t": t})),
    st.just(("comment", None))), max_size=12)


def sse_bytes(items: list[tuple[str, dict | None]], newline: bytes) -> bytes:
    out = b""
    for kind, body in items:
        if kind == "comment":
            out += b": keep-alive" + newline + newline
        else:
            head = b"event: sglext_ids" + newline if kind == "named" else b""
            out += head + b"data: " + orjson.dumps(body) + newline + newline
    return out + b"data: [DONE]" + newline + newline


@settings(max_examples=200, deadline=None)
@given(items=events, newline=st.sampled_from([b"\n", b"\r\n"]),
       points=st.lists(st.integers(0, 10**6), max_size=30))
def test_sse_parser_is_chunking_invariant(items: list, newline: bytes,
                                          points: list[int]) -> None:
    data = sse_bytes(items, newline)
    parsed = asyncio.run(parse(cut(data, points)))
    assert parsed == [body for kind, body in items if kind == "data"]


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(st.text(min_size=1), max_size=10), chat=st.booleans(),
       upstream_points=st.lists(st.integers(0, 10**6), max_size=20),
       client_points=st.lists(st.integers(0, 10**6), max_size=20))
def test_relay_gives_the_same_text_for_any_chunking(texts: list[str], chat: bool,
                                                    upstream_points: list[int],
                                                    client_points: list[int]) -> None:
    """Worker SSE cut anywhere → parser → `ChunkWriter` (what the client gets) cut
    anywhere → parsed back: the client reads exactly the worker's text."""
    upstream = sse_bytes([("data", {"text": t}) for t in texts], b"\n")
    received = asyncio.run(parse(cut(upstream, upstream_points)))
    body = ({"model": "m", "messages": [{"role": "user", "content": "x"}]} if chat
            else {"model": "m", "prompt": "x"})
    request = parse_request(body, "chat" if chat else "completions")
    writer = ChunkWriter(request, Decision(pool="p", method="plain", k=0, reason="r"))
    out = b"".join(writer.delta(Delta(text=item["text"])) for item in received)
    out += writer.final(Final(usage=Usage(1, len(texts)), spec=SpecStats()))
    chunks = asyncio.run(parse(cut(out, client_points)))
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    relayed = "".join((c["delta"].get("content", "") if chat else c["text"]) for c in choices)
    assert relayed == "".join(texts)
    assert chunks[-1]["specroute"]["pool"] == "p"



async def relayed(request: GenerationRequest, items: list[StreamItem]) -> bytes:
    """What the gateway's stream relay sends the client for these upstream items."""
    sent: list[bytes] = []

    async def send(message: dict) -> None:
        sent.append(message.get("body", b""))

    async def upstream() -> AsyncIterator[StreamItem]:
        for item in items[1:]:
            yield item

    writer = ChunkWriter(request, Decision(pool="p", method="plain", k=0, reason="r"))
    final = await TokenEndpoint("completions").relay(
        send, writer, items[0], upstream(), Timer(),
        SimpleNamespace(deadline=math.inf))  # type: ignore[arg-type]  # a lease's deadline only
    assert final is items[-1]
    return b"".join(sent)

@settings(max_examples=150, deadline=None)
@given(samples=st.lists(st.lists(st.text(max_size=3), max_size=4), min_size=1, max_size=4),
       order=st.randoms(use_true_random=False), chat=st.booleans())
def test_every_sample_finishes_even_when_its_last_delta_is_empty(
        samples: list[list[str]], order: random.Random, chat: bool) -> None:
    """n > 1: each sample's finish_reason reaches the client's last chunk, whatever the
    interleaving and even when the sample's finishing step carries no text (CI once saw
    choice 1's finish dropped: the relay skipped empty deltas before the writer held it)."""
    body = ({"model": "m", "messages": [{"role": "user", "content": "x"}]} if chat
            else {"model": "m", "prompt": "x"})
    request = parse_request({**body, "n": len(samples)}, "chat" if chat else "completions")
    queues = [[Delta(text=t, index=i) for t in texts] + [Delta(text="", index=i,
                                                               finish_reason="length")]
              for i, texts in enumerate(samples)]
    items: list[StreamItem] = []
    while any(queues):
        items.append(order.choice([q for q in queues if q]).pop(0))
    items.append(Final(usage=Usage(1, 1), spec=SpecStats(), finish_reason="length"))
    chunks = asyncio.run(parse(cut(asyncio.run(relayed(request, items)), [])))
    finished = {c["index"]: c["finish_reason"] for chunk in chunks
                for c in chunk["choices"] if c["finish_reason"]}
    assert finished == dict.fromkeys(range(len(samples)), "length")
    for index, texts in enumerate(samples):
        got = [c["delta"].get("content", "") if chat else c["text"] for chunk in chunks
               for c in chunk["choices"] if c["index"] == index]
        assert "".join(got) == "".join(texts)

# --- headers: accepted, or a 4xx ---------------------------------------------------------

latin1 = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255))


@settings(max_examples=500, deadline=None)
@given(latin1 | st.text())
def test_pinned_k_is_a_small_int_or_a_400(text: str) -> None:
    try:
        k = parse_pinned_k(text)
    except InvalidRequest as exc:
        assert exc.status == 400 and exc.param == "x-specroute-k"
    else:
        assert type(k) is int and 0 <= k <= MAX_K


@settings(max_examples=300, deadline=None)
@given(st.none() | latin1, st.none() | latin1, st.none() | latin1)
def test_pin_headers_never_raise_anything_else(pool: str | None, k: str | None,
                                               benchmark: str | None) -> None:
    try:
        pin = Pin.from_headers(pool, k, benchmark)
    except InvalidRequest:
        return
    assert pin.active == bool(pool or k is not None or pin.benchmark)


@settings(max_examples=300, deadline=None)
@given(st.none() | latin1 | latin1.map(lambda t: "Bearer " + t))
def test_api_key_header_is_a_tenant_or_a_401(header: str | None) -> None:
    auth = Authenticator((TenantConfig("acme", (hash_api_key("sk-real"),)),))
    try:
        assert auth.tenant(header).name == "acme"
    except AuthenticationFailed as exc:
        assert exc.status == 401


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["Bearer sk-real", "bearer  sk-real ", "Bearer sk-other",
                                 "Bearer sk-real2", "Bearer ", "sk-real"]) | latin1,
                max_size=8))
def test_a_proven_key_answers_as_its_first_check_did(headers: list[str]) -> None:
    """Keys that authenticated are remembered (no digest on the next request): the same
    header gives the same tenant or the same 401 every time, and only keys whose digest
    matched are kept."""
    tenants = (TenantConfig("acme", (hash_api_key("sk-real"),)),
               TenantConfig("beta", (hash_api_key("sk-real2"),)))
    auth = Authenticator(tenants)
    fresh = Authenticator(tenants)
    for header in headers * 2:
        try:
            expected: str | int = fresh.tenant(header).name
        except AuthenticationFailed as exc:
            expected = exc.status
        fresh.proven.clear()
        try:
            got: str | int = auth.tenant(header).name
        except AuthenticationFailed as exc:
            got = exc.status
        assert got == expected
    assert set(auth.proven) <= {"sk-real", "sk-real2"}
    assert all(auth.proven[key].name == {"sk-real": "acme", "sk-real2": "beta"}[key]
               for key in auth.proven)


@settings(max_examples=300, deadline=None)
@given(st.none() | st.binary(max_size=64))
def test_media_type_and_length_parsing(value: bytes | None) -> None:
    length = content_length(value)
    assert length is None or (type(length) is int and length >= 0)
    try:
        check_media_type(value)
    except UnsupportedMediaType as exc:
        assert exc.status == 415


HEADER_NAMES = [b"authorization", b"content-length", b"content-type", b"x-specroute-pool",
                b"x-specroute-k", b"x-specroute-benchmark", b"x-other"]
GATEWAY = Gateway(parse_config({"pools": [{"name": "p", "engine": "sglang", "model": "m",
                                            "workers": ["http://127.0.0.1:1"]}],
                                 "tenants": [{"name": "acme",
                                              "api_key_sha256": [hash_api_key("sk-real")]}]}),
                  policy="first", classify=minimal_profile)
GATEWAY.pools["p"].workers[0].healthy = True  # as if probed: the route needs a worker


async def read_and_admit(headers: list, receive: Callable[[], Awaitable[dict]]) -> None:
    tenant, named, raw = await read_request(GATEWAY, {"headers": headers}, receive)  # type: ignore[arg-type]
    await admit(GATEWAY, tenant, named, raw, lambda body: parse_request(body, "completions"))


@settings(max_examples=300, deadline=None)
@given(headers=st.lists(st.tuples(st.sampled_from(HEADER_NAMES),
                                  st.binary(max_size=40) | st.sampled_from(
                                      [b"Bearer sk-real", b"application/json", b"3", b"12"])),
                        max_size=8),
       body=st.binary(max_size=40) | st.just(b'{"model": "m", "prompt": "x"}'))
@example(headers=[(b"authorization", b"Bearer sk-real"), (b"content-type", b"application/json")],
         body=b'{"model": "m", "prompt": "x"}')  # authenticated: the body is read and admitted
def test_read_request_accepts_or_raises_a_client_error(headers: list, body: bytes) -> None:
    """Whatever the header bytes (repeated names included) and body, `read_request`
    then the core's `admit` return or raise a `ClientError` (4xx): never another
    exception."""
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        asyncio.run(read_and_admit(headers, receive))
    except ClientError as exc:
        assert 400 <= exc.status < 500
