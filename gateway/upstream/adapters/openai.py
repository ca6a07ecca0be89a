"""Pass-through adapter for OpenAI-compatible workers (vLLM, TensorRT-LLM, SGLang's
OpenAI routes, anything else that speaks `/v1/chat/completions` and `/v1/completions`).

The client's body is forwarded with `model` rewritten to the pool's served name, so
fields the gateway does not model (tools, logprobs, ...) still reach the worker.
Streams always ask for usage (`stream_options.include_usage`) because vLLM only sends
its per-request speculation metrics on that final usage chunk.

Speculation facts are read from either
- SGLang: `sglext.spec_tokens_details` (request sets `return_spec_tokens_details`), or
- vLLM 0.33 `--per-request-spec-decode-metrics`: `metrics.speculative_decoding`
  `{mean_acceptance_length, draft_acceptance_rate, num_spec_steps,
  num_accepted_draft_tokens, num_draft_tokens, ...}`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp

from gateway.config import PoolConfig
from gateway.schemas import GenerationRequest
from gateway.telemetry.worker_stats import SpecStats, Usage, merge_spec, read_batch
from gateway.upstream.adapters.base import (
    Delta,
    Final,
    GenerationResult,
    StreamItem,
    finish_reason_of,
    worker_params,
)
from gateway.upstream.adapters.wire import post, post_json, sse_data
from policies.fleet import WORKER_BATCH_KEY

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def spec_from_body(body: dict) -> SpecStats | None:
    """Speculation stats from an SGLang `sglext` or a vLLM `metrics` object, if any; the
    embedded worker's `sglext.specroute_batch` too (alone: stats with only the batch
    fields, which a stream merges with `merge_spec`)."""
    sglext = body.get("sglext")
    if isinstance(sglext, dict):
        found: SpecStats | None = None
        details = sglext.get("spec_tokens_details")
        if isinstance(details, list):
            details = details[0] if details else None
        if isinstance(details, dict):
            found = SpecStats(
                verify_steps=int(details.get("spec_verify_ct") or 0),
                accept_length=float(details.get("spec_accept_length") or 0.0),
                accept_rate=details.get("spec_accept_rate"),
                correct_drafts=int(details.get("spec_num_correct_drafts") or 0),
                proposed_drafts=int(details.get("spec_num_proposed_drafts") or 0),
            )
        if isinstance(sglext.get(WORKER_BATCH_KEY), dict):
            found = read_batch(found or SpecStats(), sglext)
        if found is not None:
            return found
    metrics = body.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
        spec = metrics["speculative_decoding"]
        return SpecStats(
            verify_steps=int(spec.get("num_spec_steps") or 0),
            accept_length=float(spec.get("mean_acceptance_length") or 0.0),
            accept_rate=spec.get("draft_acceptance_rate"),
            correct_drafts=int(spec.get("num_accepted_draft_tokens") or 0),
            proposed_drafts=int(spec.get("num_draft_tokens") or 0),
        )
    return None


def usage_from_body(body: dict) -> Usage | None:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    return Usage(prompt_tokens=int(usage.get("prompt_tokens") or 0),
                 completion_tokens=int(usage.get("completion_tokens") or 0))


class OpenAIAdapter:
    """Forwards the OpenAI body; `extra` fields are merged into every upstream body."""

    def __init__(self, session: aiohttp.ClientSession, extra: dict | None = None) -> None:
        self.session = session
        self.extra = extra or {}

    def payload(self, request: GenerationRequest, pool: PoolConfig, k: int,
                stream: bool) -> dict:
        body = {**request.body, **self.extra, "model": pool.model, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        else:
            body.pop("stream_options", None)
        params = worker_params(body.pop("custom_params", None), pool, k)
        if params is not None:
            body["custom_params"] = params
        return body

    async def generate(self, worker: str, request: GenerationRequest, pool: PoolConfig,
                       k: int) -> GenerationResult:
        body = await post_json(self.session, worker, PATHS[request.endpoint],
                               self.payload(request, pool, k, stream=False))
        choices = body.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        message = choice.get("message") if request.endpoint == "chat" else None
        if isinstance(message, dict):
            text = message.get("content") or ""
        else:
            message, text = None, choice.get("text") or ""
        return GenerationResult(
            text=text,
            finish_reason=finish_reason_of(choice.get("finish_reason")),
            usage=usage_from_body(body) or Usage(),
            spec=spec_from_body(body) or SpecStats(),
            message=message,
            choices=[c for c in choices if isinstance(c, dict)],
        )

    async def stream(self, worker: str, request: GenerationRequest, pool: PoolConfig,
                     k: int) -> AsyncIterator[StreamItem]:
        usage, spec, finish = Usage(), SpecStats(), None
        payload = self.payload(request, pool, k, stream=True)
        async with post(self.session, worker, PATHS[request.endpoint], payload) as resp:
            async for chunk in sse_data(worker, resp):
                usage = usage_from_body(chunk) or usage
                spec = merge_spec(spec_from_body(chunk), spec)
                for choice in chunk.get("choices") or ():
                    index = choice.get("index", 0)
                    reason = choice.get("finish_reason")
                    reason = finish_reason_of(reason) if reason else None
                    if index == 0 and reason:
                        finish = reason
                    if request.endpoint == "chat":
                        extra = dict(choice.get("delta") or {})
                        text = extra.pop("content", None) or ""
                    else:
                        extra, text = {}, choice.get("text") or ""
                    logprobs = choice.get("logprobs")
                    if text or extra or reason or logprobs:
                        yield Delta(text=text, extra=extra, finish_reason=reason,
                                    index=index if isinstance(index, int) else 0,
                                    logprobs=logprobs if isinstance(logprobs, dict) else None)
        yield Final(usage=usage, spec=spec, finish_reason=finish)
