"""Rendering engine-neutral results as OpenAI response bodies and SSE chunks.

Every response carries a `specroute` object (pool, method, k, verify_steps,
accept_length, reason): on the body when not streaming, on the last chunk before
`data: [DONE]` when streaming (the usage chunk if `stream_options.include_usage`,
else the chunk carrying `finish_reason`).
"""

from __future__ import annotations

import functools
import itertools
import os
import time

import orjson

from gateway.schemas import GenerationRequest
from gateway.telemetry.worker_stats import SpecStats, Usage
from gateway.upstream.adapters.base import Delta, Final, GenerationResult
from policies.types import Decision

DONE = b"data: [DONE]\n\n"


class _Ids:
    """Response ids: 32 hex digits, a random per-process half and a counter. `uuid4`
    asks the kernel for 16 random bytes and builds a UUID object on every call (a
    syscall and an object per request, visible in the profile); an id only has to be
    unique. A forked child draws its own half."""

    def __init__(self) -> None:
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        self.prefix, self.counter = os.urandom(8).hex(), itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.counter):016x}"


response_id = _Ids()


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
    free-text reason character by character would run on every request."""
    return list(_decision_headers(decision.pool, decision.method, decision.k,
                                  decision.reason))


def _choice(chat: bool, index: int, text: str, message: dict | None, finish: str,
            logprobs: object) -> dict:
    if not chat:
        return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}
    message = dict(message or {})
    message["role"] = "assistant"
    message.setdefault("content", text)
    return {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}


def _choices(request: GenerationRequest, result: GenerationResult) -> list[dict]:
    """The worker's choices (n > 1, logprobs) when it sent OpenAI ones, else the one
    choice the adapter read."""
    chat = request.endpoint == "chat"
    if not result.choices:
        return [_choice(chat, 0, result.text, result.message, result.finish_reason, None)]
    out = []
    for i, c in enumerate(result.choices):
        message = c.get("message") if isinstance(c.get("message"), dict) else None
        text = (message or {}).get("content") or "" if chat else c.get("text") or ""
        out.append(_choice(chat, c.get("index", i), text, message,
                           c.get("finish_reason") or "stop", c.get("logprobs")))
    return out


def response_body(request: GenerationRequest, result: GenerationResult,
                  decision: Decision) -> bytes:
    prefix, kind = ("chatcmpl-", "chat.completion") if request.endpoint == "chat" \
        else ("cmpl-", "text_completion")
    return orjson.dumps({
        "id": prefix + response_id(), "object": kind, "created": int(time.time()),
        "model": request.model, "choices": _choices(request, result),
        "usage": usage_dict(result.usage),
        "specroute": spec_facts(decision, result.spec, result.usage),
    })


class ChunkWriter:
    """Turns a stream of `Delta`/`Final` into OpenAI SSE bytes for one request."""

    def __init__(self, request: GenerationRequest, decision: Decision) -> None:
        self.request = request
        self.decision = decision
        self.chat = request.endpoint == "chat"
        self.base = {"id": ("chatcmpl-" if self.chat else "cmpl-") + response_id(),
                     "object": "chat.completion.chunk" if self.chat else "text_completion",
                     "created": int(time.time()), "model": request.model}
        self.role_sent: set[int] = set()
        self.finish: dict[int, str] = {}  # choices other than 0 that finished (n > 1)

    def _event(self, body: dict) -> bytes:
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def _choice(self, text: str, extra: dict, finish: str | None, index: int = 0,
                logprobs: dict | None = None) -> dict:
        if not self.chat:
            return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}
        delta = dict(extra)
        if index not in self.role_sent:
            delta["role"] = "assistant"
            self.role_sent.add(index)
        else:
            delta.pop("role", None)
        if text:
            delta["content"] = text
        return {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}

    def delta(self, item: Delta) -> bytes:
        """A content chunk, or b"" for a delta with nothing to show (the last step of a
        sample often has no text). An upstream finish_reason is held back for `final`:
        every sample's, even when its delta is empty, or `final` would drop it (n > 1)."""
        if item.index and item.finish_reason:
            self.finish[item.index] = item.finish_reason
        if not (item.text or item.extra or item.logprobs):
            return b""
        return self._event({**self.base, "choices": [self._choice(
            item.text, item.extra, None, item.index, item.logprobs)]})

    def final(self, item: Final) -> bytes:
        facts = spec_facts(self.decision, item.spec, item.usage)
        others = [self._choice("", {}, reason, index)
                  for index, reason in sorted(self.finish.items())]
        finish = {**self.base, "choices": [
            self._choice("", {}, item.finish_reason or "stop"), *others]}
        if not self.request.include_usage:
            return self._event({**finish, "specroute": facts}) + DONE
        usage: dict = {**self.base, "choices": [], "usage": usage_dict(item.usage),
                 "specroute": facts}
        return self._event(finish) + self._event(usage) + DONE

    def error(self, body: dict) -> bytes:
        """An error after the stream started: OpenAI clients raise on an `error` event."""
        return self._event(body) + DONE

    def cut(self, limit: str) -> bytes:
        """The gateway ends the stream at a limit (its deadline): `finish_reason:
        "length"`, as a max_tokens cut, which OpenAI clients take as a normal end (an
        `error` event would make them raise `APIError` with the text already shown),
        `specroute.cut` naming the limit; no usage chunk: the worker never sent its count."""
        facts = {**spec_facts(self.decision, SpecStats(), Usage()), "cut": limit}
        others = [self._choice("", {}, self.finish.get(index, "length"), index)
                  for index in sorted(self.role_sent | set(self.finish)) if index]
        return self._event({**self.base, "specroute": facts, "choices": [
            self._choice("", {}, "length"), *others]}) + DONE
