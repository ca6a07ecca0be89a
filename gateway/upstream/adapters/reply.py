"""A worker's reply, read field by field at the adapter boundary.

A worker may answer a 200 of well-formed JSON in the wrong shape: a string for a counter,
a list where an object belongs, no choices, a choice that is a number. Every field the
gateway uses is read through `Reply`, which returns it typed or raises
`UpstreamProtocolError` naming the worker and the field's path; nothing above the adapters
ever sees a `TypeError` from a worker's body. The dispatcher counts that error against
the worker's breaker and retries another worker before the first token, as for a 5xx
(`gateway.upstream.dispatch`).

What is checked strictly: what the client's answer is made of (choices, text, messages,
finish reasons) and the counters the policy learns from (usage, the speculation
counters): a wrong value there would be served or learned. What stays lenient: the
embedded worker's optional `specroute_batch` and SGLang's latencies, where an odd value
reads as "not reported" (`gateway.telemetry.worker_stats.non_negative`).
"""

from __future__ import annotations

import math

from gateway.errors import UpstreamProtocolError
from gateway.telemetry.worker_stats import SpecStats, Usage, non_negative
from gateway.upstream.adapters.base import finish_reason_of


def kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


class Reply:
    """One JSON object of a worker's reply; `where` is its path, for the error."""

    __slots__ = ("worker", "data", "parent", "key")

    def __init__(self, worker: str, data: object, where: str = "body",
                 parent: Reply | None = None) -> None:
        """`where` names a top-level object; a nested one keeps its parent and its key
        there instead (`where`: `key` or `key[i]`), and its path is only spelled out for
        an error: a well-formed reply builds no path strings."""
        if not isinstance(data, dict):
            path = where if parent is None else f"{parent.where}.{where}"
            raise UpstreamProtocolError(worker, f"{path} is {kind(data)}, not an object")
        self.worker, self.data, self.parent, self.key = worker, data, parent, where

    @property
    def where(self) -> str:
        """The object's path in the reply, as errors name it (`body.choices[0].message`)."""
        if self.parent is None:
            return self.key
        return f"{self.parent.where}.{self.key}"

    def bad(self, key: str, wanted: str) -> UpstreamProtocolError:
        value = self.data.get(key)
        return UpstreamProtocolError(self.worker, f"{self.where}.{key} is {kind(value)}, "
                                                  f"not {wanted}")

    def get(self, key: str) -> object:
        return self.data.get(key)

    def obj(self, key: str) -> Reply | None:
        """The object at `key`; None when absent or null."""
        value = self.data.get(key)
        return None if value is None else Reply(self.worker, value, key, self)

    def objects(self, key: str) -> list[Reply]:
        """The list of objects at `key`; [] when absent or null."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.bad(key, "a list")
        return [Reply(self.worker, item, f"{key}[{i}]", self) for i, item in enumerate(value)]

    def text(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is None or isinstance(value, str):
            return value
        raise self.bad(key, "a string")

    def count(self, key: str) -> int:
        """A token or step count: a non-negative whole number; 0 when absent or null."""
        value = self.data.get(key)
        if type(value) is int and value >= 0:  # the usual case first
            return value
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 \
                or (isinstance(value, float) and not value.is_integer()):
            raise self.bad(key, "a non-negative whole number")
        return int(value)

    def number(self, key: str) -> float | None:
        """A non-negative finite number; None when absent or null."""
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 \
                or not math.isfinite(value):
            raise self.bad(key, "a non-negative number")
        return float(value)

    def integers(self, key: str) -> list[int] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.bad(key, "a list of token ids")
        return value

    def index(self) -> int:
        value = self.data.get("index", 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.bad("index", "a choice index")
        return value

    def finish_reason(self, key: str = "finish_reason") -> str | None:
        """OpenAI's string or SGLang's `{"type": ...}`; None while not finished."""
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, dict):
            value = Reply(self.worker, value, f"{self.where}.{key}").text("type")
            if value is None:
                return None
        elif not isinstance(value, str):
            raise self.bad(key, "a string or an object")
        return finish_reason_of(value)

    def logprobs(self) -> dict | None:
        value = self.data.get("logprobs")
        if value is None or isinstance(value, dict):
            return value
        raise self.bad("logprobs", "an object")


def spec_counters(counters: Reply) -> SpecStats:
    """SGLang's speculation counters (`meta_info` or `sglext.spec_tokens_details`)."""
    return SpecStats(verify_steps=counters.count("spec_verify_ct"),
                     accept_length=counters.number("spec_accept_length") or 0.0,
                     accept_rate=counters.number("spec_accept_rate"),
                     correct_drafts=counters.count("spec_num_correct_drafts"),
                     proposed_drafts=counters.count("spec_num_proposed_drafts"),
                     accept_histogram=accept_histogram(
                         counters.get("spec_correct_drafts_histogram")))


def accept_histogram(value: object) -> tuple[int, ...] | None:
    """SGLang's per-request `spec_correct_drafts_histogram` (index: draft tokens a verify
    step accepted, value: steps; sglang `managers/io_struct.py` `BatchStrOutput`), read
    leniently like the batch fields: anything but a non-empty list of whole non-negative
    numbers reads as not reported."""
    if not isinstance(value, list) or not value:
        return None
    counts = [non_negative(v) for v in value]
    if any(c is None or not c.is_integer() for c in counts):
        return None
    return tuple(int(c) for c in counts if c is not None)


def usage_of(usage: Reply) -> Usage:
    return Usage(prompt_tokens=usage.count("prompt_tokens"),
                 completion_tokens=usage.count("completion_tokens"))


def no_finish(worker: str) -> UpstreamProtocolError:
    """A stream that ended (`[DONE]` or the connection's end) without a finish reason."""
    return UpstreamProtocolError(worker, "the stream ended without a finish_reason")
