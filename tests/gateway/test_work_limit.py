"""The work limit as configured (`server.max_request_work`, the `max_tokens` a request
without one gets) and the response-size limit at the wire boundary: an answer past
`server.max_response_bytes` is a 502 that is neither retried nor held against the
worker (a direct `UpstreamError`, not one of dispatch's retryable ones)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import ConfigError, ServerConfig, parse_config
from gateway.errors import InvalidRequest, UpstreamTooLarge, UpstreamUnavailable
from gateway.http.sglang_routes import parse_generate
from gateway.schemas import parse_request
from gateway.upstream.adapters.calls import post_json
from gateway.upstream.http1 import Http1Client

SERVER = ServerConfig(max_request_work=1000, default_max_tokens=600)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_the_configured_limit_and_default_max_tokens_count() -> None:
    parse_request({**CHAT, "max_tokens": 1000}, "chat", SERVER)
    with pytest.raises(InvalidRequest) as refused:
        parse_request({**CHAT, "max_tokens": 1001}, "chat", SERVER)
    assert refused.value.param == "max_tokens"
    parse_request({**CHAT, "n": 1}, "chat", SERVER)  # 600 by default
    with pytest.raises(InvalidRequest) as refused:
        parse_request({**CHAT, "n": 2}, "chat", SERVER)  # 2 x 600
    assert refused.value.param == "n" and "1200" in refused.value.message
    with pytest.raises(InvalidRequest) as refused:
        parse_generate({"text": "hi", "sampling_params": {"max_new_tokens": 1001}}, ["m"],
                       SERVER)
    assert refused.value.param == "sampling_params.max_new_tokens"
    # prompt logprobs count too: 4,000 prompt tokens (bytes / 4) from position 0
    prompt_logprobs = {"text": "x" * 16000, "return_logprob": True,
                       "sampling_params": {"max_new_tokens": 1}}
    parse_generate(prompt_logprobs, ["m"], SERVER)
    with pytest.raises(InvalidRequest) as refused:
        parse_generate({**prompt_logprobs, "logprob_start_len": 0}, ["m"], SERVER)
    assert refused.value.code == "request_too_large" and "4001" in refused.value.message


@pytest.mark.parametrize("name", ["max_request_work", "max_response_bytes"])
def test_the_limits_must_be_positive(name: str) -> None:
    pools = [{"name": "p", "engine": "sglang", "model": "m", "workers": ["http://a:1"]}]
    with pytest.raises(ConfigError, match=f"server.{name}: must be > 0"):
        parse_config({"pools": pools, "server": {name: 0}})


async def test_an_answer_past_the_size_limit_is_a_502_not_retried() -> None:
    async def runaway(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 30))
        try:
            while True:
                writer.write(b"x" * 65536)
                await writer.drain()
        except ConnectionError:
            writer.close()

    server = await asyncio.start_server(runaway, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = Http1Client(2, 2, 5, max_response_bytes=1 << 20)
    try:
        with pytest.raises(UpstreamTooLarge) as cut:
            await post_json(client, url, "/generate", {"text": "hi"})
    finally:
        server.close()
        client.close()
    assert cut.value.status == 502 and cut.value.code == "upstream_response_too_large"
    assert not isinstance(cut.value, UpstreamUnavailable)  # dispatch's RETRYABLE
    assert url not in cut.value.message  # no internal address in what the client reads
