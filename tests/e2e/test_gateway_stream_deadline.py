"""A stream ends at `server.total_timeout_s` too (issue 24: only non-streamed requests did),
through the real gateway, three `tests/stall_stub.py` workers (real aiohttp servers that
stall or trickle on cue) and the official `openai` client.

Mid-stream, the gateway ends it the way a max_tokens cut ends: a last chunk with
`finish_reason: "length"` (and `specroute.cut`), then `[DONE]`; the client iterates to the
end without an exception, and the worker sees its client go (its slot is free). Before
the first token, failover to other workers stays inside the same deadline: a 504 at
`total_timeout_s`, not after `max_attempts` first-token timeouts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from gateway_harness import gateway_over, start_stubs

TIMEOUTS = {"first_token_timeout_s": 2.0, "read_timeout_s": 2.0, "total_timeout_s": 3.0,
            "max_attempts": 3, "breaker_failures": 1000, "health_interval_s": 0.5}
SLACK_S = 2.0  # the shared 2-core box; before the fix the failover case took 6 s


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp: Path = tmp_path_factory.mktemp("deadline")
    procs, urls = start_stubs(tmp, {f"w{i}": [] for i in range(3)},
                              script="tests/stall_stub.py")
    config = {"server": TIMEOUTS,
              "pools": [{"name": "p", "engine": "sglang", "method": "plain", "k": 0,
                         "model": "m", "workers": sorted(urls.values())}]}
    with gateway_over(tmp, config, procs) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                               timeout=30)
        yield {"client": client, "workers": list(urls.values()), "log": tmp / "gw.log"}


def open_streams(stack: dict) -> int:
    return sum(httpx.get(url + "/stats").json()["open_streams"] for url in stack["workers"])


def wait_for(done, timeout_s: float) -> None:  # noqa: ANN001 - any predicate
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the worker still streams to the gateway"
        time.sleep(0.05)


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_trickling_stream_ends_at_the_total_timeout_with_length(stack: dict,
                                                                  route: str) -> None:
    """A token every 0.3 s, forever: no read timeout trips; the total one ends it."""
    client: openai.OpenAI = stack["client"]
    start = time.monotonic()
    if route == "chat":
        chunks = list(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "TRICKLE"}], stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        chunks = list(client.completions.create(model="m", prompt="TRICKLE", max_tokens=4,
                                                stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    took = time.monotonic() - start
    assert TIMEOUTS["total_timeout_s"] - 0.2 < took < TIMEOUTS["total_timeout_s"] + SLACK_S
    assert text.startswith("okok")  # several tokens came before the cut
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length"
    assert (last.model_extra or {})["specroute"]["cut"] == "server.total_timeout_s"
    wait_for(lambda: open_streams(stack) == 0, 5)  # the worker saw its client go


def test_failover_before_the_first_token_ends_at_the_total_timeout(stack: dict) -> None:
    """Every worker sends SSE comments and no token: two first-token timeouts (2 s each)
    would fail over to a third worker; the deadline ends it at 3 s with a 504."""
    start = time.monotonic()
    with pytest.raises(openai.APIStatusError) as caught:
        list(stack["client"].chat.completions.create(
            model="m", messages=[{"role": "user", "content": "STALL_FIRST"}], stream=True))
    took = time.monotonic() - start
    assert TIMEOUTS["total_timeout_s"] - 0.2 < took < TIMEOUTS["total_timeout_s"] + SLACK_S
    assert caught.value.status_code == 504
    assert "total_timeout_s" in caught.value.message
    wait_for(lambda: open_streams(stack) == 0, 5)
    assert "Traceback" not in stack["log"].read_text()


def test_a_native_generate_stream_ends_at_the_total_timeout_with_an_error_event(
        stack: dict) -> None:
    """SGLang's native stream has no finishing chunk of the gateway's own: the cut is
    SGLang's in-band error event, then `[DONE]`."""
    start = time.monotonic()
    response = httpx.post(str(stack["client"].base_url).removesuffix("/v1/") + "/generate",
                          json={"text": "TRICKLE", "stream": True}, timeout=30)
    took = time.monotonic() - start
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert TIMEOUTS["total_timeout_s"] - 0.2 < took < TIMEOUTS["total_timeout_s"] + SLACK_S
    assert len(events) > 3 and events[-1] == "[DONE]"
    assert orjson.loads(events[-2])["error"]["code"] == "upstream_timeout"
    wait_for(lambda: open_streams(stack) == 0, 5)
