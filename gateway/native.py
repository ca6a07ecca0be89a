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

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from gateway import dispatch
from gateway.adapters.base import Final, SpecStats, Usage
from gateway.auth import authorize
from gateway.endpoints import SSE, DisconnectWatch, read_request, send_error, send_once
from gateway.errors import GatewayError, InvalidRequest, NoHealthyWorker
from gateway.pools import Pool
from gateway.responses import DONE, headers_for
from gateway.schemas import GenerationRequest

log = logging.getLogger("specroute.gateway")
NATIVE_ENGINES = frozenset({"sglang", "embedded"})
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_value")


def parse_generate(body: object, models: list[str]) -> GenerationRequest:
    """An SGLang `/generate` body as a completions request that keeps the native body."""
    if not isinstance(body, dict):
        raise _bad("body", "the request body must be a JSON object")
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
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", "'stream' must be a boolean")
    schema = params.get("json_schema")
    fmt = None
    if any(params.get(f) is not None for f in GRAMMAR_FIELDS):
        # the router's constrained_decoding requirement reads response_format
        fmt = {"type": "json_schema", "json_schema": {"schema": schema}}
    return GenerationRequest(
        endpoint="completions", model=model, body=body, prompt=text if text is not None
        else ids, max_tokens=_int(params, "max_new_tokens"), temperature=_float(
            params, "temperature", 1.0), top_p=_float(params, "top_p"), stream=stream,
        seed=_int(params, "sampling_seed"), response_format=fmt, native=body)


def _int(params: dict, name: str) -> int | None:
    value = params.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise _bad(f"sampling_params.{name}", f"'sampling_params.{name}' must be an integer")
    return value


def _float(params: dict, name: str, default: float | None = None) -> float | None:
    value = params.get(name, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise _bad(f"sampling_params.{name}", f"'sampling_params.{name}' must be a number")
    return None if value is None else float(value)


def _sse(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class GenerateEndpoint:
    """`POST /generate` as a raw ASGI app, like the OpenAI token routes."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway: dispatch.Gateway = scope["app"].state.gateway
        timer = dispatch.Timer()
        try:
            tenant, body, pin = await read_request(gateway, scope, receive)
            models = sorted({p.config.model for p in gateway.pools.values()})
            request = parse_generate(body, models)
            authorize(tenant, request, pin)
            profile = gateway.router.classify(request, tenant.name)
            decision, pools = gateway.router.route(request, profile, pin)
            pools = [p for p in pools if p.config.engine in NATIVE_ENGINES]
            if not pools:
                raise InvalidRequest("POST /generate needs a pool of engine sglang or "
                                     f"embedded serving {request.model!r}",
                                     param="model", code="unsupported_capability")
        except GatewayError as exc:
            await send_error(send, exc)
            return
        watch = DisconnectWatch(receive)
        usage, spec, ok, load, workers = Usage(), SpecStats(), False, 0, 1
        try:
            if request.stream:
                lease, final = await self.stream(gateway, send, timer, request, decision, pools)
            else:
                lease, result = await dispatch.generate(gateway, request, decision, pools)
                timer.token()
                final = Final(result.usage, result.spec)
                await send_once(send, 200, orjson.dumps(result.native or {}),
                                headers_for(lease.decision))
            if lease is not None:
                decision, load, workers = lease.decision, lease.load, lease.workers
            if final is not None:
                usage, spec, ok = final.usage, final.spec, True
        except GatewayError as exc:
            await send_error(send, exc)
        except asyncio.CancelledError:
            if not watch.fired:
                raise
            log.info("client disconnected; upstream request cancelled")
        finally:
            watch.close()
            dispatch.record(gateway, request=request, profile=profile, tenant=tenant,
                            decision=decision, load=load, timer=timer, usage=usage,
                            spec=spec, ok=ok, workers=workers)

    async def stream(self, gateway: dispatch.Gateway, send: Send, timer: dispatch.Timer,
                     request: GenerationRequest, decision: object, pools: list[Pool]
                     ) -> tuple[dispatch.Lease, Final | None]:
        lease, item, items = await dispatch.open_stream(gateway, request,
                                                        decision, pools)  # type: ignore[arg-type]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*SSE, *headers_for(lease.decision)]})
        final: Final | None = None
        try:
            while not isinstance(item, Final):
                timer.token()
                if item.native is not None:
                    await send({"type": "http.response.body", "body": _sse(item.native),
                                "more_body": True})
                item = await anext(items)
            final = item
        except GatewayError as exc:
            lease.failed(exc)
            await send({"type": "http.response.body", "more_body": True, "body": _sse(
                {"error": {"message": exc.message, "code": exc.status}})})
        except StopAsyncIteration:
            pass
        finally:
            lease.release()
            await items.aclose()  # type: ignore[attr-defined]
            await send({"type": "http.response.body", "body": DONE, "more_body": False})
        return lease, final


async def _worker_info(session: aiohttp.ClientSession, pool: Pool, url: str) -> dict | None:
    try:
        async with session.get(url + "/server_info",
                               timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def server_info(request: Request) -> Response:
    gateway: dispatch.Gateway = request.app.state.gateway
    session: aiohttp.ClientSession = request.app.state.session
    targets = [(pool, worker.url) for pool in gateway.pools.values()
               for worker in pool.workers if worker.healthy
               and pool.config.engine in NATIVE_ENGINES]
    infos = await asyncio.gather(*(_worker_info(session, p, u) for p, u in targets))
    states = []
    for (pool, url), info in zip(targets, infos, strict=True):
        if info is None:
            continue
        state = dict((info.get("internal_states") or [{}])[0])
        states.append({**state, "pool": pool.name, "worker": url,
                       "method": pool.config.method, "k": pool.config.k})
    lengths = [s["avg_spec_accept_length"] for s in states
               if isinstance(s.get("avg_spec_accept_length"), int | float)]
    aggregate: dict = {"pool": None, "num_running_reqs": sum(
        s.get("num_running_reqs", 0) for s in states)}
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
    gateway: dispatch.Gateway = request.app.state.gateway
    models = sorted({p.config.model for p in gateway.pools.values()})
    return JSONResponse({"model_path": models[0] if len(models) == 1 else None,
                         "tokenizer_path": None, "is_generation": True,
                         "served_model_names": models, "weight_version": "default"})


async def health_generate(request: Request) -> Response:
    """200 when some pool that can generate has a healthy worker (SGLang's route runs a
    one-token generation; the gateway's health monitor already probes every worker)."""
    gateway: dispatch.Gateway = request.app.state.gateway
    if any(pool.healthy_workers for pool in gateway.pools.values()):
        return Response(status_code=200)
    error = NoHealthyWorker("no healthy worker", code="no_healthy_worker")
    return JSONResponse({"error": {"message": error.message}}, status_code=503)
