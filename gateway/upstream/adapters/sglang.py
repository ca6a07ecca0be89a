"""SGLang adapter (also the embedded engine, which speaks the same surface).

Completions go to SGLang's native `POST /generate`: the fastest path, and its
`meta_info` carries the per-request speculation counters. Chat goes to the worker's
own `POST /v1/chat/completions` with `return_spec_tokens_details: true`: the worker
applies the model's chat template server-side, so the gateway never has to know a
model's template, and SGLang returns the same counters under
`sglext.spec_tokens_details` (checked in the sglang 0.5.23 source:
`entrypoints/openai/serving_chat.py`, `protocol.py:SglExt`).

Streaming `/generate` text is CUMULATIVE by default and becomes per-chunk deltas
only when the server runs with `--incremental-streaming-output`
(`tokenizer_manager.py`); `output_ids` follows the same mode, while
`meta_info.completion_tokens` is always the running total. So a chunk is cumulative
exactly when `len(output_ids) == completion_tokens`; the adapter emits only new text
either way.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

import orjson

from gateway.config import PoolConfig
from gateway.forwarding import forwarded_native
from gateway.schemas import GenerationRequest
from gateway.telemetry.worker_stats import SpecStats, non_negative, read_batch
from gateway.upstream.adapters.base import (
    Delta,
    Final,
    GenerationResult,
    StreamItem,
    worker_params,
)
from gateway.upstream.adapters.calls import answers, post_json
from gateway.upstream.adapters.openai import OpenAIAdapter
from gateway.upstream.adapters.reply import Reply, no_finish, spec_counters, usage_of
from gateway.upstream.adapters.wire import post, sse_data
from gateway.upstream.http1 import Http1Client
from policies.prior import Measured, MeasuredError, WorkerPrior
from policies.request_limits import JSON_OBJECT_SCHEMA


def spec_from_meta(raw: dict, worker: str = "worker") -> SpecStats:
    """Read SGLang's `meta_info` spec counters (present only with speculation on), the
    embedded worker's `specroute_batch` (every finished request), and the decode time:
    the embedded worker's `decode_s`, else SGLang's `e2e_latency` less its
    `first_token_latency` (sglang 0.5.23 adds the latter with `--enable-metrics`:
    managers/tokenizer_manager.py ~L2753-2770, observability/req_time_stats.py
    `convert_to_output_meta_info` ~L507-533)."""
    meta = Reply(worker, raw, "meta_info")
    spec = read_batch(spec_counters(meta), raw)
    if spec.decode_s is None:
        e2e = non_negative(raw.get("e2e_latency"))
        first = non_negative(raw.get("first_token_latency"))
        if e2e is not None and first is not None and e2e >= first:
            spec.decode_s = e2e - first
    return spec


def prior_from_server_info(pool: PoolConfig, body: dict) -> WorkerPrior | None:
    """What a worker's `/server_info` says it measured about itself, for the pool's
    method: the embedded worker's `specroute_measured` (its measured.json), else SGLang's
    `internal_states[].avg_spec_accept_length` at `speculative_num_steps` (one value for
    every request class); None when it says neither."""
    measured = body.get("specroute_measured")
    if isinstance(measured, dict):
        try:
            prior = WorkerPrior.from_measured(pool.model, pool.method,
                                              Measured.from_dict(measured))
        except MeasuredError:
            prior = None
        if prior is not None and prior.acceptance:
            return prior
    k = body.get("speculative_num_steps") or pool.k
    states = body.get("internal_states")
    for state in states if isinstance(states, list) else ():
        average = state.get("avg_spec_accept_length") if isinstance(state, dict) else None
        if isinstance(average, int | float) and average > 1.0 and isinstance(k, int) and k > 0:
            return WorkerPrior.from_server_average(pool.model, pool.method, float(average), k)
    return None


def meta_of(body: Reply) -> Reply:
    """A `/generate` answer's or chunk's `meta_info` (an object; {} when absent)."""
    return body.obj("meta_info") or Reply(body.worker, {}, "meta_info")


def result_from_generate(worker: str, raw: dict, native: bool) -> GenerationResult:
    """A non-streaming `/generate` answer; UpstreamProtocolError when its shape is wrong."""
    body = Reply(worker, raw)
    text = body.text("text")
    if text is None:
        raise body.bad("text", "a string")
    body.integers("output_ids")
    meta = meta_of(body)
    return GenerationResult(text=text, finish_reason=meta.finish_reason() or "stop",
                            usage=usage_of(meta), spec=spec_from_meta(meta.data, worker),
                            native=raw if native else None)


# OpenAI body fields that SGLang's SamplingParams takes under the same name and meaning.
SAMPLING_PASS_THROUGH = ("presence_penalty", "frequency_penalty", "logit_bias",
                         "json_schema", "regex", "ebnf")


def sampling_params(request: GenerationRequest, pool: PoolConfig, k: int) -> dict:
    params: dict = {}
    if request.max_tokens is not None:
        params["max_new_tokens"] = request.max_tokens
    for name in ("temperature", "top_p", "stop"):
        value = getattr(request, name)
        if value is not None:
            params[name] = value
    if request.seed is not None:
        params["sampling_seed"] = request.seed
    for name in SAMPLING_PASS_THROUGH:
        if request.body.get(name) is not None:
            params[name] = request.body[name]
    if request.response_format is not None:
        schema = request.json_schema
        if schema is not None:
            params["json_schema"] = orjson.dumps(schema).decode()
        elif request.response_format.get("type") == "json_object":
            params["json_schema"] = JSON_OBJECT_SCHEMA
    if (custom := worker_params(None, pool, k)) is not None:
        params["custom_params"] = custom
    return params


class SGLangAdapter:
    def __init__(self, client: Http1Client) -> None:
        self.client = client
        self.chat = OpenAIAdapter(client, extra={"return_spec_tokens_details": True})

    def payload(self, request: GenerationRequest, pool: PoolConfig, k: int,
                stream: bool) -> dict:
        if request.native is not None:  # SGLang's own body: k, stream, rid and the cap ours
            body = forwarded_native(request.native)
            params = dict(body.get("sampling_params") or {})
            custom = worker_params(params.pop("custom_params", None), pool, k)
            if custom is not None:
                params["custom_params"] = custom
            if request.max_tokens is not None:  # the tenant's cap (`authorize`)
                params["max_new_tokens"] = request.max_tokens
            return {**body, "sampling_params": params, "stream": stream,
                    "rid": uuid.uuid4().hex}
        prompt_key = "input_ids" if isinstance(request.prompt, list) else "text"
        return {prompt_key: request.prompt, "stream": stream, "rid": uuid.uuid4().hex,
                "sampling_params": sampling_params(request, pool, k)}

    @staticmethod
    def _openai_route(request: GenerationRequest) -> bool:
        """Chat, and completions that need n > 1 or logprobs, go to SGLang's OpenAI routes
        (`/generate` takes one sample and answers logprobs in its own shape)."""
        return request.native is None and (request.endpoint == "chat" or request.n > 1
                                           or request.logprobs)

    async def alive(self, worker: str, timeout_s: float) -> bool:
        return await answers(self.client, worker, timeout_s)

    async def generate(self, worker: str, request: GenerationRequest, pool: PoolConfig,
                       k: int, deadline: float | None = None) -> GenerationResult:
        if self._openai_route(request):
            return await self.chat.generate(worker, request, pool, k, deadline)
        body = await post_json(self.client, worker, "/generate",
                               self.payload(request, pool, k, stream=False), pool.api_key,
                               deadline)
        return result_from_generate(worker, body, request.native is not None)

    async def stream(self, worker: str, request: GenerationRequest, pool: PoolConfig,
                     k: int) -> AsyncIterator[StreamItem]:
        if self._openai_route(request):
            async with aclosing(self.chat.stream(worker, request, pool, k)) as items:
                async for item in items:  # closed with this one: no GC-time aclose task
                    yield item
            return
        sent = 0
        meta = Reply(worker, {}, "meta_info")
        payload = self.payload(request, pool, k, stream=True)
        async with (post(self.client, worker, "/generate", payload, pool.api_key) as resp,
                    aclosing(sse_data(worker, resp)) as events):
            async for raw in events:
                chunk = Reply(worker, raw, "event")
                meta = chunk.obj("meta_info") or meta
                text = chunk.text("text")
                if text is None:  # SGLang's every chunk has it (cumulative or not)
                    raise chunk.bad("text", "a string")
                ids = chunk.integers("output_ids") or ()
                usage = usage_of(meta)  # checked on every chunk: its counters come first
                cumulative = len(ids) == usage.completion_tokens
                if cumulative:
                    text, sent = text[sent:], len(text)
                if request.native is not None:
                    yield Delta(text=text, native=raw, usage=usage)
                elif text:
                    yield Delta(text=text, usage=usage)
        finish = meta.finish_reason()
        if finish is None:
            raise no_finish(worker)
        yield Final(usage=usage_of(meta), spec=spec_from_meta(meta.data, worker),
                    finish_reason=finish)
