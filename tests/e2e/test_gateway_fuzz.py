"""Fuzzing the gateway with schemathesis against its own OpenAPI document
(`GET /openapi.json`, `gateway.http.openapi`): every route, with a valid key and without
one, data that fits the schema and data that does not (schemathesis's examples, coverage
and fuzzing phases). Whatever comes in, the gateway answers below 500 and every error
is in the OpenAI shape. A real gateway process in front of a stub worker; the number
of examples is bounded (`SPECROUTE_FUZZ_EXAMPLES`, default 10 per route and mode): about
2,000 requests, ~30 s on the 2-core box.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import orjson
import pytest
import schemathesis
from conftest import stop_process, wait_http
from gateway_harness import start_gateway, start_stub
from hypothesis import HealthCheck, settings
from starlette.routing import Route

from gateway.config import hash_api_key, parse_config
from gateway.http.app import create_app
from gateway.http.openapi import openapi_document

KEY = "sk-fuzz-SECRET-KEY"
EXAMPLES = int(os.environ.get("SPECROUTE_FUZZ_EXAMPLES", "10"))
AUTH = {"valid key": {"Authorization": f"Bearer {KEY}"}, "no key": {}}

schema = schemathesis.openapi.from_dict(openapi_document(("m",)))
schema.config.generation.update(modes=["positive", "negative"], max_examples=EXAMPLES)

GATEWAY_MAIN = """
import sys
import logging
import uvicorn
from gateway.http.app import create_app
from gateway.config import load_config
from gateway.routing.router import minimal_profile
from gateway.http.serve import uvicorn_options

config = load_config(sys.argv[1])
logging.basicConfig(level="INFO", format="%(name)s: %(message)s")
uvicorn.run(create_app(config, policy="first", classify=minimal_profile), host="127.0.0.1",
            port=int(sys.argv[2]), **uvicorn_options(config.server))
"""


def config(worker: str) -> dict:
    return {"server": {"max_body_bytes": 65536, "body_timeout_s": 5.0, "access_log": True},
            "pools": [{"name": "p", "engine": "sglang", "method": "eagle", "k": 3,
                       "model": "m", "workers": [worker],
                       "capabilities": {"per_request_k": True, "max_context": 4096}}],
            "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)]}]}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("fuzz")
    stub, worker = start_stub(tmp, "worker", "--model", "m")
    try:
        proc, url = start_gateway(tmp, config(worker), name="gw", script=GATEWAY_MAIN)
    except BaseException:
        stop_process(stub)
        raise
    try:
        wait_http(url + "/ready", 30, proc)
        yield url
        log = (tmp / "gw.log").read_text()
        assert "Traceback" not in log, log[-3000:]
    finally:
        stop_process(proc)
        stop_process(stub)


def test_the_document_lists_every_route_the_gateway_has() -> None:
    """The static document and the app's route table name the same (path, method)s."""
    app = create_app(parse_config(config("http://127.0.0.1:1")), policy="first")
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
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)
        assert "code" in error and "param" in error


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
