"""What the served response says about the request: usage, speculation, finish reason.

Envoy streams the response body to the picker chunk by chunk (`response_body_mode:
STREAMED`), so the tokens are not held back; this reads them as they pass. An SSE
stream is read event by event (`data:` lines, split across chunks as they may be); a
JSON answer is kept whole up to `MAX_KEPT` bytes and read at its end. The fields are the
ones the gateway's adapters read (`gateway.upstream.adapters`): OpenAI `usage`,
SGLang `sglext.spec_tokens_details`, vLLM `metrics.speculative_decoding`, SGLang's
native `meta_info`. A body that is not what it claims reads as "not reported".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from gateway.errors import UpstreamProtocolError
from gateway.telemetry.worker_stats import SpecStats, Usage, merge_spec
from gateway.upstream.adapters.base import finish_reason_of
from gateway.upstream.adapters.openai_body import spec_of, usage_from_body
from gateway.upstream.adapters.reply import Reply, usage_of
from gateway.upstream.adapters.sglang import spec_from_meta

MAX_KEPT = 16 * 1024 * 1024  # a whole JSON answer; beyond it the record has no usage
MAX_LINE = 1024 * 1024  # an SSE line not ended within this is dropped


@dataclass(slots=True)
class ResponseReader:
    streaming: bool = False  # text/event-stream
    usage: Usage = field(default_factory=Usage)
    spec: SpecStats = field(default_factory=SpecStats)
    finish_reason: str | None = None
    tokens_seen: bool = False  # some generated text has passed (the stream's first token)
    done: bool = False  # the stream's [DONE], or a JSON answer read whole
    _kept: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        if len(self._kept) + len(chunk) <= MAX_KEPT:
            self._kept += chunk
        if not self.streaming:
            return
        lines = self._kept.split(b"\n")
        self._kept = bytearray(lines.pop() if len(lines[-1]) <= MAX_LINE else b"")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                self._event(line[5:].strip())

    def finish(self) -> None:
        """The body ended: read a whole JSON answer (or a last unterminated event)."""
        if self.streaming:
            if self._kept.strip().startswith(b"data:"):
                self._event(self._kept.strip()[5:].strip())
            return
        body = self._load(bytes(self._kept))
        if body is not None:
            self._read(body)
            self.done = True

    @staticmethod
    def _load(raw: bytes | bytearray) -> dict | None:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        return body if isinstance(body, dict) else None

    def _event(self, data: bytes | bytearray) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        body = self._load(data)
        if body is not None:
            self._read(body)

    def _read(self, body: dict) -> None:
        try:
            self._read_fields(body)
        except UpstreamProtocolError:
            return  # a body that is not what it claims reads as "not reported"

    def _read_fields(self, body: dict) -> None:
        meta = body.get("meta_info")
        if isinstance(meta, dict):  # SGLang /generate (counts are running totals)
            self.usage = usage_of(Reply("worker", meta, "meta_info"))
            self.spec = spec_from_meta(meta)
            if meta.get("finish_reason"):
                self.finish_reason = finish_reason_of(meta["finish_reason"])
            self.tokens_seen = self.tokens_seen or bool(body.get("text"))
            return
        reply = Reply("worker", body)
        self.usage = usage_from_body(reply) or self.usage
        self.spec = merge_spec(spec_of(reply), self.spec)
        for choice in body.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) == 0 and choice.get("finish_reason"):
                self.finish_reason = finish_reason_of(choice["finish_reason"])
            delta = choice.get("delta") or choice.get("message") or {}
            if choice.get("text") or (isinstance(delta, dict) and delta.get("content")):
                self.tokens_seen = True
