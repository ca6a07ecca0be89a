"""The fault matrix: real processes (stub workers, gateways, 127.0.0.1 only), each fault
injected under concurrent mixed traffic (streaming and not), every request's outcome
counted, and the counts asserted: what the clients saw and how many requests were lost.

Faults here: a worker SIGKILLed mid-stream; a worker SIGSTOPped (hangs); a worker whose
answers are broken on the wire (garbage, truncated JSON, 5xx, the connection closed
mid-chunk), or well-formed JSON of the wrong shape (tests/stub_shapes.py: counters as
strings, lists for objects, no choices, bad stream choices, bad usage, a bad
`/server_info`); every worker of a pool down (traffic moves to the other pool, then a clean
503 when none is left); the gateway SIGTERMed (drain); two gateway replicas, one
SIGKILLed. Covered elsewhere (README, "Reliability"): Redis SIGKILLed and restarted
(tests/e2e/test_policy_gateway_outage.py), slow first token and every timeout
(tests/e2e/test_gateway_faults.py), the supervisor's drained relaunch (tests/e2e/test_supervisor.py),
`specroute up` restarting a dead worker (tests/e2e/test_up_heal.py).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from conftest import free_port, start_process, stop_process, wait_http
from gateway_harness import start_stubs
from stub_shapes import SHAPES

FAST = {"health_interval_s": 0.3, "unhealthy_after": 2, "healthy_after": 1,
        "connect_timeout_s": 1.0, "first_token_timeout_s": 1.5, "read_timeout_s": 1.5,
        "breaker_cooldown_s": 2.0}
WORDS = "one two three four five six seven eight nine ten eleven twelve"
HANG_S = 15.0  # a request longer than this counts as hung

GATEWAY_MAIN = """
import logging
import sys
import uvicorn
from gateway.http.app import create_app
from gateway.config import load_config
from gateway.classifier.minimal import minimal_profile
from policies.rules import first_healthy
from gateway.http.serve import uvicorn_options

config = load_config(sys.argv[1])
logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
policy = {"decide": first_healthy} if sys.argv[3] == "first" else {"policy": sys.argv[3]}
uvicorn.run(create_app(config, classify=minimal_profile, **policy),
            host="127.0.0.1", port=int(sys.argv[2]), **uvicorn_options(config.server))
"""


@dataclass
class Outcome:
    start: float
    end: float
    stream: bool
    kind: str  # ok | error_event | cut | refused | transport | hang | http_<status>
    text: str = ""


def one_request(client: httpx.Client, url: str, stream: bool, headers: dict,
                max_tokens: int, first: threading.Event | None = None,
                prompt: str = WORDS) -> tuple[str, str]:
    body = {"model": "m", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": prompt}]}
    try:
        if not stream:
            response = client.post(url + "/v1/chat/completions", json=body, headers=headers)
            if response.status_code != 200:
                return f"http_{response.status_code}", response.text
            return "ok", response.json()["choices"][0]["message"]["content"]
        with client.stream("POST", url + "/v1/chat/completions", json=body,
                           headers=headers) as response:
            if response.status_code != 200:
                return f"http_{response.status_code}", response.read().decode()
            text, done = [], False
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                event = orjson.loads(line[6:])
                if first is not None:
                    first.set()
                if "error" in event:
                    return "error_event", event["error"]["code"]
                for choice in event["choices"]:
                    text.append(choice["delta"].get("content") or "")
            return ("ok" if done else "cut"), "".join(text)
    except httpx.ConnectError:
        return "refused", ""
    except httpx.TimeoutException:
        return "hang", ""
    except httpx.TransportError as exc:
        return "transport", repr(exc)


class Load:
    """`threads` clients, each sending requests back to back (every other one streamed)
    to one of `urls` in turn; a client whose connection is refused tries the next URL
    at once, as a load balancer in front of replicas would."""

    def __init__(self, urls: list[str], threads: int = 8, headers: dict | None = None,
                 streams: bool = True, max_tokens: int = 12) -> None:
        self.urls, self.headers, self.max_tokens = urls, headers or {}, max_tokens
        self.streams = streams
        self.outcomes: list[Outcome] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(threads)]

    def run(self, i: int) -> None:
        n = i
        with httpx.Client(timeout=HANG_S) as client:
            while not self.stop.is_set():
                n += 1
                stream = self.streams and n % 2 == 0
                start = time.monotonic()
                for attempt in range(len(self.urls)):
                    url = self.urls[(n + attempt) % len(self.urls)]
                    kind, text = one_request(client, url, stream, self.headers,
                                             self.max_tokens)
                    if kind != "refused":
                        break
                self.outcomes.append(Outcome(start, time.monotonic(), stream, kind, text))

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(HANG_S + 5)

    def report(self, case: str) -> Counter:
        """All outcomes, printed (`pytest -s` shows the matrix the README quotes)."""
        seen = self.kinds()
        print(f"\nFAULT {case}: {len(self.outcomes)} requests, "
              f"{dict(sorted(seen.items()))}, non-streaming {dict(self.kinds(stream=False))}")
        return seen

    def kinds(self, since: float = 0.0, stream: bool | None = None) -> Counter:
        return Counter(o.kind for o in self.outcomes if o.start >= since
                       and (stream is None or o.stream == stream))

    def wait_for(self, n: int, after: float = 0.0, timeout: float = 20.0) -> None:
        """Until `n` more requests are done (`after`: that started at or after it)."""
        deadline = time.monotonic() + timeout
        target = sum(o.start >= after for o in self.outcomes) + n
        while sum(o.start >= after for o in list(self.outcomes)) < target:
            assert time.monotonic() < deadline, f"only {len(self.outcomes)} requests done"
            time.sleep(0.05)


def pool(name: str, workers: list[str], method: str = "plain", k: int = 0) -> dict:
    return {"name": name, "engine": "sglang", "method": method, "k": k, "model": "m",
            "workers": workers}


def gateway(tmp: Path, config: dict, name: str = "gateway", policy: str = "first") -> tuple:
    """A gateway serving `config`; its /ready detail is read over loopback."""
    config = {**config, "server": {"loopback_admin": True, **config.get("server", {})}}
    port = free_port()
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = start_process(["-c", GATEWAY_MAIN, str(path), str(port), policy],
                         tmp / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/ready", 30, proc)
    return proc, url


def no_tracebacks(log: Path) -> None:
    text = log.read_text()
    assert "Traceback" not in text and "internal_error" not in text, text[-3000:]


@pytest.fixture
def procs() -> Iterator[dict]:
    """Every process a case starts, stopped at its end whatever happened."""
    started: dict = {}
    yield started
    for proc in reversed(started.values()):
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        stop_process(proc)


STUB = ["--model", "m", "--method", "plain", "--k", "0", "--incremental", "--step-s", "0.01",
        "--drip", "0.03"]


def test_worker_sigkilled_mid_stream(tmp_path: Path, procs: dict) -> None:
    """Requests on the killed worker before their first token are retried on the other
    (not lost); streams past their first token end with an error event; after that, all
    succeed."""
    stubs, urls = start_stubs(tmp_path, {"w1": STUB, "w2": STUB})
    procs.update(stubs)
    procs["gw"], url = gateway(tmp_path, {"server": FAST,
                                          "pools": [pool("p", [urls["w1"], urls["w2"]])]})
    with Load([url]) as load:
        load.wait_for(16)
        procs["w1"].kill()
        killed = time.monotonic()
        load.wait_for(24, after=killed + 0.5)
    seen = load.report("worker SIGKILLed mid-stream")
    assert set(seen) <= {"ok", "error_event"}, seen
    assert load.kinds(stream=False)["ok"] == sum(load.kinds(stream=False).values()), seen
    assert seen["error_event"] <= 8  # at most the streams in flight on w1
    assert set(load.kinds(since=killed + 0.5)) == {"ok"}
    assert all(o.text.split() == WORDS.split() for o in load.outcomes if o.kind == "ok")
    no_tracebacks(tmp_path / "gateway.log")


def test_worker_sigstopped_hangs(tmp_path: Path, procs: dict) -> None:
    """A hung worker costs its requests the first-token or read timeout, then they are
    retried on the other worker; only streams already past their first token end with
    an error event. Nothing hangs; the worker comes back after SIGCONT."""
    stubs, urls = start_stubs(tmp_path, {"w1": STUB, "w2": STUB})
    procs.update(stubs)
    procs["gw"], url = gateway(tmp_path, {"server": FAST,
                                          "pools": [pool("p", [urls["w1"], urls["w2"]])]})
    with Load([url]) as load:
        load.wait_for(16)
        procs["w1"].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        load.wait_for(24, after=stopped + 3.0)
        procs["w1"].send_signal(signal.SIGCONT)
    seen = load.report("worker SIGSTOPped")
    assert set(seen) <= {"ok", "error_event"}, seen
    assert load.kinds(stream=False)["ok"] == sum(load.kinds(stream=False).values()), seen
    assert seen["error_event"] <= 8
    assert max(o.end - o.start for o in load.outcomes) < HANG_S
    assert set(load.kinds(since=stopped + 3.0)) == {"ok"}  # probes took it out
    deadline = time.monotonic() + 10
    while httpx.get(url + "/ready", timeout=2).json()["pools"]["p"]["healthy_workers"] < 2:
        assert time.monotonic() < deadline, "w1 did not come back after SIGCONT"
        time.sleep(0.2)
    no_tracebacks(tmp_path / "gateway.log")


WIRE_FAULTS = ["garbage", "truncated", "status500", "close-mid-chunk"]


@pytest.fixture(scope="module")
def broken_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One good worker, one broken worker per fault; pool `<fault>` = [broken, good], and
    for each malformed shape a second pool `<shape>-gen` on the same two (its own
    breakers) for the completions that go to `/generate`."""
    tmp = tmp_path_factory.mktemp("broken")
    faults = [*WIRE_FAULTS, *SHAPES]
    stubs, urls = start_stubs(tmp, {"good": STUB, **{f: [*STUB, "--fault", f]
                                                     for f in faults}})
    try:
        proc, url = gateway(tmp, {"server": {**FAST, "max_attempts": 2,
                                             "breaker_cooldown_s": 60.0},
                                  "pools": [pool(f, [urls[f], urls["good"]])
                                            for f in faults]
                                  + [pool(f"{f}-gen", [urls[f], urls["good"]])
                                     for f in SHAPES]})
        stubs["gateway"] = proc
        yield {"url": url, "urls": urls, "log": tmp / "gateway.log"}
    finally:
        for proc in reversed(stubs.values()):  # the gateway first
            stop_process(proc)


@pytest.mark.parametrize("fault", [*WIRE_FAULTS, *SHAPES])
def test_worker_answering_broken(broken_fleet: dict, fault: str) -> None:
    """Every broken answer before a first token (a malformed shape included: its fault is
    in the first event) is retried on the good worker (nothing lost); a connection closed
    after a stream's first token is an error event, and only until the broken worker's
    breaker opens (3 failures in a row)."""
    url = broken_fleet["url"]
    with Load([url], headers={"x-specroute-pool": fault}) as load:
        load.wait_for(40)
    seen = load.report(f"worker answering {fault}")
    if fault == "close-mid-chunk":
        assert set(seen) <= {"ok", "error_event"}, seen
        assert seen["error_event"] <= 3 + 8, seen  # the breaker's count + those in flight
    else:
        assert set(seen) == {"ok"}, seen
    assert load.kinds(stream=False) == Counter(ok=sum(load.kinds(stream=False).values()))
    state = httpx.get(url + "/ready", timeout=2).json()["pools"][fault]["worker_states"]
    assert state[0]["url"] == broken_fleet["urls"][fault] and state[0]["breaker"] == "open"
    no_tracebacks(broken_fleet["log"])


@pytest.mark.parametrize("shape", SHAPES)
def test_worker_answering_malformed_generate(broken_fleet: dict, shape: str) -> None:
    """Completions go to SGLang's `/generate`: each malformed answer there, streamed or
    not, is an upstream protocol error retried on the good worker; it opens the broken
    worker's breaker; the gateway's `/server_info` skips the worker whose own is
    malformed and still answers."""
    url, pool_name = broken_fleet["url"], f"{shape}-gen"
    seen: Counter = Counter()
    with httpx.Client(timeout=HANG_S, headers={"x-specroute-pool": pool_name}) as client:
        for i in range(8):
            body = {"model": "m", "prompt": WORDS, "max_tokens": 12, "stream": i % 2 == 1}
            response = client.post(url + "/v1/completions", json=body)
            if response.status_code != 200:
                seen[f"http_{response.status_code}"] += 1
                continue
            if body["stream"]:
                events = [orjson.loads(line[6:]) for line in response.text.splitlines()
                          if line.startswith("data: ") and line != "data: [DONE]"]
                text = "".join(c["text"] for e in events for c in e.get("choices", ()))
            else:
                text = response.json()["choices"][0]["text"]
            seen["ok" if text.split() == WORDS.split() else "wrong"] += 1
    print(f"\nFAULT worker answering {shape} on /generate: {dict(seen)}")
    assert seen == Counter(ok=8), seen
    state = httpx.get(url + "/ready", timeout=2).json()["pools"][pool_name]["worker_states"]
    assert state[0]["url"] == broken_fleet["urls"][shape] and state[0]["breaker"] == "open"
    info = httpx.get(url + "/server_info", timeout=5)
    assert info.status_code == 200, info.text
    assert all(isinstance(s, dict) for s in info.json()["internal_states"])
    no_tracebacks(broken_fleet["log"])


def test_every_worker_of_a_pool_down(tmp_path: Path, procs: dict) -> None:
    """The preferred pool's only worker dies: its traffic moves to the plain pool with no
    request lost. The plain pool's dies too: once the probes saw it, a clean OpenAI-shaped
    503 at once. A worker back on its port: served again."""
    eagle = ["--model", "m", "--method", "eagle", "--k", "3", "--step-s", "0.01"]
    stubs, urls = start_stubs(tmp_path, {"eagle": eagle, "plain": STUB})
    procs.update(stubs)
    procs["gw"], url = gateway(tmp_path, {"server": FAST, "pools": [
        pool("eagle", [urls["eagle"]], "eagle", 3), pool("plain", [urls["plain"]])]})
    with Load([url], streams=False) as load:
        load.wait_for(16)
        procs["eagle"].kill()
        load.wait_for(40)
    assert load.report("the preferred pool's only worker SIGKILLed") == Counter(
        ok=len(load.outcomes))
    procs["plain"].kill()
    procs["plain"].wait(5)
    # once the gateway knows (a request racing the death gets a 502: every worker tried
    # refused the connection)
    deadline = time.monotonic() + 10
    while httpx.get(url + "/ready", timeout=2).status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with Load([url]) as load:
        load.wait_for(16)
    assert set(load.report("every worker of every pool down")) == {"http_503"}
    answer = orjson.loads(next(o.text for o in load.outcomes))
    assert answer["error"]["code"] == "no_healthy_worker"
    assert max(o.end - o.start for o in load.outcomes) < 3.0
    port = int(urls["plain"].rsplit(":", 1)[1])
    procs["plain2"] = start_process(["tests/sglang_stub.py", "--port", str(port), *STUB],
                                    tmp_path / "plain2.log")
    wait_http(url + "/ready", 20)
    with Load([url]) as load:
        load.wait_for(16)
    assert set(load.kinds()) == {"ok"}
    no_tracebacks(tmp_path / "gateway.log")


def test_gateway_sigterm_drains(tmp_path: Path, procs: dict) -> None:
    """`specroute gateway` SIGTERMed with streams in flight: new connections are refused
    at once, streams that end within `drain_timeout_s` end whole, longer ones end at it
    with a `shutting_down` error event, and the process exits 0."""
    stubs, urls = start_stubs(tmp_path, {"w": [*STUB[:-2], "--drip", "0.25"]})
    procs.update(stubs)
    port = free_port()
    config = {"server": {**FAST, "drain_timeout_s": 3.0},
              "pools": [pool("p", [urls["w"]])]}
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(config))
    procs["gw"] = start_process(["-m", "specroute.cli", "gateway", "--config",
                                 str(tmp_path / "gw.yaml"), "--port", str(port), "--policy",
                                 "first"], tmp_path / "gw.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/ready", 60, procs["gw"])
    results: dict[int, tuple[str, str]] = {}
    firsts = [threading.Event() for _ in range(6)]

    def stream(i: int, max_tokens: int) -> None:
        with httpx.Client(timeout=HANG_S) as client:
            results[i] = one_request(client, url, True, {}, max_tokens, firsts[i],
                                     " ".join([WORDS] * 4))

    # 8 tokens (~2 s, within the drain) and 40 (~10 s, cut at it)
    threads = [threading.Thread(target=stream, args=(i, 8 if i < 4 else 40)) for i in range(6)]
    for thread in threads:
        thread.start()
    for first in firsts:
        assert first.wait(10)
    procs["gw"].send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with httpx.Client(timeout=5) as client:
        assert one_request(client, url, False, {}, 4)[0] == "refused"
    for thread in threads:
        thread.join(HANG_S)
    assert procs["gw"].wait(10) == 0
    print(f"\nFAULT gateway SIGTERM: {[results[i][0] for i in range(6)]}, new request refused")
    assert [results[i] for i in range(4)] == [("ok", " ".join(WORDS.split()[:8]))] * 4
    assert [results[i] for i in range(4, 6)] == [("error_event", "shutting_down")] * 2
    log = (tmp_path / "gw.log").read_text()
    assert "timeout graceful shutdown exceeded" in log
    assert log.count("cut by the shutdown") == 2 and "Traceback" not in log


def test_two_replicas_one_killed(tmp_path: Path, procs: dict, redis_url: str) -> None:
    """Two gateway replicas (learned policy, one Redis) behind a client that moves on
    when a connection is refused: one replica SIGKILLed loses only what it had in
    flight; the other serves everything after, and keeps feeding the shared telemetry."""
    stubs, urls = start_stubs(tmp_path, {"w1": STUB, "w2": STUB})
    procs.update(stubs)
    config = {"server": FAST, "redis_url": redis_url,
              "pools": [pool("p", [urls["w1"], urls["w2"]])]}
    procs["a"], a = gateway(tmp_path, config, "a", "learned")
    procs["b"], b = gateway(tmp_path, config, "b", "learned")
    with Load([a, b]) as load:
        load.wait_for(24)
        procs["a"].kill()
        killed = time.monotonic()
        load.wait_for(24, after=killed + 0.2)
    seen = load.report("replica SIGKILLed")
    assert set(seen) <= {"ok", "transport", "cut"}, seen
    assert seen["transport"] + seen["cut"] <= 8, seen  # at most what a had in flight
    assert set(load.kinds(since=killed + 0.2)) == {"ok"}
    assert httpx.get(b + "/ready", timeout=2).status_code == 200
    no_tracebacks(tmp_path / "b.log")
