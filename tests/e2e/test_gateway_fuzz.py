"""Fuzzing the gateway's production path with schemathesis against its own OpenAPI
document (`GET /openapi.json`, `gateway.http.openapi`): every route, with a tenant's key,
a capped tenant's key and no key, data that fits the schema and data that does not
(schemathesis's examples, coverage and fuzzing phases). Whatever comes in, the gateway
answers below 500 and every error is in the OpenAI shape.

The production path: `specroute gateway`'s app with the learned policy, the shipped
classifier, tenants and hashed keys, a real Redis (telemetry, rate limits), two pools
(SGLang-shaped and vLLM-shaped stub workers) each with a worker answering malformed
shapes (tests/stub_shapes.py) beside a good one: a malformed reply is retried, so no
client ever sees it. The number of examples is bounded (`SPECROUTE_FUZZ_EXAMPLES`,
default 6 per route and mode: 5,916 requests, most from the coverage phase); the module
prints how many it sent, by status.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import httpx
import orjson
import pytest
import schemathesis
from conftest import stop_process, wait_http
from gateway_harness import start_gateway, start_stubs
from hypothesis import HealthCheck, settings
from starlette.routing import Route

from gateway.config import hash_api_key, parse_config
from gateway.forwarding import ANY_ENGINE_EXTRAS, NATIVE_FIELDS, ROUTE_FIELDS, SAMPLING_FIELDS
from gateway.http.app import create_app
from gateway.http.openapi import openapi_document

KEY, CAPPED_KEY = "sk-fuzz-SECRET-KEY", "sk-fuzz-CAPPED-KEY"
EXAMPLES = int(os.environ.get("SPECROUTE_FUZZ_EXAMPLES", "6"))
AUTH = {"valid key": {"Authorization": f"Bearer {KEY}"},
        "capped key": {"Authorization": f"Bearer {CAPPED_KEY}"}, "no key": {}}
SENT: Counter = Counter()  # status -> requests, over the module

schema = schemathesis.openapi.from_dict(openapi_document(("m",)))
schema.config.generation.update(modes=["positive", "negative"], max_examples=EXAMPLES)


def config(workers: dict[str, str], redis_url: str) -> dict:
    good = {"constrained_decoding": True, "tools": True, "max_context": 4096}
    return {"redis_url": redis_url,
            "server": {"max_body_bytes": 65536, "body_timeout_s": 5.0, "access_log": True,
                       "breaker_cooldown_s": 1.0, "max_attempts": 3},
            "pools": [{"name": "eagle", "engine": "sglang", "method": "eagle", "k": 3,
                       "model": "m", "workers": [workers["sglang"], workers["sglang-bad"]],
                       "capabilities": {**good, "per_request_k": True}},
                      {"name": "plain", "engine": "vllm", "method": "plain", "k": 0,
                       "model": "m", "workers": [workers["vllm"], workers["vllm-bad"]],
                       "capabilities": {"max_context": 4096}}],
            "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)]},
                        {"name": "capped", "api_key_sha256": [hash_api_key(CAPPED_KEY)],
                         "max_tokens": 8, "may_pin": True}]}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("fuzz")
    sglang = ["--model", "m", "--method", "eagle", "--k", "3"]
    vllm = ["--model", "m", "--method", "plain", "--k", "0"]
    procs, workers = start_stubs(tmp, {"sglang": sglang,
                                       "sglang-bad": [*sglang, "--fault", "lists-for-objects"]})
    more, vllm_workers = start_stubs(tmp, {"vllm": vllm, "vllm-bad": [
        *vllm, "--fault", "counters-as-strings"]}, script="tests/openai_stub.py")
    procs.update(more)
    try:
        proc, url = start_gateway(tmp, config({**workers, **vllm_workers}, redis_server),
                                  policy="learned", name="gw")
    except BaseException:
        for stub in procs.values():
            stop_process(stub)
        raise
    try:
        wait_http(url + "/ready", 30, proc)
        yield url
        print(f"\nFUZZ gateway: {sum(SENT.values())} requests, by status "
              f"{dict(sorted(SENT.items()))}")
        log = (tmp / "gw.log").read_text()
        assert "Traceback" not in log, log[-3000:]
    finally:
        stop_process(proc)
        for stub in procs.values():
            stop_process(stub)


def test_the_document_lists_every_route_the_gateway_has() -> None:
    """The static document and the app's route table name the same (path, method)s."""
    workers = {name: "http://127.0.0.1:1" for name in ("sglang", "sglang-bad", "vllm",
                                                       "vllm-bad")}
    app = create_app(parse_config(config(workers, "redis://127.0.0.1:1/0")), policy="first")
    served = {(route.path.replace("{model:path}", "{model}"), method.lower())
              for route in app.routes if isinstance(route, Route)
              for method in (route.methods or ()) if method != "HEAD"}
    documented = {(path, method) for path, item in openapi_document()["paths"].items()
                  for method in item}
    assert served == documented


def test_the_gateway_serves_its_document(gateway: str) -> None:
    response = httpx.get(gateway + "/openapi.json", timeout=5)
    assert response.status_code == 200
    assert response.json() == orjson.loads(orjson.dumps(openapi_document(("m",))))


@pytest.mark.parametrize("auth", list(AUTH))
@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_gets_a_5xx_and_every_error_is_openai_shaped(case, gateway: str,  # noqa: ANN001
                                                              auth: str) -> None:
    headers = dict(case.headers or {})
    headers.update(AUTH[auth])
    case.headers = headers
    response = case.call(base_url=gateway, timeout=10)
    SENT[response.status_code] += 1
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)
        assert "code" in error and "param" in error
    if auth == "no key" and response.status_code == 401:
        # the key is checked before the body is read: more bodies would test nothing
        # more, and generating them is most of this module's time
        pytest.skip("401 before the body is read")


@pytest.mark.parametrize("key", ["\u00b2", "\u0663", "1\u00b2"], ids=["superscript-2",
                                                                   "arabic-indic-3", "1-sup2"])
def test_logit_bias_keys_are_ascii_digits(gateway: str, key: str) -> None:
    """`str.isdigit` accepts '²' (which `int` refuses: a worker 500, a 502 here) and
    Arabic-Indic digits (which `int` reads as another token id): a 400 at the gateway."""
    body = {"model": "m", "max_tokens": 2, "logit_bias": {key: 1},
            "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(gateway + "/v1/chat/completions", json=body,
                          headers=AUTH["valid key"], timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "logit_bias"
    native = httpx.post(gateway + "/generate", headers=AUTH["valid key"], timeout=10,
                        json={"text": "hi", "sampling_params": {"logit_bias": {key: 1}}})
    assert native.status_code == 400
    assert native.json()["error"]["param"] == "sampling_params.logit_bias"


def test_the_document_lists_exactly_the_forwarded_fields() -> None:
    """The request schemas' properties are the fields `gateway.forwarding` lets through
    (any other is a 400), so the fuzzer's generated bodies cover exactly those."""
    schemas = openapi_document()["components"]["schemas"]
    assert set(schemas["ChatRequest"]["properties"]) == ROUTE_FIELDS["chat"] | ANY_ENGINE_EXTRAS
    assert set(schemas["CompletionsRequest"]["properties"]) == (
        ROUTE_FIELDS["completions"] | ANY_ENGINE_EXTRAS)
    native = openapi_document()["paths"]["/generate"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
    assert set(native) == NATIVE_FIELDS
    assert set(native["sampling_params"]["properties"]) == SAMPLING_FIELDS
