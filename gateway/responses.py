"""Rendering engine-neutral results as OpenAI response bodies and SSE chunks.

Every response carries a `specroute` object (pool, method, k, verify_steps,
accept_length, reason): on the body when not streaming, on the last chunk before
`data: [DONE]` when streaming (the usage chunk if `stream_options.include_usage`,
else the chunk carrying `finish_reason`).
"""

from __future__ import annotations

import functools
import time
import uuid

import orjson

from gateway.adapters.base import Delta, Final, GenerationResult, SpecStats, Usage
from gateway.schemas import GenerationRequest
from policies.types import Decision

DONE = b"data: [DONE]\n\n"


def spec_facts(decision: Decision, spec: SpecStats, usage: Usage) -> dict:
    """The `specroute` object. Plain decoding is one token per step by definition."""
    verify_steps, accept_length = spec.verify_steps, spec.accept_length
    if not verify_steps and decision.k == 0:
        verify_steps, accept_length = usage.completion_tokens, 1.0
    return {"pool": decision.pool, "method": decision.method, "k": decision.k,
            "verify_steps": verify_steps or None,
            "accept_length": round(accept_length, 4) if accept_length else None,
            "reason": decision.reason}


def usage_dict(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


def header_value(text: str) -> bytes:
    """Printable ASCII only: a policy's free-text reason must not break the header."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:256].encode()


@functools.lru_cache(maxsize=1024)  # distinct decisions are few: pools x k x reasons
def _decision_headers(pool: str, method: str, k: int,
                      reason: str) -> tuple[tuple[bytes, bytes], ...]:
    return ((b"x-specroute-pool", header_value(pool)),
            (b"x-specroute-method", header_value(method)),
            (b"x-specroute-k", str(k).encode()),
            (b"x-specroute-reason", header_value(reason)))


def headers_for(decision: Decision) -> list[tuple[bytes, bytes]]:
    """The x-specroute-* response headers; cached per decision because sanitising the
    free-text reason character by character costs ~8 us a request."""
    return list(_decision_headers(decision.pool, decision.method, decision.k,
                                  decision.reason))


def response_body(request: GenerationRequest, result: GenerationResult,
                  decision: Decision) -> bytes:
    if request.endpoint == "chat":
        message = dict(result.message or {})
        message["role"] = "assistant"
        message.setdefault("content", result.text)
        choice = {"index": 0, "message": message, "finish_reason": result.finish_reason,
                  "logprobs": None}
        prefix, kind = "chatcmpl-", "chat.completion"
    else:
        choice = {"index": 0, "text": result.text, "finish_reason": result.finish_reason,
                  "logprobs": None}
        prefix, kind = "cmpl-", "text_completion"
    return orjson.dumps({
        "id": prefix + uuid.uuid4().hex, "object": kind, "created": int(time.time()),
        "model": request.model, "choices": [choice], "usage": usage_dict(result.usage),
        "specroute": spec_facts(decision, result.spec, result.usage),
    })


class ChunkWriter:
    """Turns a stream of `Delta`/`Final` into OpenAI SSE bytes for one request."""

    def __init__(self, request: GenerationRequest, decision: Decision) -> None:
        self.request = request
        self.decision = decision
        self.chat = request.endpoint == "chat"
        self.base = {"id": ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex,
                     "object": "chat.completion.chunk" if self.chat else "text_completion",
                     "created": int(time.time()), "model": request.model}
        self.role_sent = False
        self.finish_sent = False

    def _event(self, body: dict) -> bytes:
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def _choice(self, text: str, extra: dict, finish: str | None) -> dict:
        if not self.chat:
            return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        delta = dict(extra)
        if not self.role_sent:
            delta["role"] = "assistant"
            self.role_sent = True
        else:
            delta.pop("role", None)
        if text:
            delta["content"] = text
        return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}

    def delta(self, item: Delta) -> bytes:
        """A content chunk; an upstream finish_reason is held back for `final`."""
        return self._event({**self.base, "choices": [self._choice(item.text, item.extra,
                                                                  None)]})

    def final(self, item: Final) -> bytes:
        facts = spec_facts(self.decision, item.spec, item.usage)
        finish = {**self.base, "choices": [self._choice("", {}, item.finish_reason or "stop")]}
        if not self.request.include_usage:
            return self._event({**finish, "specroute": facts}) + DONE
        usage: dict = {**self.base, "choices": [], "usage": usage_dict(item.usage),
                 "specroute": facts}
        return self._event(finish) + self._event(usage) + DONE

    def error(self, body: dict) -> bytes:
        """An error after the stream started: OpenAI clients raise on an `error` event."""
        return self._event(body) + DONE
