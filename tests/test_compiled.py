"""The compiled hot path (gateway/compiled.py, built by setup.py with mypyc) gives the
answers of its pure-Python source: the same classification, text-model scores,
validation verdicts and routing decisions. The pure side runs in a child process that
imports every listed module from its `.py` (a path finder ahead of the extensions)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from gateway.compiled import (
    COMPILED,
    ROOT,
    extension_path,
    log_start,
    module_name,
    stale,
    summary,
)

BODIES = [
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.3,
     "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True}},
    {"model": "m", "messages": [{"role": "system", "content": "Be terse."},
                                {"role": "user", "content": [{"type": "text", "text": "x"}]}],
     "response_format": {"type": "json_object"}, "stop": ["\n"], "seed": 3, "n": 2},
    {"model": "m", "messages": [{"role": "user", "content": "q"}],
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
     "tool_choice": "auto", "top_p": 0.9, "logprobs": True, "top_logprobs": 2},
    {"model": "m", "messages": []},
    {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 3},
    {"model": "m", "messages": [{"role": "wizard", "content": "q"}]},
    {"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": -1},
    {"model": "m", "messages": [{"role": "user", "content": "q"}], "stop": [1]},
    {"model": 5, "messages": [{"role": "user", "content": "q"}]},
    {"messages": [{"role": "user", "content": "q"}]},
    "not an object",
]
PURE_FINDER = """
import importlib.abc, importlib.util, sys
PURE = {PURE!r}
class Pure(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_file_location(name, PURE[name]) if name in PURE else None
sys.meta_path.insert(0, Pure())
"""


def answers() -> list[str]:
    """What the listed modules answer on the classifier's and the router's test inputs."""
    from bench.gateway.classifier import HELDOUT_SETS, PROMPT_4KB, _router, chat_request, heldout
    from bench.training.classifier.data import build_dataset
    from gateway.classifier.classify import classify, load_classifier
    from gateway.errors import InvalidRequest
    from gateway.schemas import parse_request

    model, router = load_classifier(), _router()
    texts = [row["text"] for path in HELDOUT_SETS for row in heldout(path)]
    texts += [e.text for e in build_dataset("test", per_class=60)] + [PROMPT_4KB, ""]
    out = []
    for text in texts:
        request = chat_request(text)
        profile = classify(request)
        prediction = model.predict(text)
        decision, pools = router.route(request, profile)
        out.append(repr((profile.task, profile.reasons, profile.prompt_tokens,
                         prediction.label, [round(p, 12) for p in prediction.probabilities],
                         prediction.top_features, decision.pool, decision.k,
                         round(decision.predicted_tokens_per_s, 9), decision.reason,
                         [pool.name for pool in pools])))
        out.append(repr(profile))  # the features and the predictor's fields too
        out += reported(request, profile, decision)
    for body in BODIES:
        try:
            parsed = parse_request(body, "chat")
            out.append(repr(parsed))
        except InvalidRequest as exc:
            out.append(f"InvalidRequest {exc.param} {exc}")
        out.append(forwarding_answer(body))
    return out + wire_answers() + reply_answers() + admit_answers()


def admit_answers() -> list[str]:
    """The admission pipeline (`gateway.core.admit`) on a gateway with the learned policy:
    what it admits and where to, or the client error it answers."""
    import asyncio
    import time

    from gateway.config import hash_api_key, parse_config
    from gateway.core.admit import admit
    from gateway.errors import GatewayError
    from gateway.http.gateway import Gateway
    from gateway.schemas import parse_request

    gateway = Gateway(parse_config({
        "pools": [{"name": name, "engine": "sglang", "model": "m", "method": name,
                   "workers": [f"http://127.0.0.1:{port}"]}
                  for name, port in (("plain", 1), ("ngram", 2))],
        "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key("sk")], "may_pin": True}]}))
    for pool in gateway.pools.values():
        pool.workers[0].healthy = True  # as if probed: the route needs a worker
    tenant = gateway.config.tenants[0]
    cases = [({}, b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'),
             ({"x-specroute-pool": "ngram"},
              b'{"model": "m", "messages": [{"role": "user", "content": "fix: x = 1"}]}'),
             ({}, b'{"model": "m", "messages": []}'), ({}, b"{not json"),
             ({}, b" " * (gateway.config.server.max_body_bytes + 1)),
             ({"x-specroute-k": "x"}, b'{"model": "m", "messages": []}')]
    out = []
    for queue in (None, time.monotonic()):
        for headers, raw in cases:
            try:
                job = asyncio.run(admit(gateway, tenant, headers, raw,
                                        lambda body: parse_request(body, "chat"), queue=queue))
                out.append(repr((job.decision.pool, job.decision.k, job.profile.task,
                                 [p.name for p in job.pools], job.pin, job.ticket is None)))
            except GatewayError as exc:
                out.append(f"{type(exc).__name__} {exc.status} {exc}")
    return out


def reported(request: object, profile: object, decision: object) -> list[str]:
    """The rendered answer, its headers, a stream's chunks and the telemetry record of one
    finished request, as the compiled responses and record modules build them (the
    response id and clock fields left out: drawn per process)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gateway.config import TenantConfig
    from gateway.http.responses import ChunkWriter, headers_for, response_body
    from gateway.telemetry.record import Outcome, Timer, request_record
    from gateway.telemetry.tenant_metrics import TenantMetrics
    from gateway.telemetry.worker_stats import SpecStats, Usage
    from gateway.upstream.adapters.base import Delta, Final, GenerationResult

    usage, spec = Usage(prompt_tokens=40, completion_tokens=9), SpecStats(3, 2.5, 0.5, 6, 12)
    result = GenerationResult("answer text", "stop", usage, spec)
    body = orjson.loads(response_body(request, result, decision))  # type: ignore[arg-type]
    writer = ChunkWriter(request, decision)  # type: ignore[arg-type]
    events = b"".join((writer.delta(Delta("a", {"role": "assistant"})),
                       writer.final(Final(usage, spec, "stop")))).split(b"\n\n")
    chunks = [orjson.loads(event.removeprefix(b"data: ")) if event.startswith(b"data: {")
              else {"raw": event} for event in events]
    outcome = Outcome(request, profile, TenantConfig("t"), decision,  # type: ignore[arg-type]
                      Timer(10.0, 10.02), 3, 2, usage, spec, True, "stop")
    record, _ = request_record(outcome, 10.5)
    registry = CollectorRegistry()
    TenantMetrics(registry).record(record)
    return [generate_latest(registry).decode(),
            repr(sorted((k, v) for k, v in body.items() if k not in ("id", "created"))),
            repr(headers_for(decision)),  # type: ignore[arg-type]
            repr([{k: v for k, v in c.items() if k not in ("id", "created")} for c in chunks]),
            repr({k: v for k, v in vars_of(record).items() if k != "timestamp"})]


def vars_of(record: object) -> dict:
    import dataclasses

    return dataclasses.asdict(record) if dataclasses.is_dataclass(record) \
        else dict(vars(record))


def forwarding_answer(body: object) -> str:
    from gateway.errors import InvalidRequest
    from gateway.forwarding import forwarded

    if not isinstance(body, dict):
        return "not a dict"
    try:
        return repr([forwarded(body, endpoint, engine) for endpoint in ("chat", "completions")
                     for engine in ("sglang", "vllm", "openai")])
    except InvalidRequest as exc:
        return f"InvalidRequest {exc.param} {exc}"


def reply_answers() -> list[str]:
    """Workers' answers read: the bench upstream's own (SGLang's chat, stream and
    /generate), a vLLM answer with its speculation metrics and broken shapes, whole (the
    adapter's `result_from_body`, one chunk's deltas) and by the picker's response reader
    fed in pieces; the picker's route table and its refusals."""
    from bench.gateway import upstream
    from gateway.errors import GatewayError, InvalidRequest, RateLimited
    from gateway.picker.exchange import refusal
    from gateway.picker.place import route_of
    from gateway.picker.reading import ResponseReader
    from gateway.upstream.adapters.openai_body import deltas_from_chunk, result_from_body
    from gateway.upstream.adapters.reply import Reply

    chat = orjson.loads(upstream._CHAT)
    vllm = {**chat, "sglext": None, "metrics": {"speculative_decoding": {
        "mean_acceptance_length": 2.75, "draft_acceptance_rate": 0.58, "num_spec_steps": 4,
        "num_accepted_draft_tokens": 7, "num_draft_tokens": 12}}}
    bodies = [chat, vllm, {**chat, "choices": []}, {**chat, "usage": {"prompt_tokens": -1}},
              {"choices": [{"index": 0, "text": "t", "finish_reason": "length"}]},
              {"choices": [{"index": "0", "message": {"content": 3}}]}]
    out = []
    for body in bodies:
        for is_chat in (True, False):
            try:
                out.append(repr(result_from_body("w", body, is_chat)))
            except GatewayError as exc:
                out.append(f"{type(exc).__name__} {exc}")
    for event in upstream._CHAT_STREAM.split(b"\n\n"):
        if event.startswith(b"data: {"):
            out.append(repr(deltas_from_chunk(Reply("w", orjson.loads(event[6:])), True)))
    for answer, streaming in ((upstream._CHAT_STREAM, True), (upstream._GENERATE_STREAM, True),
                              (upstream._CHAT, False), (orjson.dumps(vllm), False),
                              (upstream._GENERATE, False), (b"not json", False)):
        for cut in (5, 64, len(answer)):
            reader = ResponseReader(streaming=streaming)
            for start in range(0, len(answer), cut):
                reader.feed(answer[start:start + cut])
            reader.finish()
            out.append(repr((reader.usage, reader.spec, reader.finish_reason,
                             reader.tokens_seen, reader.done)))
    out += [repr(route_of(path)) for path in ("/v1/chat/completions?x=1", "/v1/completions",
                                              "/generate", "/v1/models", "")]
    for exc in (InvalidRequest("bad", param="model"), RateLimited("slow down", retry_after_s=3, code="rate_limited")):
        out.append(repr(refusal(exc).SerializeToString()))
    return out


def slo_answers() -> list[str]:
    """`policies.slo.choose` over a grid of options, targets and loads."""
    from policies.slo import SloOption, SloTarget, choose

    out = []
    for busy in (False, True):
        options = [SloOption(f"p{i}", "eagle" if i else "plain", i, 10.0 + 9 * i, 1 + i / 2,
                             wait_ms=40.0 * i, busy=busy and i > 0, higher_priority=i % 2)
                   for i in range(4)]
        for ttft, tpot, priority in ((50, 60, 0), (500, 30, 1), (2000, 200, 2)):
            for pick in options:
                choice = choose(pick, options, SloTarget("t", ttft, tpot, priority))
                out.append(repr((choice, choice.kind)))
    return out


def auth_answers() -> list[str]:
    """Which tenant a bearer key names, and what a tenant may pin."""
    import hashlib

    from gateway.config import TenantConfig
    from gateway.errors import GatewayError
    from gateway.pins import Pin
    from gateway.tenants.auth import Authenticator, authorize, is_loopback_host

    tenants = (TenantConfig("a", (hashlib.sha256(b"ka").hexdigest(),)),
               TenantConfig("b", (hashlib.sha256(b"kb").hexdigest(),), max_tokens=8))
    auth = Authenticator(tenants)
    request = chat_request_of("hi")
    out = []
    for header in ("Bearer ka", "Bearer kb", "Bearer kc", "ka", None, "Bearer "):
        try:
            tenant = auth.tenant(header)
            authorize(tenant, request, Pin())
            authorize(tenant, request, Pin.from_headers("eagle", "3", None))
            out.append(tenant.name)
        except GatewayError as exc:
            out.append(f"{type(exc).__name__} {exc}")
    return out + [repr(is_loopback_host(h)) for h in ("127.0.0.1", "::1", "0.0.0.0", "x")]


def chat_request_of(text: str) -> object:
    from bench.gateway.classifier import chat_request

    return chat_request(text)


def wire_answers() -> list[str]:
    """The upstream client's parsing of answers cut at every byte (`Connection` fed as
    the loop would), the metric series' exposition and the body checks."""
    import time

    from prometheus_client import CollectorRegistry, generate_latest

    from gateway.http.bodies import check_media_type, content_length
    from gateway.telemetry.series import Counter, Histogram
    from gateway.upstream.http1 import Connection, Http1Client, Response
    from gateway.upstream.targets import target

    out = []
    for answer in (b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world",
                   b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
                   b"HTTP/1.1 503 Busy\r\nConnection: close\r\n\r\n{\"error\": 1}",
                   b"garbage\r\n\r\n"):
        for cut in (1, 7, len(answer)):
            connection = Connection(Http1Client(5, 5, 5), target("http://127.0.0.1:1"))
            response = Response(connection, time.monotonic() + 60, 60)
            connection.response = response
            for start in range(0, len(answer), cut):
                connection.data_received(answer[start:start + cut])
            connection.connection_lost(None)
            out.append(repr((response.status, bytes(response.buffer), response.complete,
                             repr(response.error), connection.keep)))
    out += slo_answers() + auth_answers()
    registry = CollectorRegistry()
    counter = Counter("c", "a counter", ("pool", "ok"), registry=registry)
    histogram = Histogram("h", "a histogram", ("pool",), registry=registry,
                          buckets=(0.01, 0.1, 1.0))
    for i in range(50):
        counter.labels(f"p{i % 3}", str(i % 2 == 0)).inc(i / 7)
        histogram.labels(f"p{i % 2}").observe(i / 40)
    out.append(generate_latest(registry).decode())
    for value in (b"12", b"-1", b"x", None, b"application/json; charset=utf-8", b"text/plain"):
        for check in (content_length, check_media_type):
            try:
                out.append(repr(check(value)))
            except Exception as exc:  # noqa: BLE001 - the verdict is the answer
                out.append(f"{type(exc).__name__} {exc}")
    return out


def loaded_files() -> dict[str, str]:
    return {module_name(path): sys.modules[module_name(path)].__file__ or ""
            for path in COMPILED if module_name(path) in sys.modules}


def pure_answers() -> tuple[list[str], dict[str, str]]:
    pure = {module_name(path): str(ROOT / path) for path in COMPILED}
    code = (PURE_FINDER.replace("{PURE!r}", repr(pure)) + "import json, test_compiled\n"
            "print(json.dumps([test_compiled.answers(), test_compiled.loaded_files()]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True, timeout=240)
    result, files = json.loads(done.stdout)
    return result, files


def test_compiled_and_pure_give_the_same_answers() -> None:
    pure, files = pure_answers()
    assert all(path.endswith(".py") for path in files.values()), files
    assert set(files) == {module_name(path) for path in COMPILED}
    assert answers() == pure


def test_the_build_is_there_where_required() -> None:
    """scripts/test.sh sets SPECROUTE_REQUIRE_COMPILED=1 (CI runs the compiled build): every
    listed module then loads from its extension, built from the source beside it."""
    names = [module_name(path) for path in COMPILED]
    if os.environ.get("SPECROUTE_REQUIRE_COMPILED") != "1":
        pytest.skip("SPECROUTE_REQUIRE_COMPILED is not set")
    assert [name for name in names if extension_path(name) is None] == [], summary()
    assert stale(names) == [], summary()


def test_no_compiled_module_runs_older_code_than_its_source() -> None:
    names = [module_name(path) for path in COMPILED]
    assert stale(names) == [], summary()


def test_every_listed_module_exists_and_the_summary_names_the_build() -> None:
    assert all((ROOT / path).is_file() for path in COMPILED)
    level, line = summary()
    compiled = [p for p in COMPILED if extension_path(module_name(p)) is not None]
    assert ("compiled with mypyc" in line) == bool(compiled)
    assert Path(ROOT / "setup.py").read_text().count("gateway/compiled.py") >= 1


def test_the_start_line_says_which_build_runs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="specroute.gateway"):
        log_start(logging.getLogger("specroute.gateway"))
    [record] = caplog.records
    assert record.getMessage() == summary()[1]
    assert record.getMessage().startswith("hot path: ")


def test_no_python_class_subclasses_a_compiled_one() -> None:
    """A compiled class is a C type that refuses subclasses defined in Python (TypeError
    at instantiation, only where the build ran): every class that derives from a class of
    a `COMPILED` module is itself in a compiled module."""
    import ast

    root = Path(__file__).resolve().parents[1]
    compiled = set(COMPILED)
    defined: dict[str, str] = {}
    for module in compiled:
        for node in ast.parse((root / module).read_text()).body:
            if isinstance(node, ast.ClassDef):
                defined[node.name] = module
    offenders = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root).as_posix()
        if relative in compiled or relative.startswith((".venv/", "build/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                    if name in defined:
                        offenders.append(f"{relative}: {node.name}({name}) of {defined[name]}")
    assert not offenders, offenders
