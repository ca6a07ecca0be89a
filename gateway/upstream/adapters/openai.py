"""Pass-through adapter for OpenAI-compatible workers (vLLM, TensorRT-LLM, SGLang's
OpenAI routes, anything else that speaks `/v1/chat/completions` and `/v1/completions`).

The client's body is forwarded with `model` rewritten to the pool's served name and
`max_tokens` the one decided (a tenant's cap, the budget); only the fields the gateway
checks for the route and the pool's engine (`gateway.forwarding.forwarded`).
Streams always ask for usage (`stream_options.include_usage`) because vLLM only sends
its per-request speculation metrics on that final usage chunk. The bodies both ways are
`gateway.upstream.adapters.openai_body`'s (compiled); this module holds what mypyc does
not compile, the stream (an async generator).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

from gateway.config import PoolConfig
from gateway.schemas import GenerationRequest
from gateway.telemetry.worker_stats import SpecStats, Usage, merge_spec
from gateway.upstream.adapters.base import Final, GenerationResult, StreamItem
from gateway.upstream.adapters.calls import answers, post_json
from gateway.upstream.adapters.openai_body import (
    PATHS,
    deltas_from_chunk,
    payload,
    result_from_body,
    spec_of,
    usage_from_body,
)
from gateway.upstream.adapters.reply import Reply, no_finish
from gateway.upstream.adapters.wire import post, sse_data
from gateway.upstream.http1 import Http1Client


class OpenAIAdapter:
    """Forwards the OpenAI body; `extra` fields are merged into every upstream body."""

    def __init__(self, client: Http1Client, extra: dict | None = None) -> None:
        self.client = client
        self.extra = extra or {}

    def payload(self, request: GenerationRequest, pool: PoolConfig, k: int,
                stream: bool) -> dict:
        return payload(request, pool, k, stream, self.extra)

    async def alive(self, worker: str, timeout_s: float) -> bool:
        return await answers(self.client, worker, timeout_s)

    async def generate(self, worker: str, request: GenerationRequest, pool: PoolConfig,
                       k: int, deadline: float | None = None) -> GenerationResult:
        body = await post_json(self.client, worker, PATHS[request.endpoint],
                               self.payload(request, pool, k, stream=False), pool.api_key,
                               deadline)
        return result_from_body(worker, body, request.endpoint == "chat")

    async def stream(self, worker: str, request: GenerationRequest, pool: PoolConfig,
                     k: int) -> AsyncGenerator[StreamItem, None]:
        usage, spec, finish = Usage(), SpecStats(), None
        payload = self.payload(request, pool, k, stream=True)
        chat = request.endpoint == "chat"
        async with (post(self.client, worker, PATHS[request.endpoint], payload,
                         pool.api_key) as resp,
                    aclosing(sse_data(worker, resp)) as events):  # closed with this one
            async for raw in events:
                chunk = Reply(worker, raw, "event")
                usage = usage_from_body(chunk) or usage
                spec = merge_spec(spec_of(chunk), spec)
                for delta in deltas_from_chunk(chunk, chat):
                    if delta.index == 0 and delta.finish_reason:
                        finish = delta.finish_reason
                    yield delta
        if finish is None:
            raise no_finish(worker)
        yield Final(usage=usage, spec=spec, finish_reason=finish)
