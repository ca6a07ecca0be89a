"""The OpenAI-compatible workers' bodies, both ways: the body sent (`payload`) and the
answers read (`result_from_body`, a stream chunk's `deltas_from_chunk`, the speculation
facts `spec_of` and `usage_from_body`). Apart from `gateway.upstream.adapters.openai`,
whose stream is an async generator, so that the install compiles this with mypyc
(`gateway/compiled.py`): every non-streamed chat request runs it.

Speculation facts are read from either
- SGLang: `sglext.spec_tokens_details` (request sets `return_spec_tokens_details`), or
- vLLM 0.33 `--per-request-spec-decode-metrics`: `metrics.speculative_decoding`
  `{mean_acceptance_length, draft_acceptance_rate, num_spec_steps,
  num_accepted_draft_tokens, num_draft_tokens, ...}`.
"""

from __future__ import annotations

from gateway.config import PoolConfig
from gateway.forwarding import forwarded
from gateway.schemas import GenerationRequest
from gateway.telemetry.worker_stats import SpecStats, Usage, read_batch
from gateway.upstream.adapters.base import Delta, GenerationResult, worker_params
from gateway.upstream.adapters.reply import Reply, spec_counters, usage_of
from policies.fleet import WORKER_BATCH_KEY

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def spec_of(body: Reply) -> SpecStats | None:
    """Speculation stats from an SGLang `sglext` or a vLLM `metrics` object, if any; the
    embedded worker's `sglext.specroute_batch` too (alone: stats with only the batch
    fields, which a stream merges with `merge_spec`)."""
    worker = body.worker
    sglext = body.obj("sglext")
    if sglext is not None:
        found: SpecStats | None = None
        details = sglext.get("spec_tokens_details")
        if isinstance(details, list):  # one per choice: the first one's
            details = details[0] if details else None
        if details is not None:
            found = spec_counters(Reply(worker, details, "sglext.spec_tokens_details"))
        if isinstance(sglext.get(WORKER_BATCH_KEY), dict):
            found = read_batch(found or SpecStats(), sglext.data)
        if found is not None:
            return found
    metrics = body.obj("metrics")
    spec = metrics.obj("speculative_decoding") if metrics is not None else None
    if spec is None:
        return None
    return SpecStats(verify_steps=spec.count("num_spec_steps"),
                     accept_length=spec.number("mean_acceptance_length") or 0.0,
                     accept_rate=spec.number("draft_acceptance_rate"),
                     correct_drafts=spec.count("num_accepted_draft_tokens"),
                     proposed_drafts=spec.count("num_draft_tokens"))


def usage_from_body(body: Reply) -> Usage | None:
    usage = body.obj("usage")
    return None if usage is None else usage_of(usage)


def read_choices(body: Reply, chat: bool) -> tuple[list[Reply], str | None]:
    """A whole answer's choices, each checked: a message object (chat) whose content is
    text or null, or text (completions), its finish reason normalised in place
    (`finish_reason_of`; none: "stop"); and the first one's finish reason."""
    choices = body.objects("choices")
    if not choices:
        raise body.bad("choices", "a non-empty list")
    reasons = []
    for choice in choices:
        choice.index()
        reason = choice.finish_reason()
        reasons.append(reason)
        choice.data["finish_reason"] = reason or "stop"
        choice.logprobs()
        if chat:
            message = choice.obj("message")
            if message is None:
                raise choice.bad("message", "an object")
            message.text("content")
            if message.get("tool_calls") is not None:
                message.objects("tool_calls")
        else:
            choice.text("text")
    return choices, reasons[0]


def result_from_body(worker: str, raw: dict, chat: bool) -> GenerationResult:
    """A non-streaming OpenAI answer as a `GenerationResult`; UpstreamProtocolError when
    its shape is wrong."""
    body = Reply(worker, raw)
    choices, reason = read_choices(body, chat)
    first = choices[0].data  # read_choices checked its message or text
    message = first["message"] if chat else None
    text = (message.get("content") if message is not None else first.get("text")) or ""
    return GenerationResult(
        text=text, finish_reason=reason or "stop",
        usage=usage_from_body(body) or Usage(), spec=spec_of(body) or SpecStats(),
        message=message, choices=[c.data for c in choices])


def deltas_from_chunk(chunk: Reply, chat: bool) -> list[Delta]:
    """One stream chunk's deltas (those with something in them)."""
    out = []
    for choice in chunk.objects("choices"):
        index, reason, logprobs = choice.index(), choice.finish_reason(), choice.logprobs()
        if chat:
            delta = choice.obj("delta")
            extra = dict(delta.data) if delta is not None else {}
            text = (delta.text("content") if delta is not None else None) or ""
            extra.pop("content", None)
        else:
            extra, text = {}, choice.text("text") or ""
        if text or extra or reason or logprobs:
            out.append(Delta(text=text, extra=extra, finish_reason=reason, index=index,
                             logprobs=logprobs))
    return out


def payload(request: GenerationRequest, pool: PoolConfig, k: int, stream: bool,
            extra: dict) -> dict:
    """The body a worker gets: the client's, forwarded (`gateway.forwarding`), with
    `extra` merged in, `model` the pool's served name, `max_tokens` the one decided, usage
    asked for on a stream, and the gateway's `custom_params` (`worker_params`)."""
    body = {**forwarded(request.body, request.endpoint, pool.engine), **extra,
            "model": pool.model, "stream": stream}
    if request.max_tokens is not None:  # the tenant's cap or the budget, as decided
        body["max_tokens"] = request.max_tokens
        if "max_completion_tokens" in body:
            body["max_completion_tokens"] = request.max_tokens
    if stream:
        body["stream_options"] = {"include_usage": True}
    else:
        body.pop("stream_options", None)
    params = worker_params(body.pop("custom_params", None), pool, k)
    if params is not None:
        body["custom_params"] = params
    return body
