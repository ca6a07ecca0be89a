"""What every engine adapter returns, whatever the worker speaks.

An adapter turns a validated `GenerationRequest` into one worker call and answers in
engine-neutral values: a `GenerationResult` (non-streaming), or a stream of `Delta`s closed
by exactly one `Final`. The gateway renders these into OpenAI responses itself, so
every pool's answers look the same to the client and carry the same speculation facts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from gateway.config import PoolConfig
from gateway.schemas import GenerationRequest


@dataclass(slots=True)
class SpecStats:
    """Per-request speculation outcome as the worker reported it.

    accept_length: tokens emitted per verify step, bonus token included (SGLang
    `spec_accept_length`, vLLM `mean_acceptance_length`); 0.0 = not reported.
    batch, batch_draft_tokens: the embedded worker's `specroute_batch` (plain requests
    too): mean requests in the worker's batch over this request's decode steps, and mean
    draft tokens verified per step across that batch; None = not reported.
    decode_s: its seconds from the first token to the end, in the worker (`specroute_batch`
    too); None = not reported.
    """

    verify_steps: int = 0
    accept_length: float = 0.0
    accept_rate: float | None = None
    correct_drafts: int = 0
    proposed_drafts: int = 0
    batch: float | None = None
    batch_draft_tokens: float | None = None
    decode_s: float | None = None

    @property
    def has_counters(self) -> bool:
        """Whether any speculation counter was reported (the batch fields aside)."""
        return bool(self.verify_steps or self.accept_length or self.accept_rate is not None
                    or self.correct_drafts or self.proposed_drafts)


BATCH_KEY = "specroute_batch"


def non_negative(value: object) -> float | None:
    """A non-negative finite number as float; anything else (a worker's odd body) None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if 0.0 <= number < float("inf") else None


def read_batch(spec: SpecStats, holder: object) -> SpecStats:
    """`spec` with the batch fields of `holder[BATCH_KEY]` (meta_info or sglext) when it
    has them; values that are not non-negative numbers are ignored (None)."""
    batch = holder.get(BATCH_KEY) if isinstance(holder, dict) else None
    if isinstance(batch, dict):
        spec.batch = non_negative(batch.get("requests"))
        spec.batch_draft_tokens = non_negative(batch.get("draft_tokens"))
        spec.decode_s = non_negative(batch.get("decode_s"))
    return spec


def merge_spec(new: SpecStats | None, old: SpecStats) -> SpecStats:
    """A stream's stats after a chunk that said `new`: counters from the chunk that has
    them, batch fields from the chunk that has them, so that a chunk carrying only one
    kind does not wipe the other."""
    if new is None:
        return old
    merged = new if new.has_counters else SpecStats(
        old.verify_steps, old.accept_length, old.accept_rate, old.correct_drafts,
        old.proposed_drafts)
    merged.batch = new.batch if new.batch is not None else old.batch
    merged.batch_draft_tokens = new.batch_draft_tokens \
        if new.batch_draft_tokens is not None else old.batch_draft_tokens
    merged.decode_s = new.decode_s if new.decode_s is not None else old.decode_s
    return merged


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class GenerationResult:
    """A whole non-streaming answer, finished when the adapter returns it."""

    text: str
    finish_reason: str
    usage: Usage
    spec: SpecStats
    message: dict | None = None  # chat: the worker's message (tool_calls, ...) when given
    choices: list[dict] = field(default_factory=list)  # the worker's OpenAI choices, if any
    native: dict | None = None  # the worker's /generate body, for a native request


@dataclass(slots=True)
class Delta:
    text: str = ""
    extra: dict = field(default_factory=dict)  # other chat delta fields: role, tool_calls
    finish_reason: str | None = None
    index: int = 0  # the choice (n > 1)
    logprobs: dict | None = None  # this chunk's OpenAI logprobs object, when asked for
    native: dict | None = None  # the worker's /generate chunk, for a native request


@dataclass(slots=True)
class Final:
    usage: Usage
    spec: SpecStats
    finish_reason: str | None = None


StreamItem = Delta | Final


class Adapter(Protocol):
    """One engine's wire protocol; stateless apart from the shared HTTP session."""

    async def generate(self, worker: str, request: GenerationRequest, pool: PoolConfig,
                       k: int) -> GenerationResult: ...

    def stream(self, worker: str, request: GenerationRequest, pool: PoolConfig,
               k: int) -> AsyncIterator[StreamItem]: ...


def finish_reason_of(value: object) -> str:
    """SGLang reports `{"type": "stop"|"length"|"abort", ...}`; OpenAI a plain string."""
    if isinstance(value, dict):
        value = value.get("type")
    if value in ("stop", "length", "tool_calls", "content_filter", "function_call"):
        return str(value)
    return "stop"
