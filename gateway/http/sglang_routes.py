"""SGLang's native HTTP surface on the gateway, so SGLang-native clients (its benchmark's
default `sglang` backend, `sglang.RuntimeEndpoint`) point at specroute unchanged.

- `POST /generate`: SGLang's request (`text` | `input_ids`, `sampling_params`, `stream`,
  `rid`, `return_logprob`, ...), classified, routed, dispatched and recorded like a
  completion, but answered in SGLang's shape: the worker's own `/generate` body
  (`text`, `output_ids`, `meta_info` with the spec fields), chunks cumulative when
  streaming, ending `data: [DONE]`. Only pools that speak `/generate` (engine `sglang`
  or `embedded`) take it. There is no `model` field in SGLang's request: an optional
  `model` names one, else the gateway's only model (400 when it serves several).
- `GET /server_info` (and `/get_server_info`): the gateway's pools with each live
  worker's own `/server_info` internal state; `internal_states[0]` is the aggregate,
  whose `avg_spec_accept_length` is the mean over the workers that report one (what
  SGLang's benchmark prints as the accept length).
- `GET /model_info` (`/get_model_info`), `GET /health_generate`.

Field names from the sglang==0.5.23 wheel: `managers/io_struct.py` GenerateReqInput,
`entrypoints/http_server.py` (server_info, model_info, health_generate).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.config import DEFAULT_SERVER, ServerConfig
from gateway.core.admit import NATIVE_ENGINES
from gateway.errors import InvalidRequest, NoHealthyWorker
from gateway.forwarding import check_native_body
from gateway.http.endpoints import TokenEndpoint
from gateway.http.gateway import Gateway
from gateway.http.responses import DONE, ChunkWriter
from gateway.pools import Pool
from gateway.schemas import (
    MAX_TOP_LOGPROBS,
    GenerationRequest,
    check_custom_params,
    check_grammar,
    check_logit_bias,
    check_work,
)
from gateway.tenants.auth import is_admin
from gateway.upstream.adapters.base import Delta, Final, GenerationResult, worker_auth
from policies.request_limits import GRAMMAR_FIELDS
from policies.types import Decision

log = logging.getLogger("specroute.gateway")
PARAMS = "sampling_params."
SGLANG_MAX_NEW_TOKENS = 128  # the worker's default (sglang sampling_params.py)


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_value")


def parse_generate(body: object, models: list[str],
                   server: ServerConfig = DEFAULT_SERVER) -> GenerationRequest:
    """An SGLang `/generate` body as a completions request that keeps the native body;
    its work (`check_work`) within `server.max_request_work`."""
    if not isinstance(body, dict):
        raise _bad("body", "the request body must be a JSON object")
    check_native_body(body)
    model = body.get("model")
    if model is None:
        if len(models) != 1:
            raise _bad("model", "this gateway serves several models; name one in 'model'")
        model = models[0]
    if not isinstance(model, str):
        raise _bad("model", "'model' must be a string")
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise _bad("text", "give exactly one of 'text' and 'input_ids'")
    if text is not None and not (isinstance(text, str) and text):
        raise _bad("text", "'text' must be a non-empty string (one prompt per request)")
    if ids is not None and not (isinstance(ids, list) and ids and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in ids)):
        raise _bad("input_ids", "'input_ids' must be a non-empty list of token ids")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise _bad("sampling_params", "'sampling_params' must be an object")
    check_logit_bias(params, "sampling_params.logit_bias")
    check_custom_params(params, "sampling_params.custom_params")
    check_grammar(params, PARAMS)
    _stop(params)
    _int(params, "top_k", -1)
    for name in ("presence_penalty", "frequency_penalty"):
        _float(params, name, -2.0, 2.0)
    for where, name, prefix in ((params, "ignore_eos", PARAMS),
                                (body, "return_text_in_logprobs", "")):
        if not isinstance(where.get(name, False), bool):
            raise _bad(prefix + name, f"'{prefix}{name}' must be a boolean")
    stop_ids = params.get("stop_token_ids")
    if stop_ids is not None and not (isinstance(stop_ids, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in stop_ids)):
        raise _bad(PARAMS + "stop_token_ids", f"'{PARAMS}stop_token_ids' must be a list of "
                   "token ids")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", "'stream' must be a boolean")
    if body.get("rid") is not None and not isinstance(body["rid"], str):
        raise _bad("rid", "'rid' must be a string (one prompt per request)")
    max_tokens = _int(params, "max_new_tokens", 0)
    schema = params.get("json_schema")
    fmt = None
    if any(params.get(f) is not None for f in GRAMMAR_FIELDS):
        # the router's constrained_decoding requirement reads response_format
        fmt = {"type": "json_schema", "json_schema": {"schema": schema}}
    request = GenerationRequest(
        endpoint="completions", model=model, body=body, prompt=text if text is not None
        else ids, max_tokens=max_tokens, temperature=_float(
            params, "temperature", 0.0, default=1.0), top_p=_top_p(params),
        stream=stream, seed=_int(params, "sampling_seed"), response_format=fmt, native=body)
    _check_work(body, params, server, SGLANG_MAX_NEW_TOKENS if max_tokens is None
                else max_tokens, request.prompt_tokens_estimate)
    return request


def _check_work(body: dict, params: dict, server: ServerConfig, max_tokens: int,
                prompt_tokens: int) -> None:
    """One sample (`sampling_params.n` 1: SGLang answers several as a list, which is not
    one completion), logprob fields checked as the OpenAI routes check theirs, and the
    work within the limit: the alternatives per token are `top_logprobs_num` plus the
    `token_ids_logprob` asked for, over the prompt too when `logprob_start_len` >= 0."""
    if _int(params, "n", 1) not in (None, 1):
        raise _bad(PARAMS + "n", f"'{PARAMS}n' must be 1 on /generate; send n requests "
                   "(or use /v1/completions with 'n')")
    wanted = body.get("return_logprob", False)
    if not isinstance(wanted, bool):
        raise _bad("return_logprob", "'return_logprob' must be a boolean")
    top = _int(body, "top_logprobs_num", 0, "") or 0
    if top > MAX_TOP_LOGPROBS:
        raise _bad("top_logprobs_num", f"'top_logprobs_num' must be <= {MAX_TOP_LOGPROBS}")
    ids = body.get("token_ids_logprob")
    if ids is not None and not (isinstance(ids, list) and len(ids) <= MAX_TOP_LOGPROBS and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in ids)):
        raise _bad("token_ids_logprob", f"'token_ids_logprob' must be a list of at most "
                   f"{MAX_TOP_LOGPROBS} token ids")
    start = _int(body, "logprob_start_len", -1, "")
    if wanted and start is not None and start >= 0:
        max_tokens += max(prompt_tokens - start, 0)
    logprobs = top + len(ids or []) if wanted else 0
    check_work(server.max_request_work, 1, max_tokens, logprobs,
               (PARAMS + "n", PARAMS + "max_new_tokens", "top_logprobs_num"))


def _int(params: dict, name: str, low: int | None = None, prefix: str = PARAMS
         ) -> int | None:
    value = params.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise _bad(prefix + name, f"'{prefix}{name}' must be an integer")
    if value is not None and low is not None and value < low:
        raise _bad(prefix + name, f"'{prefix}{name}' must be >= {low}, got {value}")
    return value


def _float(params: dict, name: str, low: float, high: float | None = None,
           default: float | None = None) -> float | None:
    value = params.get(name, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise _bad(PARAMS + name, f"'{PARAMS}{name}' must be a number")
    if value is not None and not (low <= value and (high is None or value <= high)):
        bound = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
        raise _bad(PARAMS + name, f"'{PARAMS}{name}' must be {bound}, got {value}")
    return None if value is None else float(value)


def _top_p(params: dict) -> float | None:
    value = _float(params, "top_p", 0.0, 1.0)
    if value == 0.0:  # SGLang's own check (sampling_params.py): (0, 1]
        raise _bad(PARAMS + "top_p", f"'{PARAMS}top_p' must be > 0 and <= 1")
    return value


def _stop(params: dict) -> None:
    stop = params.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _bad(PARAMS + "stop", f"'{PARAMS}stop' must be a string or a list of strings")


def _sse(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class NativeWriter(ChunkWriter):
    """SSE of a native stream: the worker's own chunks, then `data: [DONE]`."""

    def delta(self, item: Delta) -> bytes:
        return _sse(item.native) if item.native is not None else b""

    def final(self, item: Final) -> bytes:
        return DONE

    def error(self, body: dict) -> bytes:
        return _sse(body) + DONE  # SGLang's stream error: data: {"error": {...}}

    def cut(self, limit: str) -> bytes:
        """SGLang's native stream has no chunk of the gateway's own to end with: an error."""
        return self.error({"error": {"message": f"stream ended at {limit}",
                                     "type": "timeout", "code": "upstream_timeout"}})


class GenerateEndpoint(TokenEndpoint):
    """`POST /generate`: the token route's steps (authenticate, rate limit, classify, route,
    admission, dispatch with failover, record, trace), SGLang's body in and out."""

    def __init__(self) -> None:
        super().__init__("completions", route="generate")

    def parser(self, gateway: Gateway) -> Callable[[object], GenerationRequest]:
        return partial(parse_generate,
                       models=sorted({p.config.model for p in gateway.pools.values()}),
                       server=gateway.config.server)

    def render(self, request: GenerationRequest, result: GenerationResult,
               decision: Decision) -> bytes:
        return orjson.dumps(result.native or {})

    def writer(self, request: GenerationRequest, decision: Decision) -> ChunkWriter:
        return NativeWriter(request, decision)


async def _worker_info(session: aiohttp.ClientSession, pool: Pool, url: str) -> dict | None:
    """The worker's first `internal_states` entry, or None when it is down, answers
    something else than 200, or answers a body of the wrong shape (logged; the worker
    is left out of the aggregate, as a down one is)."""
    try:
        async with session.get(url + "/server_info", headers=worker_auth(pool.config.api_key),
                               timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status != 200:
                return None
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    states = body.get("internal_states") if isinstance(body, dict) else None
    if states is None and isinstance(body, dict):
        return {}
    if not (isinstance(states, list) and (not states or isinstance(states[0], dict))):
        log.info("worker %s: /server_info is not SGLang's shape; left out", url)
        return None
    return dict(states[0]) if states else {}


def _number(state: dict, key: str) -> float | None:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


async def server_info(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    session: aiohttp.ClientSession = request.app.state.session
    targets = [(pool, worker.url) for pool in gateway.pools.values()
               for worker in pool.workers if worker.healthy
               and pool.config.engine in NATIVE_ENGINES]
    infos = await asyncio.gather(*(_worker_info(session, p, u) for p, u in targets))
    states = []
    admin = is_admin(request)  # worker addresses are operator detail, as on /ready
    for (pool, url), state in zip(targets, infos, strict=True):
        if state is None:
            continue
        state.update({"pool": pool.name, "method": pool.config.method, "k": pool.config.k})
        if admin:
            state["worker"] = url
        states.append(state)
    lengths = [n for s in states if (n := _number(s, "avg_spec_accept_length")) is not None]
    aggregate: dict = {"pool": None, "num_running_reqs": int(sum(
        _number(s, "num_running_reqs") or 0 for s in states))}
    if lengths:
        aggregate["avg_spec_accept_length"] = sum(lengths) / len(lengths)
    models = sorted({p.config.model for p in gateway.pools.values()})
    return JSONResponse({
        "model_path": models[0] if len(models) == 1 else None, "served_model_names": models,
        "version": "specroute", "speculative_algorithm": "SPECROUTE",
        "internal_states": [aggregate, *states],
        "pools": [{"name": p.name, "engine": p.config.engine, "method": p.config.method,
                   "k": p.config.k, "healthy_workers": p.healthy_workers}
                  for p in gateway.pools.values()]})


async def model_info(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    models = sorted({p.config.model for p in gateway.pools.values()})
    return JSONResponse({"model_path": models[0] if len(models) == 1 else None,
                         "tokenizer_path": None, "is_generation": True,
                         "served_model_names": models, "weight_version": "default"})


async def health_generate(request: Request) -> Response:
    """200 when some pool that can generate has a healthy worker (SGLang's route runs a
    one-token generation; the gateway's health monitor already probes every worker)."""
    gateway: Gateway = request.app.state.gateway
    if any(pool.up_workers for pool in gateway.pools.values()):
        return Response(status_code=200)
    error = NoHealthyWorker("no healthy worker", code="no_healthy_worker")
    return JSONResponse(error.body(), status_code=error.status)
